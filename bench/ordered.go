package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgsql"
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
		// pair, if set, runs both sides and returns (unordered, ordered).
		pair func(orderedFirst bool) (float64, float64)
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
	// A publish scenario runs both sides in one call: publishParts parts of
	// 8 producers x 125 transactions each, alternating between an
	// unordered and an ordered table, so that a slow spell of the host's
	// fsync falls on both alike; a side's rate is its messages over the sum
	// of its parts' times.
	publishOn := func(shared bool) func(bool) (float64, float64) {
		return func(orderedFirst bool) (float64, float64) {
			obs := map[bool]*outbox.Outbox{false: orderedTable(ctx, pool, "ordered_u", false), true: orderedTable(ctx, pool, "ordered_o", true)}
			const producers, perPart = 8, 125
			var secs [2]float64
			for part := range publishParts {
				for _, ordered := range []bool{orderedFirst != (part%2 == 1), orderedFirst == (part%2 == 1)} {
					t0 := time.Now()
					publishKeys(ctx, pool, obs[ordered], producers, perPart, shared)
					secs[b2i(ordered)] += time.Since(t0).Seconds()
				}
			}
			msgs := float64(producers * perPart * publishParts)
			return msgs / secs[0], msgs / secs[1]
		}
	}
	all := []scenario{
		{"keys-1", "drain 10,000 keys x 5, 1 relay", drainOf(10_000, 5, 1), nil},
		{"keys-4", "drain 10,000 keys x 5, 4 relays", drainOf(10_000, 5, 4), nil},
		{"hot", "drain one hot key of 20,000, 1 relay", drainOf(1, 20_000, 1), nil},
		{"publish-keys", "publish 1/tx, 8 producers on 8 keys", nil, publishOn(false)},
		{"publish-one", "publish 1/tx, 8 producers on one key", nil, publishOn(true)},
	}
	// -cases keeps some of them (by id, comma-separated), for an A/B of one;
	// claim-1m (ordered_claim.go), publish-wal and publish-cpu
	// (ordered_wal.go) and held-key (ordered_held.go) run only when named.
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
	if slices.Contains(cases, "held-key") {
		heldKeyBench(ctx, pool)
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
			record := func(ordered bool, v float64) {
				k := sc.name + map[bool]string{false: " | unordered", true: " | ordered"}[ordered]
				got[k] = append(got[k], v)
				fmt.Printf("round %d %-48s %9.0f msg/s\n", round, k, v)
			}
			if sc.pair != nil {
				u, o := sc.pair(order[0])
				record(false, u)
				record(true, o)
				continue
			}
			for _, ordered := range order {
				record(ordered, sc.run(ordered))
			}
		}
	}
	fmt.Printf("\nmedians of %d rounds (min-max); ratio = ordered / unordered medians; paired = median of the rounds' own ratios\n", *rounds)
	for _, sc := range scenarios {
		u, o := got[sc.name+" | unordered"], got[sc.name+" | ordered"]
		per := make([]float64, len(o))
		for i := range o {
			per[i] = o[i] / u[i]
		}
		fmt.Printf("%-40s unordered %7.0f (%.0f-%.0f)  ordered %7.0f (%.0f-%.0f)  %.2fx  paired %.2fx\n", sc.name,
			median(u), slices.Min(u), slices.Max(u), median(o), slices.Min(o), slices.Max(o), median(o)/median(u), median(per))
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

// publishParts is how many parts each side of an ordered publish round
// is cut into (8,000 transactions a side).
const publishParts = 8

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// orderedTable is table with Config.OrderByKey set as asked.
func orderedTable(ctx context.Context, pool *pgxpool.Pool, name string, ordered bool) *outbox.Outbox {
	base := table(ctx, pool, name)
	d := postgres.Dialect()
	if *orderedWAL {
		cfg := postgres.WALConfig{ConnString: *url, Slot: "bench_owal", Publication: "bench_owal"}
		resetWAL(ctx, cfg)
		var err error
		d, err = postgres.WALDialect(cfg)
		check(err)
	}
	ob, err := outbox.New(d, outbox.Config{Table: base.Table().String(), OrderByKey: ordered})
	check(err)
	return ob
}

// orderedWAL runs the ordered scenarios on the WAL transport, both sides.
var orderedWAL = flag.Bool("ordered-wal", false, "ordered: both sides on the WAL transport (postgres.WALDialect); -url must reach a server with wal_level = logical")

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
	_, err := pool.Exec(ctx, `ANALYZE `+pgsql.QuoteTable(ob.Table()))
	check(err)
}
