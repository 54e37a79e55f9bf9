package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
)

// orderedBench measures per-key ordered delivery (Config.OrderByKey)
// against unordered delivery of the same messages, in alternating rounds of
// one run: drains of keys x per messages (one relay, four relays), one hot
// key, and publishing one message per transaction from 8 producers on 8
// keys (the ratio) and on one shared key (the figure).
func orderedBench(ctx context.Context, pool *pgxpool.Pool) {
	fmt.Printf("\n== ordered: per-key ordered delivery against unordered, %d alternating rounds (msg/s, higher is better)\n", *rounds)
	// The counters' DB wrapper hides the adapter's InTx, which the settle
	// of ordered runs needs: both sides run without it.
	*countDB = false
	type scenario struct {
		id, name string
		run      func(ordered bool) float64
	}
	drainOf := func(keys, per, relayCount int) func(bool) float64 {
		return func(ordered bool) float64 {
			ob := orderedTable(ctx, pool, "ordered", ordered)
			fillKeys(ctx, pool, ob, keys, per)
			run := relays(ctx, ob, relayCount, keys*per)
			t0 := time.Now()
			run()
			secs := time.Since(t0).Seconds()
			if left := remaining(ctx, pool, ob); left != 0 {
				check(fmt.Errorf("ordered drain left %d rows", left))
			}
			return float64(keys*per) / secs
		}
	}
	publishOn := func(shared bool) func(bool) float64 {
		return func(ordered bool) float64 {
			ob := orderedTable(ctx, pool, "ordered", ordered)
			const producers, perProducer = 8, 250
			t0 := time.Now()
			publishKeys(ctx, pool, ob, producers, perProducer, shared)
			return float64(producers*perProducer) / time.Since(t0).Seconds()
		}
	}
	all := []scenario{
		{"keys-1", "drain 10,000 keys x 5, 1 relay", drainOf(10_000, 5, 1)},
		{"keys-4", "drain 10,000 keys x 5, 4 relays", drainOf(10_000, 5, 4)},
		{"hot", "drain one hot key of 20,000, 1 relay", drainOf(1, 20_000, 1)},
		{"publish-keys", "publish 1/tx, 8 producers on 8 keys", publishOn(false)},
		{"publish-one", "publish 1/tx, 8 producers on one key", publishOn(true)},
	}
	// -cases keeps some of them (by id, comma-separated), for an A/B of one;
	// claim-1m (ordered_claim.go), publish-wal and publish-cpu
	// (ordered_wal.go) run only when named.
	cases := strings.Split(*drainCases, ",")
	if slices.Contains(cases, "claim-1m") {
		claimBacklog(ctx, pool)
	}
	if slices.Contains(cases, "publish-wal") {
		publishWAL(ctx, pool)
	}
	if slices.Contains(cases, "publish-cpu") {
		publishCPU(ctx, pool)
	}
	var scenarios []scenario
	for _, sc := range all {
		if *drainCases == "" || slices.Contains(cases, sc.id) {
			scenarios = append(scenarios, sc)
		}
	}
	if len(scenarios) == 0 {
		return
	}
	got := map[string][]float64{}
	for round := 1; round <= *rounds; round++ {
		for _, sc := range scenarios {
			order := []bool{false, true}
			if round%2 == 0 {
				order = []bool{true, false}
			}
			for _, ordered := range order {
				v := sc.run(ordered)
				k := sc.name + map[bool]string{false: " | unordered", true: " | ordered"}[ordered]
				got[k] = append(got[k], v)
				fmt.Printf("round %d %-48s %9.0f msg/s\n", round, k, v)
			}
		}
	}
	fmt.Printf("\nmedians of %d rounds (min-max); ratio = ordered / unordered medians\n", *rounds)
	for _, sc := range scenarios {
		u, o := got[sc.name+" | unordered"], got[sc.name+" | ordered"]
		fmt.Printf("%-40s unordered %7.0f (%.0f-%.0f)  ordered %7.0f (%.0f-%.0f)  %.2fx\n", sc.name,
			median(u), slices.Min(u), slices.Max(u), median(o), slices.Min(o), slices.Max(o), median(o)/median(u))
	}
}

// publishKeys publishes n messages from each of producers goroutines, one
// per transaction, producer p on key "producer-p" (all on "shared" with
// shared), through pool.
func publishKeys(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, producers, n int, shared bool) {
	var wg sync.WaitGroup
	for p := range producers {
		key := fmt.Sprintf("producer-%d", p)
		if shared {
			key = "shared"
		}
		wg.Go(func() {
			for range n {
				tx, err := pool.Begin(ctx)
				check(err)
				_, err = ob.Publish(ctx, pgxtx.From(tx), outbox.Message{Topic: "bench", Key: key, Payload: []byte(`{"n":1}`)})
				check(err)
				check(tx.Commit(ctx))
			}
		})
	}
	wg.Wait()
}

// orderedTable is table with Config.OrderByKey set as asked.
func orderedTable(ctx context.Context, pool *pgxpool.Pool, name string, ordered bool) *outbox.Outbox {
	base := table(ctx, pool, name)
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: base.Table().String(), OrderByKey: ordered})
	check(err)
	return ob
}

// fillKeys publishes per messages for each of keys keys, topic "bench", in
// transactions of 1,000: message j of every key before message j+1 of any.
func fillKeys(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, keys, per int) {
	var batch []outbox.Message
	flush := func() {
		tx, err := pool.Begin(ctx)
		check(err)
		_, err = ob.PublishBatch(ctx, pgxtx.From(tx), batch)
		check(err)
		check(tx.Commit(ctx))
		batch = batch[:0]
	}
	for j := range per {
		for i := range keys {
			batch = append(batch, outbox.Message{Topic: "bench", Key: fmt.Sprintf("key-%d", i), Payload: []byte(fmt.Sprintf(`{"seq":%d}`, j))})
			if len(batch) == 1000 {
				flush()
			}
		}
	}
	if len(batch) > 0 {
		flush()
	}
	_, err := pool.Exec(ctx, `ANALYZE `+postgres.QuoteTable(ob.Table()))
	check(err)
}
