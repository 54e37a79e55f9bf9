// Package pgtest gives each test its own schema on a real PostgreSQL server.
//
// The server comes from OUTBOX_TEST_POSTGRES_URL; else the local default
// postgres://postgres@127.0.0.1:5432/test; else a container started through
// ory/dockertest when a Docker engine answers (run as a separate program,
// internal/dockerdb, a module of its own); else the test is skipped with a
// message saying how to provide one. Under CI=true a missing server fails the
// test instead.
//
// [BouncerURL] gives the URL of a PgBouncer in transaction pooling mode in
// front of that server (OUTBOX_TEST_PGBOUNCER_URL, else the local default
// that .ci/pgbouncer starts), skipped or failed the same way when it does
// not answer. Schemas are still created on the server directly. When OUTBOX_TEST_SKIPLOG names a file, every such skip is also
// appended to it, so CI can fail when any database-backed test skipped.
package pgtest

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "github.com/lib/pq"              // registers "postgres"
)

// DefaultURL is the local server tried when OUTBOX_TEST_POSTGRES_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DefaultBouncerURL is the local PgBouncer tried when
// OUTBOX_TEST_PGBOUNCER_URL is unset: the one .ci/pgbouncer starts, in
// transaction pooling mode in front of DefaultURL's server.
const DefaultBouncerURL = "postgres://postgres@127.0.0.1:6432/test?sslmode=disable"

var (
	bouncerOnce sync.Once
	bouncerURL  string
	bouncerWhy  string
)

// BouncerURL returns the URL of a PgBouncer in transaction pooling mode in
// front of the server [URL] returns (the same database, so the schemas
// [Schema] creates are visible through it), or skips (fails under CI=true)
// the test when it does not answer.
func BouncerURL(t testing.TB) string {
	t.Helper()
	URL(t)
	bouncerOnce.Do(func() {
		u, from := os.Getenv("OUTBOX_TEST_PGBOUNCER_URL"), "OUTBOX_TEST_PGBOUNCER_URL="
		if u == "" {
			u, from = DefaultBouncerURL, ""
		}
		db, err := ping(u)
		if err != nil {
			bouncerWhy = fmt.Sprintf("no PgBouncer: %s%s does not answer (%v); run .ci/pgbouncer or set OUTBOX_TEST_PGBOUNCER_URL", from, u, err)
			return
		}
		db.Close()
		bouncerURL = u
	})
	if bouncerURL == "" {
		Unavailable(t, bouncerWhy)
	}
	return bouncerURL
}

var (
	once    sync.Once
	baseURL string
	why     string
	admin   *sql.DB
)

func ping(url string) (*sql.DB, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

func find() {
	if u := os.Getenv("OUTBOX_TEST_POSTGRES_URL"); u != "" {
		db, err := ping(u)
		if err != nil {
			why = fmt.Sprintf("OUTBOX_TEST_POSTGRES_URL=%s does not answer: %v", u, err)
			return
		}
		baseURL, admin = u, db
		return
	}
	db, err := ping(DefaultURL)
	if err == nil {
		baseURL, admin = DefaultURL, db
		return
	}
	local := err
	u, err := fromDocker()
	if err != nil {
		why = fmt.Sprintf("no PostgreSQL: %s does not answer (%v) and no Docker engine (%v); set OUTBOX_TEST_POSTGRES_URL", DefaultURL, local, err)
		return
	}
	if db, err = ping(u); err != nil {
		why = fmt.Sprintf("PostgreSQL container does not answer: %v", err)
		return
	}
	baseURL, admin = u, db
}

// dockerdb keeps the fallback's process (and so its container) alive for
// as long as the test binary runs: its standard input closes when the
// binary exits.
var dockerdb []io.WriteCloser

// fromDocker starts postgres:15 through ory/dockertest when an engine
// answers, by running internal/dockerdb, a module of its own, so that the
// library's module graph carries no Docker client: the harness needs the
// source tree and the go command for this fallback, as it runs tests.
func fromDocker() (string, error) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate internal/dockerdb")
	}
	cmd := exec.Command("go", "run", ".", "postgres")
	cmd.Dir = filepath.Join(filepath.Dir(self), "..", "dockerdb")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return "", err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Wait()
		return "", fmt.Errorf("dockertest fallback (internal/dockerdb) gave no server: %w", err)
	}
	dockerdb = append(dockerdb, in)
	return strings.TrimSpace(line), nil
}

// URL returns the server's URL, or skips (fails under CI=true) the test.
func URL(t testing.TB) string {
	t.Helper()
	once.Do(find)
	if baseURL == "" {
		Unavailable(t, why)
	}
	return baseURL
}

// Unavailable skips t because a database server is missing, or fails it
// under CI=true, and records the skip in OUTBOX_TEST_SKIPLOG.
func Unavailable(t testing.TB, reason string) {
	t.Helper()
	if f := os.Getenv("OUTBOX_TEST_SKIPLOG"); f != "" {
		if fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintf(fh, "%s: %s\n", t.Name(), reason)
			fh.Close()
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("database required under CI=true: %s", reason)
	}
	t.Skip(reason)
}

// Schema creates a fresh, empty schema for t and drops it when t ends.
func Schema(t testing.TB) string {
	t.Helper()
	URL(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(`CREATE SCHEMA ` + name); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(`DROP SCHEMA ` + name + ` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// Open returns a *sql.DB on the server through driver "postgres" (lib/pq)
// or "pgx" (pgx stdlib), closed when t ends.
func Open(t testing.TB, driver string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Pool returns a pgxpool.Pool on the server, closed when t ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Admin returns the shared administrative *sql.DB (pgx stdlib).
func Admin(t testing.TB) *sql.DB {
	t.Helper()
	URL(t)
	return admin
}

// WALURL returns the URL of the PostgreSQL cluster with wal_level=logical
// that .ci/walcluster starts (OUTBOX_TEST_WAL_URL, else port 5433), for
// the WAL transport's tests, or skips (fails under CI=true) the test.
func WALURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("OUTBOX_TEST_WAL_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5433/test?sslmode=disable"
	}
	db, err := ping(url)
	if err != nil {
		Unavailable(t, "no PostgreSQL with wal_level=logical at "+url+" (bash .ci/walcluster): "+err.Error())
	}
	db.Close()
	return url
}
