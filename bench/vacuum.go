package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/oncommit/oncommit/dialect/postgres" // fills in pgsql
	"github.com/oncommit/oncommit/internal/pgsql"
)

// vacuumBench shows what the churn of a drain leaves for the next claims:
// 100,000 messages are published and drained (each one inserted, updated
// at claim and deleted), then 10,000 are published, and the claim
// statement is run under EXPLAIN (ANALYZE, BUFFERS) in rolled-back
// transactions, before and after VACUUM of the table: execution time and
// buffers touched per claim of 100, medians of 25 runs.
//
//	cd bench && go run . -only vacuum
func vacuumBench(ctx context.Context, pool *pgxpool.Pool) {
	fmt.Println("\n== vacuum: claim cost after a drain of 100,000 messages, before and after VACUUM (autovacuum is off on this server)")
	ob := table(ctx, pool, "vacuum")
	tbl := pgsql.QuoteTable(ob.Table())
	measure := func(label string) {
		var ms, bufs []float64
		for range 25 {
			tx, err := pool.Begin(ctx)
			check(err)
			var plan []byte
			check(tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+pgsql.ClaimSQL(ob.Table(), 1),
				"bench", 100, 30.0, 25, 0.0).Scan(&plan))
			check(tx.Rollback(ctx))
			var out []struct {
				Plan          map[string]any `json:"Plan"`
				ExecutionTime float64        `json:"Execution Time"`
			}
			check(json.Unmarshal(plan, &out))
			ms = append(ms, out[0].ExecutionTime)
			hit, _ := out[0].Plan["Shared Hit Blocks"].(float64)
			read, _ := out[0].Plan["Shared Read Blocks"].(float64)
			bufs = append(bufs, hit+read)
		}
		slices.Sort(ms)
		slices.Sort(bufs)
		fmt.Printf("%-34s claim of 100: %6.2f ms, %6.0f buffers (medians of 25; min-max %.2f-%.2f ms)\n", label, ms[len(ms)/2], bufs[len(bufs)/2], ms[0], ms[len(ms)-1])
	}
	fill(ctx, pool, ob, 10_000, "bench")
	measure("fresh table, 10,000 due")
	mustExec(ctx, pool, `TRUNCATE `+tbl)
	fill(ctx, pool, ob, 100_000, "bench")
	relays(ctx, ob, 1, 100_000)()
	fill(ctx, pool, ob, 10_000, "bench")
	measure("after a 100,000 drain, 10,000 due")
	mustExec(ctx, pool, `VACUUM `+tbl)
	measure("after VACUUM")
	var n int
	check(pool.QueryRow(ctx, `SELECT count(*) FROM `+tbl).Scan(&n))
	if n != 10_000 {
		check(fmt.Errorf("vacuum bench: %d rows left, want 10000", n))
	}
}
