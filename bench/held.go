package main

import (
	"context"
	"flag"
	"fmt"
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
	heldFor    = flag.Duration("held-for", 5*time.Minute, "held: how long the REPEATABLE READ transaction is held")
	heldAfter  = flag.Duration("held-after", 30*time.Second, "held: the phase after its release")
	heldWindow = flag.Duration("held-window", 10*time.Second, "held: the reporting window (and the VACUUM interval)")
)

// heldRun is the held-snapshot scenario for system s (oncommit's table or
// the WAL transport): a fixed publish rate, one message per transaction
// from 8 producers, one relay consuming; a steady phase, then a REPEATABLE
// READ transaction that has read another table held open (the MVCC
// horizon stays where it was), then released. The outbox table is
// VACUUMed every window (this server runs with autovacuum off: as an
// aggressively tuned autovacuum would). Each window prints
// commit-to-handler p50, p99 and max, handled messages a second, the
// backlog, the table's dead tuples and its size with its indexes.
//
//	cd bench && go run . -only compare -scenarios held -systems oncommit,oncommit-wal \
//	  -url postgres://postgres@127.0.0.1:5433/test?sslmode=disable
func heldRun(ctx context.Context, s *system) {
	s.reset(ctx)
	tbl := pgsql.QuoteTable(tableOf(s.table))
	mustExec(ctx, s.pool, `CREATE TABLE IF NOT EXISTS bench_held_other (n int)`)
	mustExec(ctx, s.pool, `INSERT INTO bench_held_other VALUES (1)`)
	total := *heldSteady + *heldFor + *heldAfter
	k := int(total.Seconds()*float64(*heldRate)) + 1
	committed := make([]atomic.Int64, k+1)
	handled := make([]atomic.Int64, k+1)
	// The phase each message was committed in (0 steady, 1 held, 2
	// after), for the phases' own percentiles.
	phaseOf := make([]atomic.Int32, k+1)
	var curPhase atomic.Int32
	var nHandled atomic.Int64
	start, stop := s.consume(ctx, 1, func(seq int64) {
		if seq > 0 && seq <= int64(k) && handled[seq].CompareAndSwap(0, time.Now().UnixNano()) {
			nHandled.Add(1)
		}
	})
	start()
	warm(ctx, s.pool)
	time.Sleep(500 * time.Millisecond)
	fmt.Printf("\n== held %s: %d msg/s, steady %v, held %v, after %v; windows of %v\n", s.name, *heldRate, *heldSteady, *heldFor, *heldAfter, *heldWindow)
	fmt.Printf("%-8s %8s %9s %9s %9s %10s %9s %10s %10s\n", "t", "phase", "p50 ms", "p99 ms", "max ms", "handled/s", "backlog", "dead tup", "size kB")
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
				tx, err := s.pool.Begin(ctx)
				check(err)
				check(s.publish(ctx, tx, 1, seq))
				check(tx.Commit(ctx))
				committed[seq].Store(time.Now().UnixNano())
				phaseOf[seq].Store(curPhase.Load())
				published.Add(1)
			}
		})
	}
	var held pgx.Tx
	phase := "steady"
	lastHandled, lastSeq := int64(0), int64(1)
	for w := 1; time.Since(began) < total; w++ {
		time.Sleep(time.Until(began.Add(time.Duration(w) * *heldWindow)))
		el := time.Since(began)
		switch {
		case phase == "steady" && el >= *heldSteady:
			var err error
			held, err = s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			check(err)
			_, err = held.Exec(ctx, `SELECT count(*) FROM bench_held_other`)
			check(err)
			phase = "held"
			curPhase.Store(1)
		case phase == "held" && el >= *heldSteady+*heldFor:
			check(held.Rollback(ctx))
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
		mustExec(ctx, s.pool, `VACUUM `+tbl)
		var dead, size int64
		check(s.pool.QueryRow(ctx, `SELECT coalesce(n_dead_tup, 0), pg_total_relation_size($1::regclass) / 1024 FROM pg_stat_user_tables WHERE relid = $1::regclass`, tbl).Scan(&dead, &size))
		p50, p99, mx := 0.0, 0.0, 0.0
		if len(lat) > 0 {
			p50, p99, mx = percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 1)
		}
		fmt.Printf("%-8s %8s %9.2f %9.2f %9.1f %10.0f %9d %10d %10d\n", el.Truncate(time.Second), phase, p50, p99, mx,
			float64(h-lastHandled)/heldWindow.Seconds(), published.Load()-h, dead, size)
		lastHandled = h
	}
	cancelPub()
	producers.Wait()
	if held != nil && phase == "held" {
		_ = held.Rollback(ctx)
	}
	deadline := time.Now().Add(60 * time.Second)
	for nHandled.Load() < published.Load() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	closePools()
	// Each phase's percentiles over every message committed in it.
	var byPhase [3][]float64
	for i := 1; i <= k; i++ {
		c, h := committed[i].Load(), handled[i].Load()
		if c != 0 && h != 0 {
			p := phaseOf[i].Load()
			byPhase[p] = append(byPhase[p], max(0, float64(h-c)/1e6))
		}
	}
	fmt.Printf("phases %s:", s.name)
	for p, name := range []string{"steady", "held", "after"} {
		if lat := byPhase[p]; len(lat) > 0 {
			fmt.Printf("  %s p50 %.2f p99 %.2f max %.1f ms (%d msgs)", name, percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 1), len(lat))
		}
	}
	if len(byPhase[0]) > 0 && len(byPhase[1]) > 0 {
		fmt.Printf("  held p99 / steady p99 %.2fx", percentile(byPhase[1], 0.99)/percentile(byPhase[0], 0.99))
	}
	fmt.Println()
}

// tableOf is the table of an oncommit system as outbox.Config.Table
// names it.
func tableOf(name string) outboxdriver.Table {
	if schema, tbl, ok := strings.Cut(name, "."); ok {
		return outboxdriver.Table{Schema: schema, Name: tbl}
	}
	return outboxdriver.Table{Name: name}
}
