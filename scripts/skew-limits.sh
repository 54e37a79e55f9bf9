#!/usr/bin/env bash
# Measures the PostgreSQL claim of a rare topic behind a backlog of another:
# 200,000 due rows of topic a, then 50 of topic b; the claim of b by a
# relay of b ("one") and by a relay of b, c and d ("three"), at LIMIT 1, 10
# and 100 (EXPLAIN ANALYZE inside a transaction that is rolled back, so
# every round sees the same table), on the table Migrate creates (claim
# index (topic, available_at, id), migration 0004), then on a table still
# at migration 0003 (claim index (available_at, id)): this release's claims
# before the upgrade's migration ran. Prints each plan's scan node once and
# the medians (min-max) of the execution times.
# Usage: scripts/skew-limits.sh [rounds] (default 7); needs psql and the
# local server (OUTBOX_TEST_POSTGRES_URL or postgres://postgres@127.0.0.1:5432/test).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-7}"
url="${OUTBOX_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
dir="$(mktemp -d)"
cat > "$dir/main.go" <<'GO'
package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
)

func main() {
	t, _ := outbox.ParseTable("skew_limits.outbox")
	switch os.Args[1] {
	case "claim":
		fmt.Println(postgres.ClaimSQL(t, 1))
	case "claim3":
		fmt.Println(postgres.ClaimSQL(t, 3))
	case "migrate":
		db, err := sql.Open("pgx", os.Args[2])
		if err == nil {
			err = postgres.Migrate(context.Background(), db, t.String())
		}
		if err != nil {
			panic(err)
		}
	}
}
GO
run() { go run "$dir/main.go" "$@"; }
psql "$url" -qAt -c 'DROP SCHEMA IF EXISTS skew_limits CASCADE' -c 'CREATE SCHEMA skew_limits'
run migrate "$url"
psql "$url" -qAt <<'SQL'
INSERT INTO skew_limits.outbox (id, topic, available_at) SELECT gen_random_uuid(), 'a', now() - interval '1 hour' + g * interval '1 ms' FROM generate_series(1, 200000) g;
INSERT INTO skew_limits.outbox (id, topic, available_at) SELECT gen_random_uuid(), 'b', now() - interval '1 minute' + g * interval '1 ms' FROM generate_series(1, 50) g;
VACUUM ANALYZE skew_limits.outbox;
SQL
claim="$(run claim)" claim3="$(run claim3)"
explain() { # form limit -> plan text
	local q="$claim" arg="'b'"
	if [ "$1" = three ]; then q="$claim3" arg="'{b,c,d}'"; fi
	psql "$url" -qAt <<SQL
BEGIN;
PREPARE c(text, int, float8, int) AS $q;
EXPLAIN (ANALYZE, FORMAT TEXT) EXECUTE c($arg, $2, 30, 10);
ROLLBACK;
SQL
}
measure() { # label
	for form in one three; do
		for lim in 1 10 100; do
			explain "$form" "$lim" | grep -E 'Scan on outbox |Scan using' | head -1 | sed "s/^ *->  */$1 $form LIMIT $lim plan: /"
		done
	done
	for _ in $(seq "$rounds"); do
		for form in one three; do
			for lim in 1 10 100; do
				echo "$1 $form LIMIT $lim $(explain "$form" "$lim" | awk '/Execution Time/ {print $3}')"
			done
		done
	done | sort -k1,1 -k2,2 -k4,4n -k5,5n | awk '
	{ k = $1 " " $2 " LIMIT " $4; v[k] = v[k] " " $5; n[k]++ }
	END { for (k in v) { split(substr(v[k], 2), a, " "); m = a[int((n[k] + 1) / 2)]; printf "%s: median %.2f ms (%.2f-%.2f), %d rounds\n", k, m, a[1], a[n[k]], n[k] } }' | sort
}
measure defaults
# The schema before migration 0004: the claim index (available_at, id).
psql "$url" -qAt -c 'DROP INDEX skew_limits.outbox_topic_claim_idx' \
	-c "CREATE INDEX outbox_claim_idx ON skew_limits.outbox (available_at, id) WHERE state IN ('pending', 'processing')" \
	-c 'ANALYZE skew_limits.outbox'
measure before-0004
psql "$url" -qAt -c 'DROP SCHEMA skew_limits CASCADE'
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; load: $(cut -d' ' -f1-3 /proc/loadavg)"
