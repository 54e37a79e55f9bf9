package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/outboxdriver"
)

// stmts drains a table with the relay's claim statement alone (the previous
// batch's successes carried by the next claim), sequentially, beside the
// raw loop: the SQL cost without the relay's goroutines.
func stmts(ctx context.Context, pool *pgxpool.Pool) {
	fmt.Printf("\n== stmt: the claim statements alone, %d messages, sequential (seconds)\n", *n)
	d := postgres.Dialect().(outboxdriver.RelayDialect)
	for round := 1; round <= *rounds; round++ {
		ob := table(ctx, pool, "stmt")
		fill(ctx, pool, ob, *n, "bench")
		t0 := time.Now()
		rawLoop(ctx, pool, ob, 1)
		raw := time.Since(t0)

		ob = table(ctx, pool, "stmt")
		fill(ctx, pool, ob, *n, "bench")
		db := pgxtx.FromPool(pool)
		var done []outboxdriver.Fence
		t0 = time.Now()
		for {
			claimed, _, err := d.Claim(ctx, db, ob.Table(), outboxdriver.ClaimParams{Topics: []string{"bench"}, Limit: 100, Lease: 30 * time.Second, MaxAttempts: 10, Done: done})
			check(err)
			if len(claimed) == 0 {
				break
			}
			done = done[:0]
			for _, c := range claimed {
				done = append(done, outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts})
			}
		}
		_, _, err := d.Claim(ctx, db, ob.Table(), outboxdriver.ClaimParams{Topics: []string{"bench"}, Limit: 100, Lease: 30 * time.Second, MaxAttempts: 10, Done: done})
		check(err)
		ours := time.Since(t0)

		// Our claim without carried settles, then the raw delete by ids.
		ob = table(ctx, pool, "stmt")
		fill(ctx, pool, ob, *n, "bench")
		del := `DELETE FROM ` + pgsql.QuoteTable(ob.Table()) + ` WHERE id = ANY($1)`
		t0 = time.Now()
		for {
			claimed, _, err := d.Claim(ctx, db, ob.Table(), outboxdriver.ClaimParams{Topics: []string{"bench"}, Limit: 100, Lease: 30 * time.Second, MaxAttempts: 10})
			check(err)
			if len(claimed) == 0 {
				break
			}
			ids := make([][16]byte, len(claimed))
			for i, c := range claimed {
				ids[i] = c.ID
			}
			_, err = pool.Exec(ctx, del, ids)
			check(err)
		}
		sep := time.Since(t0)
		fmt.Printf("round %d raw-loop-1 %.2fs, claim-carries-settle %.2fs (%.2fx), our-claim+raw-delete %.2fs (%.2fx)\n",
			round, raw.Seconds(), ours.Seconds(), raw.Seconds()/ours.Seconds(), sep.Seconds(), raw.Seconds()/sep.Seconds())
	}
}
