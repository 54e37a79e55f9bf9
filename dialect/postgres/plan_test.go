package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outboxdriver"
)

// TestClaimGenericPlan drains a backlog three times through the dialect's claims
// (each claim settling the previous one's messages, as a relay does) on
// one connection, and reads pg_prepared_statements: the claim-and-delete
// statement the drain runs has the limit in its text and is run from a
// generic plan, not planned anew on every claim (see literalClaims). With
// LIMIT $2 (maxLiteralLimits 0) the second and third drains of 50,000 were
// planned on each of their 500 claims: a custom plan each time, the
// generic plan's LIMIT being guessed at 10% of the table.
func TestClaimGenericPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	table, tb := migratedTable(t)
	admin := pgtest.Admin(t)
	d := Dialect().(*dialect)
	for round := 1; round <= 3; round++ {
		if _, err := admin.Exec(`INSERT INTO ` + table + ` (id, topic, payload) SELECT gen_random_uuid(), 'bench', '{"n": 1}' FROM generate_series(1, 50000)`); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(`VACUUM ANALYZE ` + table); err != nil {
			t.Fatal(err)
		}
		cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1 // every claim on the connection whose statements are read below
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := pgxtx.FromPool(pool)
		var done []outboxdriver.Fence
		claims, n := 0, 0
		for {
			claimed, _, err := d.Claim(ctx, db, tb, outboxdriver.ClaimParams{Topics: []string{"bench"}, Limit: 100,
				Lease: 30 * time.Second, MaxAttempts: 25, Done: done})
			if err != nil {
				t.Fatal(err)
			}
			claims++
			if len(claimed) == 0 {
				break
			}
			if len(claimed) > 100 {
				t.Fatalf("a claim of 100 took %d rows", len(claimed))
			}
			n += len(claimed)
			done = done[:0]
			for _, c := range claimed {
				done = append(done, outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts})
			}
		}
		if n != 50000 {
			t.Fatalf("round %d: drained %d messages of 50000", round, n)
		}
		rows, err := pool.Query(ctx, `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE 'WITH done AS (DELETE%'`)
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for rows.Next() {
			var stmt string
			var generic, custom int64
			if err := rows.Scan(&stmt, &generic, &custom); err != nil {
				t.Fatal(err)
			}
			found = true
			t.Logf("round %d, %d claims: claim-and-delete statement: %d generic plans, %d custom plans", round, claims, generic, custom)
			if !strings.Contains(stmt, "LIMIT 100\n") {
				t.Errorf("the claim's limit is not in its text:\n%s", stmt)
			}
			// PostgreSQL plans the first five runs, then keeps the generic
			// plan if it is no dearer than their average.
			if custom > 5 {
				t.Errorf("round %d: the claim was planned %d times in %d runs (generic plans: %d)", round, custom, custom+generic, generic)
			}
		}
		rows.Close()
		pool.Close()
		if !found {
			t.Fatal("no claim-and-delete statement among the connection's prepared statements")
		}
	}
}
