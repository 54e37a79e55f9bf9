package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/oncommit/oncommit/adapters/sqltx"
	mysqldialect "github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/outbox"
)

var mysqlDSN = flag.String("mysql-dsn", envOr("OUTBOX_TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test"), "MySQL/MariaDB DSN (go-sql-driver/mysql) for -only mysql")

// mysqlBenchDB is the database the MySQL scenario creates and drops.
const mysqlBenchDB = "oncommit_bench"

// mysqlBench drains *n no-op messages with one relay beside a raw-SQL loop
// on the same MySQL/MariaDB server, in interleaved rounds, each on a fresh
// table. Both use one pool with interpolateParams=true, so the raw loop's
// bound id lists cost one round trip (the relay's statements carry
// literals and do not depend on it).
//
// The raw loop is what a hand-written relay does: one short transaction
// (SELECT id, topic, payload ... ORDER BY claim_at, id LIMIT 100 FOR UPDATE
// SKIP LOCKED, UPDATE the ids to processing, COMMIT), then DELETE the ids.
func mysqlBench(ctx context.Context) {
	db := openMySQL()
	defer db.Close()
	var version string
	check(db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version))
	fmt.Printf("\n== mysql drain: %d messages, no-op handler, one relay beside the raw loop (seconds), %d rounds, server %s\n", *n, *rounds, version)
	table := mysqlBenchDB + ".outbox"
	fresh := func() *outbox.Outbox {
		for _, q := range []string{`DROP DATABASE IF EXISTS ` + mysqlBenchDB, `CREATE DATABASE ` + mysqlBenchDB} {
			_, err := db.ExecContext(ctx, q)
			check(err)
		}
		check(mysqldialect.Migrate(ctx, db, table))
		ob, err := outbox.New(mysqldialect.Dialect(), outbox.Config{Table: table})
		check(err)
		batch := make([]outbox.Message, 1000)
		for i := range batch {
			batch[i] = outbox.Message{Topic: "bench", Payload: []byte(`{"order_id":"0193a1f2","total_cents":4200}`)}
		}
		for left := *n; left > 0; left -= len(batch) {
			tx, err := db.BeginTx(ctx, nil)
			check(err)
			_, err = ob.PublishBatch(ctx, sqltx.From(tx), batch[:min(left, len(batch))])
			check(err)
			check(tx.Commit())
		}
		return ob
	}
	var rawSecs, relSecs, ratios []float64
	for round := 1; round <= *rounds; round++ {
		fresh()
		t0 := time.Now()
		mysqlRawDrain(ctx, db, table)
		raw := time.Since(t0).Seconds()
		mysqlLeft(ctx, db, table)

		ob := fresh()
		var done atomic.Int64
		finished := make(chan struct{})
		r, err := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{Logger: quiet, PollInterval: 20 * time.Millisecond})
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
		rel := time.Since(t0).Seconds()
		cancel()
		check(<-runDone)
		mysqlLeft(ctx, db, table)

		rawSecs, relSecs, ratios = append(rawSecs, raw), append(relSecs, rel), append(ratios, raw/rel)
		fmt.Printf("round %d raw-loop %.2fs (%.0f msg/s), relay %.2fs (%.0f msg/s), relay/raw throughput %.2fx\n",
			round, raw, float64(*n)/raw, rel, float64(*n)/rel, raw/rel)
	}
	fmt.Printf("median relay/raw throughput = %.2fx; ratio of medians = %.2fx (raw %.2fs, relay %.2fs)\n",
		median(ratios), median(rawSecs)/median(relSecs), median(rawSecs), median(relSecs))
	_, err := db.ExecContext(ctx, `DROP DATABASE IF EXISTS `+mysqlBenchDB)
	check(err)
}

// mysqlRawDrain drains table with the raw loop until a claim finds nothing.
func mysqlRawDrain(ctx context.Context, db *sql.DB, table string) {
	claim := `SELECT id, topic, payload FROM ` + table + `
WHERE claim_at <= UTC_TIMESTAMP(6) AND topic = 'bench'
ORDER BY claim_at, id LIMIT 100 FOR UPDATE SKIP LOCKED`
	for {
		tx, err := db.BeginTx(ctx, nil)
		check(err)
		rows, err := tx.QueryContext(ctx, claim)
		check(err)
		var ids []any
		for rows.Next() {
			var id, topic string
			var payload []byte
			check(rows.Scan(&id, &topic, &payload))
			ids = append(ids, id)
		}
		check(rows.Err())
		if len(ids) == 0 {
			check(tx.Commit())
			return
		}
		in := "(" + strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",") + ")"
		_, err = tx.ExecContext(ctx, `UPDATE `+table+` SET state = 'processing', attempts = attempts + 1,
available_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND WHERE id IN `+in, ids...)
		check(err)
		check(tx.Commit())
		_, err = db.ExecContext(ctx, `DELETE FROM `+table+` WHERE id IN `+in, ids...)
		check(err)
	}
}

// mysqlLeft fails the run when a drain left rows behind.
func mysqlLeft(ctx context.Context, db *sql.DB, table string) {
	var left int
	check(db.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&left))
	if left != 0 {
		check(fmt.Errorf("drain left %d rows", left))
	}
}

// openMySQL opens the -mysql server with interpolateParams=true (a bound
// statement is one round trip), for the MySQL scenarios.
func openMySQL() *sql.DB {
	cfg, err := mysql.ParseDSN(*mysqlDSN)
	check(err)
	cfg.InterpolateParams = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	check(err)
	return db
}
