package main

// -only cost: what one published and one delivered message costs the
// server, per system: round trips and statements (counted by a pgx tracer on
// the system's pools), WAL bytes (pg_current_wal_lsn deltas) and
// transaction ids (deltas of the next xid), divided by the messages.

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
)

type costSample struct{ roundTrips, statements, walBytes, xids float64 }

func cost(ctx context.Context, admin *pgxpool.Pool) {
	printEnvironment(ctx, admin)
	set := newSystems(ctx, admin)

	const drainN, single, batches = 20_000, 1000, 100
	fmt.Printf("\n== cost per message: publish %d transactions of 1 and %d of 100 (1 producer); drain %d messages (1 consumer, river-best and gue-best settings); %d rounds, medians\n",
		single, batches, drainN, *rounds)
	fmt.Println("WAL and xids are the whole server's: run it on a quiet server (other sessions now:", otherSessions(ctx, admin), ")")
	type key struct{ op, system string }
	samples := map[key][]costSample{}
	var order []key
	measure := func(op string, s *system, msgs int, run func(mark func())) {
		var rt0, st0, wal0, xid0 int64
		run(func() { rt0, st0, wal0, xid0 = costCounters(ctx, admin) })
		rt1, st1, wal1, xid1 := costCounters(ctx, admin)
		k := key{op, s.name}
		if _, ok := samples[k]; !ok {
			order = append(order, k)
		}
		m := float64(msgs)
		samples[k] = append(samples[k], costSample{float64(rt1-rt0) / m, float64(st1-st0) / m, float64(wal1-wal0) / m, float64(xid1-xid0) / m})
	}
	for round := 1; round <= *rounds; round++ {
		for _, s := range []*system{set.raw, set.onc, set.oncOff, set.rivBest, set.guBest} {
			if s == nil {
				continue
			}
			measure("publish 1/tx", s, single, func(mark func()) { publishRun(ctx, s, 1, single, 1, mark) })
			measure("publish 100/tx", s, batches*100, func(mark func()) { publishRun(ctx, s, 1, batches, 100, mark) })
			if s != set.oncOff {
				measure("deliver", s, drainN, func(mark func()) { drainRun(ctx, s, 1, drainN, mark) })
			}
		}
	}
	fmt.Printf("%-15s %-20s %12s %12s %12s %10s\n", "operation", "system", "round trips", "statements", "WAL bytes", "xids")
	for _, k := range order {
		ss := samples[k]
		med := func(f func(costSample) float64) float64 {
			var xs []float64
			for _, s := range ss {
				xs = append(xs, f(s))
			}
			return median(xs)
		}
		fmt.Printf("%-15s %-20s %12.3f %12.3f %12.0f %10.3f\n", k.op, k.system,
			med(func(c costSample) float64 { return c.roundTrips }), med(func(c costSample) float64 { return c.statements }),
			med(func(c costSample) float64 { return c.walBytes }), med(func(c costSample) float64 { return c.xids }))
	}
}

// costCounters reads the tracer's counts, the server's WAL position in
// bytes and its next transaction id (reading it assigns none).
func costCounters(ctx context.Context, admin *pgxpool.Pool) (roundTrips, statements, wal, xid int64) {
	roundTrips, statements = wire.snapshot()
	check(admin.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&wal, &xid))
	return
}

func otherSessions(ctx context.Context, admin *pgxpool.Pool) string {
	var names []string
	rows, err := admin.Query(ctx, `SELECT coalesce(application_name, '') || ' ' || coalesce(datname, '') FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' AND state <> 'idle'`)
	check(err)
	for rows.Next() {
		var s string
		check(rows.Scan(&s))
		names = append(names, s)
	}
	check(rows.Err())
	return fmt.Sprintf("%d active", len(slices.Compact(names)))
}
