#!/usr/bin/env bash
# Checks that every module of the workspace is tidy on its own (GOWORK=off):
# its go.mod lists what its packages and tests import, and its go.sum holds
# every checksum `go list -m all` and `go build` need, so a user or an
# outside harness working in one module without the go.work sees no
# "missing go.sum entry". Prints each untidy module's diff and fails.
# Usage: scripts/tidycheck.sh
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
for dir in $(go list -m -f '{{.Dir}}'); do
	rel=.
	[ "$dir" = "$PWD" ] || rel=${dir#"$PWD"/}
	if ! out=$(cd "$dir" && GOWORK=off go mod tidy -diff 2>&1); then
		echo "untidy module: $rel (run: cd $rel && GOWORK=off go mod tidy)"
		echo "$out" | grep -v '^go: downloading' || true
		fail=1
	fi
done
if [ "$fail" = 0 ]; then
	echo "every module tidy (GOWORK=off go mod tidy -diff)"
fi
exit "$fail"
