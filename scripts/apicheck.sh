#!/usr/bin/env bash
# scripts/apicheck.sh compares the exported API of each published module
# with the module's last release tag, using apidiff (golang.org/x/exp).
#
#   bash scripts/apicheck.sh
#
# Published modules and their tags (RELEASING.md):
#   github.com/oncommit/oncommit                 v0.X.Y
#   github.com/oncommit/oncommit/dialect/sqlite  dialect/sqlite/v0.X.Y
#   github.com/oncommit/oncommit/dialect/mysql   dialect/mysql/v0.X.Y
#   github.com/oncommit/oncommit/otel            otel/v0.X.Y
#   github.com/oncommit/oncommit/forward/nats    forward/nats/v0.X.Y
#   github.com/oncommit/oncommit/forward/rabbitmq forward/rabbitmq/v0.X.Y
# A directory that has no go.mod of its own yet is part of the root module
# and is compared with it.
#
# The new side is the work tree as it is (uncommitted changes included);
# the old side is the tag, extracted with git archive into a temporary
# directory. internal/ packages are not compared.
#
# Exit status: 0 when no module has a tag yet ("no release tag yet; nothing
# to compare"), when every change is compatible, or when the incompatible
# changes are declared: CHANGELOG.md's Unreleased section has a heading
# with "(breaking)" in it, such as "### Changed (breaking)" or
# "### Removed (breaking)". 1 when an incompatible change is not declared,
# or when a step fails.
#
# APIDIFF overrides the pinned apidiff (e.g. APIDIFF=golang.org/x/exp/cmd/apidiff@latest).
set -euo pipefail

APIDIFF=${APIDIFF:-golang.org/x/exp/cmd/apidiff@v0.0.0-20261113113407-e3970619a1a4}
base=github.com/oncommit/oncommit
published=(. dialect/sqlite dialect/mysql otel forward/nats forward/rabbitmq)

top=$(git rev-parse --show-toplevel)
cd "$top"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# unreleased prints CHANGELOG.md's Unreleased section, without its heading.
unreleased() {
	[ -f CHANGELOG.md ] || return 0
	awk '/^## \[?Unreleased\]?/ { on = 1; next } on && /^## / { exit } on' CHANGELOG.md
}

# exportAPI TREE DIR MODULE OUT writes the export data of MODULE, whose
# go.mod is TREE/DIR, to OUT. The root module is loaded without the
# workspace: in it, the pattern github.com/oncommit/oncommit/... would also
# match the nested modules' packages.
exportAPI() {
	local tree=$1 dir=$2 mod=$3 out=$4
	(
		cd "$tree/$dir"
		if [ "$dir" = . ]; then export GOWORK=off; fi
		"$tmp/bin/apidiff" -m -w "$out" "$mod"
	)
}

compared=0 breaking=0 n=0
for dir in "${published[@]}"; do
	n=$((n + 1))
	if [ "$dir" = . ]; then
		mod=$base prefix=
	else
		mod=$base/$dir prefix=$dir/
		if [ ! -f "$dir/go.mod" ]; then
			echo "$mod: not a module of its own yet (its packages are part of $base)"
			continue
		fi
	fi
	tag=$(git -c versionsort.suffix=- tag --list "${prefix}v[0-9]*" --sort=-v:refname | head -n 1)
	if [ -z "$tag" ]; then
		echo "$mod: no release tag yet; nothing to compare"
		continue
	fi

	if [ ! -x "$tmp/bin/apidiff" ]; then
		GOBIN=$tmp/bin go install "$APIDIFF"
	fi
	old=$tmp/old$n
	mkdir -p "$old"
	git archive --format=tar "$tag" | tar -x -C "$old"
	if [ ! -f "$old/$dir/go.mod" ]; then
		echo "$mod: $tag has no $dir/go.mod; nothing to compare"
		continue
	fi
	exportAPI "$old" "$dir" "$mod" "$tmp/old$n.x"
	exportAPI "$top" "$dir" "$mod" "$tmp/new$n.x"

	echo "== $mod: $tag -> work tree"
	"$tmp/bin/apidiff" -m "$tmp/old$n.x" "$tmp/new$n.x" 2> >(grep -v '^Ignoring internal package' >&2) |
		tee "$tmp/report$n"
	"$tmp/bin/apidiff" -m -incompatible "$tmp/old$n.x" "$tmp/new$n.x" 2>/dev/null >"$tmp/incompatible$n"
	compared=$((compared + 1))
	if [ -s "$tmp/incompatible$n" ]; then
		breaking=$((breaking + 1))
	elif [ ! -s "$tmp/report$n" ]; then
		echo "(no exported API change)"
	fi
done

if [ "$compared" -eq 0 ] || [ "$breaking" -eq 0 ]; then
	exit 0
fi
if unreleased | grep -Eq '^###[^#].*\(breaking\)'; then
	echo "apicheck: incompatible changes in $breaking module(s), declared in CHANGELOG.md's Unreleased section"
	exit 0
fi
echo "apicheck: incompatible changes in $breaking module(s) and no \"### Changed (breaking)\" (or other \"(breaking)\") heading in CHANGELOG.md's Unreleased section" >&2
exit 1
