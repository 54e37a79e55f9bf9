package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/oncommit/oncommit/adapters/sqltx"
	mysqldialect "github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// binary is the oncommit binary the tests run, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "oncommit-cli")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "oncommit")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// db is one database the CLI runs against: its DSN for --dsn, the table
// for --table, and a pool for the test's own setup.
type db struct {
	name, dsn, table string
	pool             *sql.DB
	dialect          outbox.Dialect
}

func sqliteDB(t *testing.T) db {
	path := filepath.Join(t.TempDir(), "app.db")
	dsn := "file:" + path
	pool, err := sql.Open("sqlite", dsn+"?_pragma=busy_timeout(5000)&_txlock=immediate&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	k, _, _ := kindOf(dsn, "")
	if k != "sqlite" {
		t.Fatalf("%s read as %s", dsn, k)
	}
	return db{name: "sqlite", dsn: dsn, table: "outbox", pool: pool}
}

// sqliteOutbox returns a migrated SQLite database and an Outbox of its
// table.
func sqliteOutbox(t *testing.T) (db, *outbox.Outbox) {
	d := sqliteDB(t)
	d.dialect = sqlite.Dialect()
	d.ok(t, 0, "migrate", "up")
	ob, err := outbox.New(d.dialect, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return d, ob
}

// eachDB runs f, in parallel, on a fresh database of each kind: SQLite,
// PostgreSQL and MySQL/MariaDB, with its dialect.
func eachDB(t *testing.T, f func(t *testing.T, d db)) {
	for _, k := range dbKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f(t, k.open(t))
		})
	}
}

// dbKinds are the database kinds the CLI runs against; open returns a
// fresh database of the kind with its dialect.
var dbKinds = []struct {
	name string
	open func(t *testing.T) db
}{
	{"sqlite", func(t *testing.T) db { d := sqliteDB(t); d.dialect = sqlite.Dialect(); return d }},
	{"postgres", func(t *testing.T) db { d := postgresDB(t); d.dialect = postgres.Dialect(); return d }},
	{"mysql", func(t *testing.T) db { d := mysqlDB(t); d.dialect = mysqldialect.Dialect(); return d }},
}

func postgresDB(t *testing.T) db {
	url := pgtest.URL(t)
	schema := pgtest.Schema(t)
	pool := pgtest.Open(t, "pgx")
	return db{name: "postgres", dsn: url, table: schema + ".outbox", pool: pool}
}

// mysqlDB creates a fresh database on the local MariaDB/MySQL server
// (OUTBOX_TEST_MYSQL_DSN, else root@tcp(127.0.0.1:3306)/test).
func mysqlDB(t *testing.T) db {
	base := os.Getenv("OUTBOX_TEST_MYSQL_DSN")
	if base == "" {
		base = "root@tcp(127.0.0.1:3306)/test"
	}
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = admin.PingContext(ctx)
		cancel()
	}
	if err != nil {
		pgtest.Unavailable(t, fmt.Sprintf("no MySQL/MariaDB at %s: %v", base, err))
	}
	t.Cleanup(func() { admin.Close() })
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec("CREATE DATABASE " + name + " CHARACTER SET utf8mb4"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE " + name) })
	cfg.DBName = name
	pool, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return db{name: "mysql", dsn: cfg.FormatDSN(), table: "outbox", pool: pool}
}

// run runs the binary with args and the database's --dsn and --table, and
// returns its stdout, stderr and exit code (-1 when it ran for a minute
// and was killed).
func (d db) run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	args = append(args, "--dsn", d.dsn, "--table", d.table)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), "OUTBOX_DSN=", "DATABASE_URL=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// ok runs the binary and fails t unless it exits with want.
func (d db) ok(t *testing.T, want int, args ...string) string {
	t.Helper()
	out, errs, code := d.run(t, args...)
	if code != want {
		t.Fatalf("oncommit %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, errs)
	}
	return out
}

// lines parses one JSON object per line.
func lines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var o map[string]any
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatalf("not a JSON object: %q: %v", l, err)
		}
		objs = append(objs, o)
	}
	return objs
}

// seed publishes msgs through the library on d's pool.
func (d db) seed(t *testing.T, ob *outbox.Outbox, msgs ...outbox.Message) []outbox.Result {
	t.Helper()
	ctx := context.Background()
	tx, err := d.pool.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ob.PublishBatch(ctx, sqltx.From(tx), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return res
}

// failAll runs a relay whose handler of topic fails, with one attempt,
// until n messages are dead.
func failAll(t *testing.T, ob *outbox.Outbox, pool *sql.DB, topic string, n int64) {
	t.Helper()
	r, err := ob.Relay(sqltx.FromDB(pool), outbox.RelayConfig{MaxAttempts: 1, PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Handle(topic, func(ctx context.Context, d outbox.Delivery) error {
		return errors.New("smtp: connection refused <b>")
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := ob.Count(context.Background(), sqltx.FromDB(pool), outbox.Filter{States: []outbox.State{outbox.StateDead}, Topic: topic})
		if err == nil && c >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("messages of %s not dead in time: %d, %v", topic, c, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func sqlDB(d db) outbox.DB { return sqltx.FromDB(d.pool) }
