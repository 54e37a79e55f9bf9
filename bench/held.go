package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/outboxdriver"
)

var (
	heldRate   = flag.Int("held-rate", 800, "held: messages a second, one per transaction, from 8 producers")
	heldSteady = flag.Duration("held-steady", time.Minute, "held: the steady phase")
	heldFor    = flag.Duration("held-for", 5*time.Minute, "held: how long the snapshot is held (0: never, a steady soak of -held-steady)")
	heldAfter  = flag.Duration("held-after", 30*time.Second, "held: the phase after its release")
	heldWindow = flag.Duration("held-window", 10*time.Second, "held: the reporting window (and the VACUUM interval)")
)

// heldTarget is what the held-snapshot scenario drives on one database.
type heldTarget struct {
	name string
	// publish commits one message carrying seq in a transaction of its own.
	publish func(ctx context.Context, seq int64)
	// consume starts one relay that calls onMsg for each message and
	// returns what stops it.
	consume func(ctx context.Context, onMsg func(seq int64)) (stop func())
	// hold opens a transaction that keeps the database from removing old
	// row versions (or from resetting its WAL) and returns what ends it.
	hold func(ctx context.Context) (release func())
	// measure runs the window's maintenance, if any, and returns the
	// cleanup pressure (column pressure) and the table's size in kB.
	measure  func(ctx context.Context) (pressure, sizeKB int64)
	pressure string
}

// heldRun is the held-snapshot scenario for PostgreSQL system s (oncommit's
// table or the WAL transport): a REPEATABLE READ transaction that has read
// another table holds the MVCC horizon; the outbox table is VACUUMed every
// window (this server runs with autovacuum off: as an aggressively tuned
// autovacuum would), and the pressure column is its dead tuples.
//
//	cd bench && go run . -only compare -scenarios held -systems oncommit,oncommit-wal \
//	  -url postgres://postgres@127.0.0.1:5433/test?sslmode=disable
func heldRun(ctx context.Context, s *system) {
	s.reset(ctx)
	tbl := pgsql.QuoteTable(tableOf(s.table))
	mustExec(ctx, s.pool, `CREATE TABLE IF NOT EXISTS bench_held_other (n int)`)
	mustExec(ctx, s.pool, `INSERT INTO bench_held_other VALUES (1)`)
	runHeld(ctx, heldTarget{
		name: s.name,
		publish: func(ctx context.Context, seq int64) {
			tx, err := s.pool.Begin(ctx)
			check(err)
			check(s.publish(ctx, tx, 1, seq))
			check(tx.Commit(ctx))
		},
		consume: func(ctx context.Context, onMsg func(int64)) func() {
			start, stop := s.consume(ctx, 1, onMsg)
			start()
			warm(ctx, s.pool)
			return func() { stop(); closePools() }
		},
		hold: func(ctx context.Context) func() {
			held, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			check(err)
			_, err = held.Exec(ctx, `SELECT count(*) FROM bench_held_other`)
			check(err)
			return func() { check(held.Rollback(ctx)) }
		},
		measure: func(ctx context.Context) (dead, size int64) {
			mustExec(ctx, s.pool, `VACUUM `+tbl)
			check(s.pool.QueryRow(ctx, `SELECT coalesce(n_dead_tup, 0), pg_total_relation_size($1::regclass) / 1024 FROM pg_stat_user_tables WHERE relid = $1::regclass`, tbl).Scan(&dead, &size))
			return dead, size
		},
		pressure: "dead tup",
	})
}

// runHeld publishes at a fixed rate, one message per transaction from 8
// producers, to one relay: a steady phase, then t.hold's transaction held
// for -held-for, then released for -held-after (with -held-for 0, a steady
// soak of -held-steady). Each window prints commit-to-handler p50, p99 and
// max, handled messages a second, the backlog, the cleanup pressure and the
// table's size; the summary gives each phase's percentiles, the worst held
// window against the steady phase, and, for a soak of 10 minutes or more,
// its first and last 5 minutes (drift).
func runHeld(ctx context.Context, t heldTarget) {
	hold := *heldFor > 0
	total := *heldSteady
	if hold {
		total += *heldFor + *heldAfter
	}
	k := int(total.Seconds()*float64(*heldRate)) + 1
	committed := make([]atomic.Int64, k+1)
	handled := make([]atomic.Int64, k+1)
	// The phase each message was committed in (0 steady, 1 held, 2
	// after), for the phases' own percentiles.
	phaseOf := make([]atomic.Int32, k+1)
	var curPhase atomic.Int32
	var nHandled atomic.Int64
	stop := t.consume(ctx, func(seq int64) {
		if seq > 0 && seq <= int64(k) && handled[seq].CompareAndSwap(0, time.Now().UnixNano()) {
			nHandled.Add(1)
		}
	})
	time.Sleep(500 * time.Millisecond)
	if hold {
		fmt.Printf("\n== held %s: %d msg/s, steady %v, held %v, after %v; windows of %v\n", t.name, *heldRate, *heldSteady, *heldFor, *heldAfter, *heldWindow)
	} else {
		fmt.Printf("\n== soak %s: %d msg/s for %v; windows of %v\n", t.name, *heldRate, *heldSteady, *heldWindow)
	}
	fmt.Printf("%-8s %8s %9s %9s %9s %10s %9s %10s %10s\n", "t", "phase", "p50 ms", "p99 ms", "max ms", "handled/s", "backlog", t.pressure, "size kB")
	began := time.Now()
	var published atomic.Int64
	var seqs atomic.Int64
	pctx, cancelPub := context.WithCancel(ctx)
	var producers sync.WaitGroup
	const np = 8
	every := time.Second * np / time.Duration(*heldRate)
	for p := range np {
		producers.Go(func() {
			time.Sleep(every * time.Duration(p) / np)
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-pctx.Done():
					return
				case <-tick.C:
				}
				seq := seqs.Add(1)
				if seq > int64(k) {
					return
				}
				t.publish(ctx, seq)
				committed[seq].Store(time.Now().UnixNano())
				phaseOf[seq].Store(curPhase.Load())
				published.Add(1)
			}
		})
	}
	var release func()
	phase := "steady"
	lastHandled, lastSeq := int64(0), int64(1)
	var worstHeld float64 // the held phase's worst window p99
	var maxBacklog, minRate int64 = 0, math.MaxInt64
	var pressures, sizes []int64
	for w := 1; time.Since(began) < total; w++ {
		time.Sleep(time.Until(began.Add(time.Duration(w) * *heldWindow)))
		el := time.Since(began)
		was := phase // the phase this window's messages were committed in
		switch {
		case hold && phase == "steady" && el >= *heldSteady:
			release = t.hold(ctx)
			phase = "held"
			curPhase.Store(1)
		case phase == "held" && el >= *heldSteady+*heldFor:
			release()
			release = nil
			phase = "after"
			curPhase.Store(2)
		}
		// The window's messages: those committed in it and handled.
		upTo := seqs.Load()
		var lat []float64
		for i := lastSeq; i <= upTo && i <= int64(k); i++ {
			c, h := committed[i].Load(), handled[i].Load()
			if c != 0 && h != 0 {
				lat = append(lat, max(0, float64(h-c)/1e6))
			}
		}
		// Advance past the prefix fully handled.
		for lastSeq <= upTo && lastSeq <= int64(k) && handled[lastSeq].Load() != 0 {
			lastSeq++
		}
		h := nHandled.Load()
		pressure, size := t.measure(ctx)
		p50, p99, mx := 0.0, 0.0, 0.0
		if len(lat) > 0 {
			p50, p99, mx = percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 1)
		}
		rate := int64(float64(h-lastHandled) / heldWindow.Seconds())
		backlog := published.Load() - h
		fmt.Printf("%-8s %8s %9.2f %9.2f %9.1f %10d %9d %10d %10d\n", el.Truncate(time.Second), phase, p50, p99, mx, rate, backlog, pressure, size)
		if was == "held" {
			worstHeld = max(worstHeld, p99)
		}
		maxBacklog, minRate = max(maxBacklog, backlog), min(minRate, rate)
		pressures, sizes = append(pressures, pressure), append(sizes, size)
		lastHandled = h
	}
	cancelPub()
	producers.Wait()
	if release != nil {
		release()
	}
	deadline := time.Now().Add(60 * time.Second)
	for nHandled.Load() < published.Load() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	// Each phase's percentiles over every message committed in it.
	var byPhase [3][]float64
	var first, last []float64 // a soak's first and last 5 minutes
	began0 := committed[1].Load()
	for i := 1; i <= k; i++ {
		c, h := committed[i].Load(), handled[i].Load()
		if c == 0 || h == 0 {
			continue
		}
		l := max(0, float64(h-c)/1e6)
		p := phaseOf[i].Load()
		byPhase[p] = append(byPhase[p], l)
		switch at := time.Duration(c - began0); {
		case hold:
		case at < 5*time.Minute:
			first = append(first, l)
		case at >= total-5*time.Minute:
			last = append(last, l)
		}
	}
	fmt.Printf("phases %s:", t.name)
	for p, name := range []string{"steady", "held", "after"} {
		if lat := byPhase[p]; len(lat) > 0 {
			fmt.Printf("  %s p50 %.2f p99 %.2f max %.1f ms (%d msgs)", name, percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 1), len(lat))
		}
	}
	if len(byPhase[0]) > 0 && len(byPhase[1]) > 0 {
		steady99 := percentile(byPhase[0], 0.99)
		fmt.Printf("  held p99 / steady p99 %.2fx; worst held window p99 %.2f ms = %.2fx steady p99", percentile(byPhase[1], 0.99)/steady99, worstHeld, worstHeld/steady99)
	}
	if total >= 10*time.Minute && len(first) > 0 && len(last) > 0 {
		fmt.Printf("  drift: first 5 min p50 %.2f p99 %.2f, last 5 min p50 %.2f p99 %.2f ms (last/first p99 %.2fx)",
			percentile(first, 0.5), percentile(first, 0.99), percentile(last, 0.5), percentile(last, 0.99), percentile(last, 0.99)/percentile(first, 0.99))
	}
	fmt.Printf("  windows: lowest handled/s %d, backlog at most %d, %s %d-%d, size %d-%d kB (last %d)\n", minRate, maxBacklog, t.pressure,
		slices.Min(pressures), slices.Max(pressures), slices.Min(sizes), slices.Max(sizes), sizes[len(sizes)-1])
}

// tableOf is the table of an oncommit system as outbox.Config.Table
// names it.
func tableOf(name string) outboxdriver.Table {
	if schema, tbl, ok := strings.Cut(name, "."); ok {
		return outboxdriver.Table{Schema: schema, Name: tbl}
	}
	return outboxdriver.Table{Name: name}
}
