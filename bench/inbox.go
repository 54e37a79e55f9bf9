package main

// -only inbox: what the inbox costs a consumer. The same consumer applies
// messages to a ledger (one INSERT per message, in a transaction of its
// own) with and without the inbox's record in that transaction
// (outbox.Receive through pgxtx.NewBeginner), at 1 and 8 concurrent
// workers, in interleaved rounds; it prints each side's medians and the
// median of each round's ratio inbox/plain (the two sides of a round run
// back to back, so a round's ratio sees the same machine).

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

var inboxSQL = flag.Bool("inbox-sql", false, "inbox: both sides on database/sql (pgx's stdlib driver, sqltx.NewBeginner) instead of native pgx")

func inboxBench(ctx context.Context, pool *pgxpool.Pool) {
	const schema = "bench_inbox"
	driver := "pgx (pgxtx.NewBeginner)"
	if *inboxSQL {
		driver = "database/sql (sqltx.NewBeginner, pgx's stdlib driver)"
	}
	fmt.Printf("\n== inbox: a consumer applying messages to a ledger (1 INSERT per message, a transaction each), without and with the inbox's record, on %s; %d rounds (msg/s, higher is better)\n", driver, *rounds)
	for _, workers := range []int{1, 8} {
		n := 8000
		if workers > 1 {
			n = 20000
		}
		rates := map[string][]float64{}
		for round := 1; round <= *rounds; round++ {
			for _, side := range []string{"plain", "inbox"} {
				_, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
				check(err)
				_, err = pool.Exec(ctx, `CREATE SCHEMA `+schema)
				check(err)
				db := openDB(pool)
				check(postgres.MigrateInbox(ctx, db, schema+".inbox"))
				db.Close()
				_, err = pool.Exec(ctx, `CREATE TABLE `+schema+`.ledger (message_id text NOT NULL, amount int NOT NULL)`)
				check(err)
				_, err = pool.Exec(ctx, `CHECKPOINT`)
				check(err)
				ib, err := outbox.NewInbox(postgres.Dialect(), outbox.InboxConfig{Table: schema + ".inbox"})
				check(err)
				ids := make([]string, n)
				for i := range ids {
					ids[i] = outbox.NewID().String()
				}
				rate := inboxRun(ctx, pool, ib, side == "inbox", schema+".ledger", ids, workers)
				rates[side] = append(rates[side], rate)
				fmt.Printf("round %d workers %d %-5s %8.0f msg/s\n", round, workers, side, rate)
			}
		}
		p, i := rates["plain"], rates["inbox"]
		ratios := make([]float64, len(p))
		for r := range p {
			ratios[r] = i[r] / p[r]
		}
		fmt.Printf("median, %d workers: plain %.0f msg/s (%.0f-%.0f), inbox %.0f msg/s (%.0f-%.0f); inbox/plain of each round %.2fx (%.2f-%.2f)\n",
			workers, median(p), slices.Min(p), slices.Max(p), median(i), slices.Min(i), slices.Max(i), median(ratios), slices.Min(ratios), slices.Max(ratios))
	}
}

// inboxRun applies ids with workers goroutines and returns messages per
// second.
func inboxRun(ctx context.Context, pool *pgxpool.Pool, ib *outbox.Inbox, withInbox bool, ledger string, ids []string, workers int) float64 {
	insert := `INSERT INTO ` + ledger + ` (message_id, amount) VALUES ($1, 1)`
	if *inboxSQL {
		db := openDB(pool)
		defer db.Close()
		return consumeAll(ctx, ib, sqltx.NewBeginner(db, nil), withInbox, ids, workers, func(ctx context.Context, tx *sql.Tx, id string) error {
			_, err := tx.ExecContext(ctx, insert, id)
			return err
		})
	}
	return consumeAll(ctx, ib, pgxtx.NewBeginner(pool, pgx.TxOptions{}), withInbox, ids, workers, func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, insert, id)
		return err
	})
}

// consumeAll applies each of ids with effect in a transaction of its own
// begun with b, through outbox.Receive when withInbox, with workers
// goroutines, and returns messages per second.
func consumeAll[T any](ctx context.Context, ib *outbox.Inbox, b outboxdriver.Beginner[T], withInbox bool, ids []string, workers int, effect func(ctx context.Context, tx T, id string) error) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := next.Add(1) - 1; k < int64(len(ids)); k = next.Add(1) - 1 {
				id := ids[k]
				if withInbox {
					_, err := outbox.Receive(ctx, ib, b, "ledger", id, func(ctx context.Context, tx T) error { return effect(ctx, tx, id) })
					check(err)
					continue
				}
				tx, err := b.Begin(ctx)
				check(err)
				check(effect(ctx, tx, id))
				check(b.Commit(ctx, tx))
			}
		}()
	}
	wg.Wait()
	return float64(len(ids)) / time.Since(t0).Seconds()
}
