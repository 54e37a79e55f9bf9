package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/outbox"
)

// heldKeyBench (-only ordered -cases held-key) measures I6 of
// docs/internals.md: one relay with the defaults (and OrderByKey) delivers
// messages published at 200 msg/s on 50 keys, one per transaction, while
// another transaction that published for key "held" stays open for 30 s.
// It reports, per 5 s window, the commit-to-settle latency of the other
// keys' messages (from the publisher's commit to the row's deletion, seen
// by a poller every 10 ms), how many were delivered more than once, and
// how long Run took to return once cancelled with the key still held.
func heldKeyBench(ctx context.Context, pool *pgxpool.Pool) {
	const (
		rate    = 200
		keys    = 50
		before  = 5 * time.Second
		hold    = 30 * time.Second
		after   = 5 * time.Second
		window  = 5 * time.Second
		pollGap = 10 * time.Millisecond
	)
	fmt.Printf("\n== ordered, a key held open: %d msg/s on %d keys, one relay with the defaults; key \"held\" published in a transaction left open %v\n", rate, keys, hold)
	ob := orderedTable(ctx, pool, "held", true)
	var mu sync.Mutex
	committed := map[outbox.ID]time.Time{} // not settled yet
	handled := map[outbox.ID]int{}
	type sample struct {
		at  time.Time
		lat time.Duration
	}
	var samples []sample
	r, err := ob.Relay(pgxtx.FromPool(pool), outbox.RelayConfig{Logger: quiet})
	check(err)
	check(r.Handle("bench", func(_ context.Context, d outbox.Delivery) error {
		mu.Lock()
		if d.Key != "held" {
			handled[d.ID]++
		}
		mu.Unlock()
		if d.Key == "held" {
			time.Sleep(200 * time.Millisecond)
		}
		return nil
	}))
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- r.Run(runCtx) }()

	// The poller: which tracked messages are gone (settled).
	stopPoll := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(pollGap):
			}
			mu.Lock()
			ids := make([]string, 0, len(committed))
			for id := range committed {
				ids = append(ids, id.String())
			}
			mu.Unlock()
			if len(ids) == 0 {
				continue
			}
			rows, err := pool.Query(ctx, `SELECT id::text FROM `+ob.Table().String()+` WHERE id = ANY($1::uuid[])`, ids)
			check(err)
			left := map[string]bool{}
			for rows.Next() {
				var s string
				check(rows.Scan(&s))
				left[s] = true
			}
			check(rows.Err())
			now := time.Now()
			mu.Lock()
			for id, at := range committed {
				if !left[id.String()] {
					samples = append(samples, sample{now, now.Sub(at)})
					delete(committed, id)
				}
			}
			mu.Unlock()
		}
	}()

	start := time.Now()
	// Key "held": one message committed, whose handler takes 200 ms, then
	// a second one in a transaction left open: the first one's settle
	// meets the held key row.
	tx, err := pool.Begin(ctx)
	check(err)
	_, err = ob.Publish(ctx, pgxtx.From(tx), outbox.Message{Topic: "bench", Key: "held"})
	check(err)
	var heldTx atomic.Value
	var sent atomic.Int64
	const producers = 4
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second * producers / rate)
			defer tick.Stop()
			for i := 0; ; i++ {
				now := <-tick.C
				el := now.Sub(start)
				if p == 0 && el >= before && heldTx.Load() == nil {
					check(tx.Commit(ctx))
					time.Sleep(50 * time.Millisecond)
					htx, err := pool.Begin(ctx)
					check(err)
					_, err = ob.Publish(ctx, pgxtx.From(htx), outbox.Message{Topic: "bench", Key: "held"})
					check(err)
					heldTx.Store(htx)
				}
				if el >= before+hold+after {
					return
				}
				tx, err := pool.Begin(ctx)
				check(err)
				res, err := ob.Publish(ctx, pgxtx.From(tx), outbox.Message{Topic: "bench", Key: fmt.Sprintf("k%d", (i*producers+p)%keys)})
				check(err)
				check(tx.Commit(ctx))
				mu.Lock()
				committed[res.ID] = time.Now()
				mu.Unlock()
				sent.Add(1)
			}
		}()
	}
	wg.Wait()
	time.Sleep(time.Second)
	close(stopPoll)
	<-polled
	t0 := time.Now()
	cancel()
	<-ran
	shutdown := time.Since(t0)
	if tx, ok := heldTx.Load().(interface{ Rollback(context.Context) error }); ok {
		check(tx.Rollback(ctx))
	}
	mu.Lock()
	defer mu.Unlock()
	twice := 0
	for _, n := range handled {
		if n > 1 {
			twice++
		}
	}
	fmt.Printf("%-22s %8s %9s %9s %9s\n", "window (s from start)", "settled", "p50 ms", "p99 ms", "max ms")
	for w := time.Duration(0); w < before+hold+after+time.Second; w += window {
		var lat []float64
		for _, s := range samples {
			if at := s.at.Sub(start); at >= w && at < w+window {
				lat = append(lat, float64(s.lat.Microseconds())/1000)
			}
		}
		if len(lat) == 0 {
			continue
		}
		tag := ""
		if w >= before && w < before+hold {
			tag = " (held)"
		}
		fmt.Printf("%3.0f-%-3.0f%-12s %8d %9.1f %9.1f %9.1f\n", w.Seconds(), (w + window).Seconds(), tag, len(lat), percentile(lat, 0.5), percentile(lat, 0.99), slices.Max(lat))
	}
	fmt.Printf("published %d on other keys (%.0f msg/s); unsettled at the end %d; delivered more than once %d; Run returned %v after cancel with the key still held (ShutdownGrace %v)\n",
		sent.Load(), float64(sent.Load())/(before+hold+after).Seconds(), len(committed), twice, shutdown.Round(time.Millisecond), outbox.DefaultShutdownGrace)
}
