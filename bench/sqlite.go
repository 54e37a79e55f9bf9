package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
	_ "modernc.org/sqlite"
)

// sqliteFile opens a fresh SQLite file (WAL, busy timeout, and the DSN
// parameters in more) with the outbox table.
func sqliteFile(ctx context.Context, dir, name string, more ...string) (*sql.DB, *outbox.Outbox) {
	path := filepath.Join(dir, name+".db")
	os.Remove(path)
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"+strings.Join(more, ""))
	check(err)
	check(sqlite.Migrate(ctx, db, ""))
	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{})
	check(err)
	return db, ob
}

func sqliteFill(ctx context.Context, db *sql.DB, ob *outbox.Outbox, n int) {
	batch := make([]outbox.Message, 1000)
	for i := range batch {
		batch[i] = outbox.Message{Topic: "bench", Payload: []byte(`{"order_id":"0193a1f2","total_cents":4200}`)}
	}
	for left := n; left > 0; left -= len(batch) {
		tx, err := db.BeginTx(ctx, nil)
		check(err)
		_, err = ob.PublishBatch(ctx, sqltx.From(tx), batch[:min(left, len(batch))])
		check(err)
		check(tx.Commit())
	}
}

// sqliteBench measures, on SQLite, publish beside a raw INSERT and the
// drain of one relay beside a raw-SQL loop (claim 100 with UPDATE ...
// RETURNING, delete by ids), in interleaved rounds.
func sqliteBench(ctx context.Context) {
	dir, err := os.MkdirTemp("", "oncommit-bench-sqlite-")
	check(err)
	defer os.RemoveAll(dir)
	const ops = 20000
	payload := []byte(`{"order_id":"0193a1f2","email":"someone@example.com","total_cents":4200}`)
	fmt.Printf("\n== sqlite publish: %d single-message statements in transactions of 500 (µs/op), %d rounds\n", ops, *rounds)
	var pubRatios []float64
	for round := 1; round <= *rounds; round++ {
		timeIt := func(op func(tx *sql.Tx, ob *outbox.Outbox)) float64 {
			db, ob := sqliteFile(ctx, dir, "pub")
			defer db.Close()
			t0 := time.Now()
			tx, err := db.BeginTx(ctx, nil)
			check(err)
			for i := range ops {
				op(tx, ob)
				if i%500 == 499 {
					check(tx.Commit())
					tx, err = db.BeginTx(ctx, nil)
					check(err)
				}
			}
			check(tx.Commit())
			return float64(time.Since(t0).Microseconds()) / ops
		}
		raw := timeIt(func(tx *sql.Tx, ob *outbox.Outbox) {
			_, err := tx.ExecContext(ctx, `INSERT INTO "outbox" (id, topic, message_key, payload) VALUES (?1, ?2, ?3, ?4)`,
				outbox.NewID().String(), "order.placed", "0193a1f2", string(payload))
			check(err)
		})
		pub := timeIt(func(tx *sql.Tx, ob *outbox.Outbox) {
			_, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.placed", Key: "0193a1f2", Payload: payload})
			check(err)
		})
		pubRatios = append(pubRatios, pub/raw)
		fmt.Printf("round %d raw-insert %.1f µs/op, publish %.1f µs/op, publish/raw %.2fx\n", round, raw, pub, pub/raw)
	}
	fmt.Printf("median publish/raw = %.2fx\n", median(pubRatios))

	fmt.Printf("\n== sqlite drain: %d messages, no-op handler, one relay beside the raw loop (seconds), %d rounds\n", *n, *rounds)
	var drainRatios []float64
	for round := 1; round <= *rounds; round++ {
		db, ob := sqliteFile(ctx, dir, "drain-raw")
		sqliteFill(ctx, db, ob, *n)
		t0 := time.Now()
		claim := `UPDATE "outbox" SET state = 'processing', attempts = attempts + 1, available_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + 30000
WHERE id IN (SELECT id FROM "outbox" WHERE state IN ('pending', 'processing') AND available_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER) AND topic = 'bench'
ORDER BY available_at, id LIMIT 100) RETURNING id, topic, payload`
		if *rawIDs {
			claim = strings.TrimSuffix(claim, ", topic, payload")
		}
		for {
			rows, err := db.QueryContext(ctx, claim)
			check(err)
			var ids []string
			for rows.Next() {
				var id, topic string
				var payload []byte
				if *rawIDs {
					check(rows.Scan(&id))
				} else {
					check(rows.Scan(&id, &topic, &payload))
				}
				ids = append(ids, id)
			}
			check(rows.Err())
			if len(ids) == 0 {
				break
			}
			b, _ := json.Marshal(ids)
			_, err = db.ExecContext(ctx, `DELETE FROM "outbox" WHERE id IN (SELECT value FROM json_each(?1))`, string(b))
			check(err)
		}
		raw := time.Since(t0).Seconds()
		db.Close()

		db, ob = sqliteFile(ctx, dir, "drain-relay")
		sqliteFill(ctx, db, ob, *n)
		var done atomic.Int64
		finished := make(chan struct{})
		r, err := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{Logger: quiet, Tracer: stats}) // as a user builds it: prepared statements and all
		check(err)
		check(r.Handle("bench", func(ctx context.Context, d outbox.Delivery) error {
			if done.Add(1) == int64(*n) {
				close(finished)
			}
			return nil
		}))
		rctx, cancel := context.WithCancel(ctx)
		runDone := make(chan error, 1)
		t0 = time.Now()
		go func() { runDone <- r.Run(rctx) }()
		<-finished
		cancel()
		check(<-runDone)
		rel := time.Since(t0).Seconds()
		var left int
		check(db.QueryRowContext(ctx, `SELECT count(*) FROM outbox`).Scan(&left))
		if left != 0 {
			check(fmt.Errorf("relay left %d rows", left))
		}
		db.Close()
		drainRatios = append(drainRatios, raw/rel)
		fmt.Printf("round %d raw-loop %.2fs (%.0f msg/s), relay %.2fs (%.0f msg/s), relay/raw throughput %.2fx (%s)\n",
			round, raw, float64(*n)/raw, rel, float64(*n)/rel, raw/rel, stats)
	}
	fmt.Printf("median relay/raw throughput = %.2fx\n", median(drainRatios))
}

// sqliteStmts drains a SQLite file with the dialect's claim statements
// alone (successes carried by the next claim), sequentially: the SQL cost
// without the relay's goroutines.
func sqliteStmts(ctx context.Context) {
	dir, err := os.MkdirTemp("", "oncommit-bench-sqlite-")
	check(err)
	defer os.RemoveAll(dir)
	d := sqlite.Dialect().(outboxdriver.RelayDialect)
	for round := 1; round <= *rounds; round++ {
		db, ob := sqliteFile(ctx, dir, "stmt")
		sqliteFill(ctx, db, ob, *n)
		pdb := sqltx.FromDB(db)
		var done []outboxdriver.Fence
		t0 := time.Now()
		for {
			claimed, _, err := d.Claim(ctx, pdb, ob.Table(), outboxdriver.ClaimParams{Topics: []string{"bench"}, Limit: 100, Lease: 30 * time.Second, MaxAttempts: 10, Done: done})
			check(err)
			if len(claimed) == 0 {
				break
			}
			done = done[:0]
			for _, c := range claimed {
				done = append(done, outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts})
			}
		}
		carried := time.Since(t0)
		db.Close()

		// The same statements, the carried settle and the claim in one
		// transaction (one commit per batch).
		db, ob = sqliteFile(ctx, dir, "stmt")
		sqliteFill(ctx, db, ob, *n)
		done = done[:0]
		t0 = time.Now()
		for {
			tx, err := db.BeginTx(ctx, nil)
			check(err)
			claimed, _, err := d.Claim(ctx, sqlTxDB{tx}, ob.Table(), outboxdriver.ClaimParams{Topics: []string{"bench"}, Limit: 100, Lease: 30 * time.Second, MaxAttempts: 10, Done: done})
			check(err)
			check(tx.Commit())
			if len(claimed) == 0 {
				break
			}
			done = done[:0]
			for _, c := range claimed {
				done = append(done, outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts})
			}
		}
		fmt.Printf("round %d one transaction per claim and carried settle: %.2fs\n", round, time.Since(t0).Seconds())
		db.Close()

		db, ob = sqliteFile(ctx, dir, "stmt")
		sqliteFill(ctx, db, ob, *n)
		pdb = sqltx.FromDB(db)
		t0 = time.Now()
		for {
			claimed, _, err := d.Claim(ctx, pdb, ob.Table(), outboxdriver.ClaimParams{Topics: []string{"bench"}, Limit: 100, Lease: 30 * time.Second, MaxAttempts: 10})
			check(err)
			if len(claimed) == 0 {
				break
			}
			ids := make([]string, len(claimed))
			for i, c := range claimed {
				ids[i] = c.ID.String()
			}
			b, _ := json.Marshal(ids)
			_, err = db.ExecContext(ctx, `DELETE FROM "outbox" WHERE id IN (SELECT value FROM json_each(?1))`, string(b))
			check(err)
		}
		fmt.Printf("round %d claim statements carrying settles: %.2fs; claim statement + raw delete: %.2fs\n", round, carried.Seconds(), time.Since(t0).Seconds())
		db.Close()
	}
}

type sqlTxDB struct{ tx *sql.Tx }

func (d sqlTxDB) QueryDB(ctx context.Context, q string, args ...any) (outboxdriver.Rows, error) {
	return d.tx.QueryContext(ctx, q, args...)
}
