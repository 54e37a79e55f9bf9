package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	mysqldialect "github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/outbox"
)

var heldWALLimit = flag.Int64("held-wal-limit", 0, "held-sqlite: PRAGMA journal_size_limit in bytes on every connection (0: SQLite's default, no limit)")

// heldPoll is the relays' poll interval in the MariaDB and SQLite held
// scenarios: neither dialect has a wake-up from the database, and with the
// default second the latency would be the poll's.
const heldPoll = 20 * time.Millisecond

// sqlHeldTarget is a heldTarget publishing through ob on db, one relay on
// db (the defaults but PollInterval heldPoll) consuming.
func sqlHeldTarget(name string, db *sql.DB, ob *outbox.Outbox) heldTarget {
	return heldTarget{
		name: name,
		publish: func(ctx context.Context, seq int64) {
			tx, err := db.BeginTx(ctx, nil)
			check(err)
			_, err = ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "bench", Key: "0193a1f2", Payload: payload(seq)})
			check(err)
			check(tx.Commit())
		},
		consume: func(ctx context.Context, onMsg func(int64)) func() {
			r, err := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{Logger: quiet, PollInterval: heldPoll})
			check(err)
			check(r.Handle("bench", func(_ context.Context, d outbox.Delivery) error {
				onMsg(seqOf(d.Payload))
				return nil
			}))
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(rctx) }()
			return func() { cancel(); check(<-done) }
		},
	}
}

// heldMySQL is the held scenario on MariaDB/MySQL (-only held-mysql): the
// snapshot is a START TRANSACTION WITH CONSISTENT SNAPSHOT that has read
// another table, and the pressure column is InnoDB's history list length
// (undo logs purge cannot remove while the snapshot is open). Size is the
// table's tablespace file.
//
//	cd bench && go run . -only held-mysql -held-steady 1m -held-for 5m -held-after 30s
func heldMySQL(ctx context.Context) {
	db := openMySQL()
	defer db.Close()
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	var version string
	check(db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version))
	for _, q := range []string{`DROP DATABASE IF EXISTS ` + mysqlBenchDB, `CREATE DATABASE ` + mysqlBenchDB,
		`CREATE TABLE ` + mysqlBenchDB + `.held_other (n int)`, `INSERT INTO ` + mysqlBenchDB + `.held_other VALUES (1)`} {
		_, err := db.ExecContext(ctx, q)
		check(err)
	}
	table := mysqlBenchDB + ".outbox"
	check(mysqldialect.Migrate(ctx, db, table))
	ob, err := outbox.New(mysqldialect.Dialect(), outbox.Config{Table: table})
	check(err)
	t := sqlHeldTarget("oncommit-mysql ("+version+")", db, ob)
	t.hold = func(ctx context.Context) func() {
		c, err := db.Conn(ctx)
		check(err)
		_, err = c.ExecContext(ctx, `START TRANSACTION WITH CONSISTENT SNAPSHOT`)
		check(err)
		_, err = c.ExecContext(ctx, `SELECT count(*) FROM `+mysqlBenchDB+`.held_other`)
		check(err)
		return func() {
			_, err := c.ExecContext(ctx, `ROLLBACK`)
			check(err)
			check(c.Close())
		}
	}
	t.measure = func(ctx context.Context) (history, size int64) {
		check(db.QueryRowContext(ctx, `SELECT count FROM information_schema.INNODB_METRICS WHERE name = 'trx_rseg_history_len'`).Scan(&history))
		check(db.QueryRowContext(ctx, `SELECT coalesce(sum(allocated_size), 0) DIV 1024 FROM information_schema.INNODB_SYS_TABLESPACES WHERE name = ?`, mysqlBenchDB+"/outbox").Scan(&size))
		return history, size
	}
	t.pressure = "history"
	runHeld(ctx, t)
	_, err = db.ExecContext(ctx, `DROP DATABASE IF EXISTS `+mysqlBenchDB)
	check(err)
}

// heldSQLite is the held scenario on a SQLite file in WAL mode (-only
// held-sqlite): the snapshot is a read transaction on a connection of its
// own, which keeps checkpoints from going past it, and the pressure column
// is the WAL file's size in kB. Size is the database file's. With
// -held-wal-limit, every connection sets journal_size_limit: a checkpoint
// that resets the WAL truncates it to that size.
//
//	cd bench && go run . -only held-sqlite -held-steady 1m -held-for 5m -held-after 30s
func heldSQLite(ctx context.Context) {
	dir, err := os.MkdirTemp("", "oncommit-bench-held-")
	check(err)
	defer os.RemoveAll(dir)
	var more []string
	if *heldWALLimit > 0 {
		more = append(more, fmt.Sprintf("&_pragma=journal_size_limit(%d)", *heldWALLimit))
	}
	db, ob := sqliteFile(ctx, dir, "held", more...)
	defer db.Close()
	_, err = db.ExecContext(ctx, `CREATE TABLE held_other (n int); INSERT INTO held_other VALUES (1)`)
	check(err)
	path := filepath.Join(dir, "held.db")
	t := sqlHeldTarget("oncommit-sqlite", db, ob)
	t.hold = func(ctx context.Context) func() {
		c, err := db.Conn(ctx)
		check(err)
		_, err = c.ExecContext(ctx, `BEGIN`)
		check(err)
		var k int
		check(c.QueryRowContext(ctx, `SELECT count(*) FROM held_other`).Scan(&k))
		return func() {
			_, err := c.ExecContext(ctx, `ROLLBACK`)
			check(err)
			check(c.Close())
		}
	}
	t.measure = func(context.Context) (walKB, size int64) {
		return fileKB(path + "-wal"), fileKB(path)
	}
	t.pressure = "wal kB"
	runHeld(ctx, t)
}

// fileKB is the size of the file at path in kB, 0 when there is none.
func fileKB(path string) int64 {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0
	}
	check(err)
	return fi.Size() / 1024
}
