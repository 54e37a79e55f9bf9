#!/usr/bin/env bash
# Runs BenchmarkPublish against the local PostgreSQL and prints the median
# ns/op of each sub-benchmark and the ratios docs/benchmarks.md reports.
# Rounds are interleaved (every sub-benchmark once per round), so slow drift
# of the machine (disk flushes, other load) falls on all of them alike.
# Usage: scripts/publish-ratios.sh [count] [benchtime]
set -euo pipefail
cd "$(dirname "$0")/.."
count="${1:-6}"
benchtime="${2:-2000x}"
out="$(mktemp)"
bin="$(mktemp -d)/outbox.test"
go test -c -o "$bin" ./outbox
for _ in $(seq 1 "$count"); do
	(cd outbox && "$bin" -test.run '^$' -test.bench 'Publish$' -test.benchtime "$benchtime") | tee -a "$out" | grep '^Benchmark' >&2
done
awk '
/^BenchmarkPublish\// {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^BenchmarkPublish\//, "", name)
	vals[name] = vals[name] " " $3
}
END {
	for (k in vals) {
		n = split(substr(vals[k], 2), a, " ")
		asort(a)
		med[k] = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		printf "%-28s median %10.0f ns/op  (%d runs)\n", k, med[k], n
	}
	split("stmt tx", fams, " ")
	for (i = 1; i <= 2; i++) {
		f = fams[i]
		printf "%s: publish-notify-off / raw-insert      = %.2fx\n", f, med[f "/publish-notify-off"] / med[f "/raw-insert"]
		printf "%s: publish-notify-on  / raw-insert      = %.2fx\n", f, med[f "/publish-notify-on"] / med[f "/raw-insert"]
		printf "%s: publish-batch-100  / publish (off)   = %.2fx\n", f, med[f "/publish-batch-100"] / med[f "/publish-notify-off"]
		printf "%s: publish-batch-100  / raw-insert-100  = %.2fx\n", f, med[f "/publish-batch-100"] / med[f "/raw-insert-100"]
	}
}' "$out" | sort
rm -f "$out" "$bin"
