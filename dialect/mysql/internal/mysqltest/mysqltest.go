// Package mysqltest gives each test its own database on a real MySQL or
// MariaDB server.
//
// The server comes from OUTBOX_TEST_MYSQL_DSN (a go-sql-driver/mysql DSN);
// else the local default root@tcp(127.0.0.1:3306)/test; else the test is
// skipped with a message saying how to provide one. Under CI=true a missing
// server fails the test instead, and every skip is appended to
// OUTBOX_TEST_SKIPLOG (see pgtest.Unavailable), so CI fails when any
// database-backed test skipped.
package mysqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/oncommit/oncommit/internal/pgtest"
)

// DefaultDSN is the local server tried when OUTBOX_TEST_MYSQL_DSN is unset.
const DefaultDSN = "root@tcp(127.0.0.1:3306)/test"

var (
	once  sync.Once
	base  string
	why   string
	admin *sql.DB
)

func find() {
	dsn, from := os.Getenv("OUTBOX_TEST_MYSQL_DSN"), "OUTBOX_TEST_MYSQL_DSN="
	if dsn == "" {
		dsn, from = DefaultDSN, "the default DSN "
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		why = fmt.Sprintf("%s%s: %v", from, dsn, err)
		return
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 3 * time.Second
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
	}
	if err != nil {
		why = fmt.Sprintf("no MySQL/MariaDB: %s%s does not answer (%v); start the server or set OUTBOX_TEST_MYSQL_DSN", from, dsn, err)
		return
	}
	base, admin = cfg.FormatDSN(), db
}

// DSN returns the server's DSN, or skips (fails under CI=true) the test.
func DSN(t testing.TB) string {
	t.Helper()
	once.Do(find)
	if base == "" {
		pgtest.Unavailable(t, why)
	}
	return base
}

// Admin returns the shared administrative *sql.DB.
func Admin(t testing.TB) *sql.DB {
	t.Helper()
	DSN(t)
	return admin
}

// Database creates a fresh, empty database for t and drops it when t ends.
func Database(t testing.TB) string {
	t.Helper()
	DSN(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec("CREATE DATABASE " + name + " CHARACTER SET utf8mb4"); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE " + name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return name
}

// Open returns a new pool on the server, closed when t ends. edit, when not
// nil, changes the DSN's settings first.
func Open(t testing.TB, edit func(*mysql.Config)) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
