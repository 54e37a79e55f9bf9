package main

// -only fanout: what a topic's second subscriber costs (outbox
// Config.Subscribers). The same messages go through a topic with one
// handler and through one with two subscribers (two copies per message),
// in interleaved rounds: published one per transaction by 8 producers,
// then drained by one relay with no-op handlers. It prints each side's
// medians and the median of each round's ratio two/one for publishing and
// for draining, both in messages (a message is drained when every copy of
// it is). With -fanout-ordered both sides order by key (Config.OrderByKey),
// each message with one of 1,000 keys.

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/outbox"
)

var fanoutOrdered = flag.Bool("fanout-ordered", false, "fanout: with Config.OrderByKey, each message with one of 1,000 keys")

func fanoutBench(ctx context.Context, pool *pgxpool.Pool) {
	const msgs, producers = 20000, 8
	mode := ""
	if *fanoutOrdered {
		mode = " with OrderByKey (1,000 keys)"
	}
	fmt.Printf("\n== fanout%s: %d messages published one per transaction by %d producers, then drained by one relay (no-op handlers); one subscriber (a topic's handler) against two (Config.Subscribers); %d interleaved rounds (messages/s, higher is better)\n", mode, msgs, producers, *rounds)
	sides := []struct {
		name string
		subs []string
	}{{"one", nil}, {"two", []string{"mail", "fwd"}}}
	pub, drained := map[string][]float64{}, map[string][]float64{}
	for round := 1; round <= *rounds; round++ {
		for _, s := range sides {
			ob := fanoutTable(ctx, pool, s.subs)
			p := fanoutPublish(ctx, pool, ob, msgs, producers)
			_, err := pool.Exec(ctx, `ANALYZE `+pgsql.QuoteTable(ob.Table()))
			check(err)
			_, err = pool.Exec(ctx, `CHECKPOINT`)
			check(err)
			d := fanoutDrain(ctx, ob, s.subs, msgs)
			if k := remaining(ctx, pool, ob); k != 0 {
				check(fmt.Errorf("fanout: %d rows left after the drain", k))
			}
			pub[s.name], drained[s.name] = append(pub[s.name], p), append(drained[s.name], d)
			fmt.Printf("round %d %-3s publish %7.0f msg/s  drain %7.0f msg/s\n", round, s.name, p, d)
		}
	}
	for _, m := range []struct {
		what string
		r    map[string][]float64
	}{{"publish", pub}, {"drain", drained}} {
		one, two := m.r["one"], m.r["two"]
		ratios := make([]float64, len(one))
		for i := range one {
			ratios[i] = two[i] / one[i]
		}
		fmt.Printf("median %s: one %.0f msg/s (%.0f-%.0f), two %.0f msg/s (%.0f-%.0f); two/one of each round %.2fx (%.2f-%.2f)\n",
			m.what, median(one), slices.Min(one), slices.Max(one), median(two), slices.Min(two), slices.Max(two), median(ratios), slices.Min(ratios), slices.Max(ratios))
	}
}

// fanoutTable is a fresh table whose topic "bench" has subs (none: a
// plain topic).
func fanoutTable(ctx context.Context, pool *pgxpool.Pool, subs []string) *outbox.Outbox {
	const schema = "bench_fanout"
	_, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	check(err)
	db := openDB(pool)
	check(postgres.Migrate(ctx, db, schema+".outbox"))
	db.Close()
	cfg := outbox.Config{Table: schema + ".outbox", OrderByKey: *fanoutOrdered}
	if subs != nil {
		cfg.Subscribers = map[string][]string{"bench": subs}
	}
	ob, err := outbox.New(postgres.Dialect(), cfg)
	check(err)
	return ob
}

// fanoutPublish publishes n messages, one per transaction, from producers
// goroutines, and returns messages per second.
func fanoutPublish(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, n, producers int) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	msg := outbox.Message{Topic: "bench", Payload: []byte(`{"order_id":"0193a1f2","total_cents":4200}`)}
	t0 := time.Now()
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				m := msg
				if *fanoutOrdered {
					m.Key = "order-" + strconv.FormatInt(i%1000, 10)
				}
				tx, err := pool.Begin(ctx)
				check(err)
				_, err = ob.Publish(ctx, pgxtx.From(tx), m)
				check(err)
				check(tx.Commit(ctx))
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(t0).Seconds()
}

// fanoutDrain runs one relay until every copy of n messages is delivered
// and returns messages per second.
func fanoutDrain(ctx context.Context, ob *outbox.Outbox, subs []string, n int) float64 {
	p, err := pgxpool.New(ctx, *url)
	check(err)
	defer p.Close()
	check(p.Ping(ctx))
	total := int64(n * max(len(subs), 1))
	var done atomic.Int64
	finished := make(chan struct{})
	h := func(context.Context, outbox.Delivery) error {
		if done.Add(1) == total {
			close(finished)
		}
		return nil
	}
	r, err := ob.Relay(pgxtx.FromPool(p), outbox.RelayConfig{Logger: quiet, PollInterval: 20 * time.Millisecond, Listen: outbox.ListenOff, Concurrency: concurrency, BatchSize: batchSize})
	check(err)
	if subs == nil {
		check(r.Handle("bench", h))
	}
	for _, s := range subs {
		check(r.Subscribe("bench", s, h))
	}
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	t0 := time.Now()
	go func() { errc <- r.Run(rctx) }()
	<-finished
	el := time.Since(t0)
	cancel()
	check(<-errc)
	return float64(n) / el.Seconds()
}
