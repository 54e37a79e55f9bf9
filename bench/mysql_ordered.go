package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	mysqldialect "github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/outbox"
)

// mysqlOrderedDB is the database the MySQL ordered scenario creates and
// drops.
const mysqlOrderedDB = "oncommit_bench_ordered"

// mysqlOrderedBench (-only mysql-ordered) compares, on MySQL/MariaDB,
// ordered delivery (Config.OrderByKey) with unordered on the same backlog,
// sides alternating within each round: a drain of keys x per messages by
// one relay, and 1-message publishes by 8 producers on 8 keys.
func mysqlOrderedBench(ctx context.Context) {
	db := openMySQL()
	defer db.Close()
	db.SetMaxIdleConns(16)
	const keys, per = 10_000, 5
	total := keys * per
	table := mysqlOrderedDB + ".outbox"
	fresh := func(ordered bool) *outbox.Outbox {
		for _, q := range []string{`DROP DATABASE IF EXISTS ` + mysqlOrderedDB, `CREATE DATABASE ` + mysqlOrderedDB} {
			_, err := db.ExecContext(ctx, q)
			check(err)
		}
		check(mysqldialect.Migrate(ctx, db, table))
		ob, err := outbox.New(mysqldialect.Dialect(), outbox.Config{Table: table, OrderByKey: ordered})
		check(err)
		return ob
	}
	drain := func(ordered bool) float64 {
		ob := fresh(ordered)
		batch := make([]outbox.Message, 0, 1000)
		for i := range total {
			batch = append(batch, outbox.Message{Topic: "bench", Key: fmt.Sprintf("key-%05d", i%keys), Payload: []byte(`{"n":1}`)})
			if len(batch) == cap(batch) || i == total-1 {
				tx, err := db.BeginTx(ctx, nil)
				check(err)
				_, err = ob.PublishBatch(ctx, sqltx.From(tx), batch)
				check(err)
				check(tx.Commit())
				batch = batch[:0]
			}
		}
		var done atomic.Int64
		finished := make(chan struct{})
		r, err := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{Logger: quiet, PollInterval: 20 * time.Millisecond})
		check(err)
		check(r.Handle("bench", func(context.Context, outbox.Delivery) error {
			if done.Add(1) == int64(total) {
				close(finished)
			}
			return nil
		}))
		rctx, cancel := context.WithCancel(ctx)
		runDone := make(chan error, 1)
		t0 := time.Now()
		go func() { runDone <- r.Run(rctx) }()
		<-finished
		secs := time.Since(t0).Seconds()
		cancel()
		check(<-runDone)
		mysqlLeft(ctx, db, table)
		return float64(total) / secs
	}
	publish := func(ordered bool) float64 {
		ob := fresh(ordered)
		const producers, each = 8, 250
		var wg sync.WaitGroup
		t0 := time.Now()
		for p := range producers {
			key := fmt.Sprintf("producer-%d", p)
			wg.Go(func() {
				for range each {
					tx, err := db.BeginTx(ctx, nil)
					check(err)
					_, err = ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "bench", Key: key, Payload: []byte(`{"n":1}`)})
					check(err)
					check(tx.Commit())
				}
			})
		}
		wg.Wait()
		return float64(producers*each) / time.Since(t0).Seconds()
	}
	fmt.Printf("\n== mysql-ordered: ordered against unordered on MySQL/MariaDB, %d alternating rounds (msg/s, higher is better)\n", *rounds)
	for _, sc := range []struct {
		name string
		run  func(bool) float64
		id   string
	}{{"drain 10,000 keys x 5, 1 relay", drain, "drain"}, {"publish 1/tx, 8 producers on 8 keys", publish, "publish"}} {
		if *drainCases != "" && !slices.Contains(strings.Split(*drainCases, ","), sc.id) {
			continue
		}
		var ratios []float64
		for round := 1; round <= *rounds; round++ {
			var un, ord float64
			if round%2 == 1 {
				un, ord = sc.run(false), sc.run(true)
			} else {
				ord, un = sc.run(true), sc.run(false)
			}
			ratios = append(ratios, ord/un)
			fmt.Printf("%s round %d: unordered %.0f, ordered %.0f, ordered/unordered %.2fx\n", sc.name, round, un, ord, ord/un)
		}
		lo, hi := ratios[0], ratios[0]
		for _, x := range ratios {
			lo, hi = min(lo, x), max(hi, x)
		}
		fmt.Printf("%s: median ordered/unordered %.2fx (%.2f-%.2f)\n", sc.name, median(ratios), lo, hi)
	}
	_, err := db.ExecContext(ctx, `DROP DATABASE IF EXISTS `+mysqlOrderedDB)
	check(err)
}
