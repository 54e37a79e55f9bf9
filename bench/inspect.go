package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	_ "github.com/oncommit/oncommit/dialect/postgres" // fills in pgsql
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/outbox"
)

// inspectBench times the operators' listing (issue 17, acceptance 4): a
// table of 1,000,000 rows (990,000 delivered, 9,500 pending, 500 dead,
// spread over 10 topics) and a page of 50 dead messages through
// outbox.List, the dashboard's and the CLI's call: medians of 50 runs, then
// the plan under EXPLAIN (ANALYZE, BUFFERS).
//
//	cd bench && go run . -only inspect
func inspectBench(ctx context.Context, pool *pgxpool.Pool) {
	fmt.Println("\n== inspect: a page of 50 dead messages out of 1,000,000 rows (outbox.List)")
	ob := table(ctx, pool, "inspect")
	tbl := pgsql.QuoteTable(ob.Table())
	start := time.Now()
	mustExec(ctx, pool, `INSERT INTO `+tbl+` (id, topic, state, available_at, settled_at, last_error)
		SELECT gen_random_uuid(), 't' || (g % 10),
		       CASE WHEN g % 2000 = 0 THEN 'dead' WHEN g % 100 = 0 THEN 'pending' ELSE 'delivered' END,
		       now() - make_interval(secs => g), CASE WHEN g % 100 <> 0 OR g % 2000 = 0 THEN now() - make_interval(secs => g) END,
		       CASE WHEN g % 2000 = 0 THEN 'smtp: connection refused' END
		FROM generate_series(1, 1000000) g`)
	mustExec(ctx, pool, `VACUUM ANALYZE `+tbl)
	fmt.Printf("filled in %v\n", time.Since(start).Round(time.Millisecond))
	db := pgxtx.FromPool(pool)
	for _, c := range []struct {
		name string
		f    outbox.Filter
	}{
		{"dead", outbox.Filter{States: []outbox.State{outbox.StateDead}}},
		{"dead of topic t0 with error text", outbox.Filter{States: []outbox.State{outbox.StateDead}, Topic: "t0", ErrorContains: "refused"}},
		{"pending of topic t0", outbox.Filter{States: []outbox.State{outbox.StatePending}, Topic: "t0"}},
	} {
		var ms []float64
		var got int
		for range 50 {
			t0 := time.Now()
			p, err := ob.List(ctx, db, c.f, 50)
			check(err)
			ms = append(ms, float64(time.Since(t0).Microseconds())/1000)
			got = len(p.Messages)
		}
		slices.Sort(ms)
		fmt.Printf("%-34s %2d messages: %6.2f ms median, %6.2f ms max of 50\n", c.name, got, ms[len(ms)/2], ms[len(ms)-1])
	}
	q, args := pgsql.ListSQL(ob.Table(), outbox.Filter{States: []outbox.State{outbox.StateDead}}, 51, false)
	rows, err := pool.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) `+q, args...)
	check(err)
	var plan []string
	for rows.Next() {
		var line string
		check(rows.Scan(&line))
		plan = append(plan, line)
	}
	check(rows.Err())
	fmt.Println("plan of the dead page:\n  " + strings.Join(plan, "\n  "))
	mustExec(ctx, pool, `DROP TABLE `+tbl)
}
