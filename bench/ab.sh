#!/usr/bin/env bash
# ab.sh compares two builds of the bench program (say, of two commits),
# alternating them round by round so both meet the same machine noise,
# and prints each scenario's median for both, with min-max, and the ratio
# new/old (above 1: new is higher).
#
#   git worktree add /tmp/old <commit> && (cd /tmp/old/bench && go build -o /tmp/bench-old .)
#   go build -o /tmp/bench-new . && bash ab.sh /tmp/bench-old /tmp/bench-new 5 \
#     -only compare -systems oncommit -scenarios publish-1,publish-8,drain-1,drain-4,latency
set -euo pipefail
old=$1 new=$2 rounds=$3
shift 3
out=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
	for b in old new; do
		bin=$old
		[ "$b" = new ] && bin=$new
		# Each run is one compare round; keep its summary lines
		# (scenario system median ...).
		"$bin" "$@" -rounds 1 | awk -v b="$b" -v r="$r" '/^== compare summary/ {s=1; next} s && NF >= 3 && $1 != "scenario" {print b, r, $1, $2, $3, $4}' >>"$out/all"
		echo "round $r $b done" >&2
	done
done
awk '
function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
function f(x) { return x >= 1000 ? sprintf("%.0f", x) : sprintf("%.3g", x) }
{ k = $3 " " $4; unit[k] = $6; n[$1, k]++; v[$1, k, n[$1, k]] = $5; keys[k] = 1 }
END {
	printf "%-32s %-30s %-30s %s\n", "scenario system", "old median (min-max)", "new median (min-max)", "new/old"
	for (k in keys) {
		for (b = 0; b < 2; b++) {
			s = b ? "new" : "old"; m = n[s, k]; lo = 1e18; hi = -1e18
			delete a; for (i = 1; i <= m; i++) { a[i] = v[s, k, i] + 0; if (a[i] < lo) lo = a[i]; if (a[i] > hi) hi = a[i] }
			md[s] = m ? med(a, m) : 0; txt[s] = m ? f(md[s]) " " unit[k] " (" f(lo) "-" f(hi) ")" : "-"
		}
		printf "%-32s %-30s %-30s %.2fx\n", k, txt["old"], txt["new"], md["old"] ? md["new"] / md["old"] : 0
	}
}' "$out/all" | sort
rm -rf "$out"
