package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// TestServerCrashMidDrain crash-restarts a throwaway PostgreSQL server
// (pg_ctl stop -m immediate: no shutdown checkpoint, as a power cut leaves
// the data directory) while a relay drains 3,000 committed messages, with
// and without RelayConfig.AsyncCommit, and checks that every message is
// delivered and the table ends empty: nothing lost, nothing stranded. It
// logs how many messages were delivered more than once (at least once
// allows it; with AsyncCommit the claims and settles of the server's last
// moments are lost too, which can add to them).
func TestServerCrashMidDrain(t *testing.T) {
	bin := pgBin(t)
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "sync", true: "async"}[async], func(t *testing.T) {
			srv := startThrowaway(t, bin)
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, srv.url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if _, err := pool.Exec(ctx, `CREATE SCHEMA app`); err != nil {
				t.Fatal(err)
			}
			db, err := sql.Open("pgx", srv.url)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := Migrate(ctx, db, "app.outbox"); err != nil {
				t.Fatal(err)
			}
			ob, err := outbox.New(Dialect(), outbox.Config{Table: "app.outbox"})
			if err != nil {
				t.Fatal(err)
			}
			const n, crashAt = 3000, 1000
			published := map[outbox.ID]bool{}
			for _, id := range publishN(t, pool, ob, n) {
				published[id] = true
			}

			var mu sync.Mutex
			seen := map[outbox.ID]int{}
			var count atomic.Int64
			crash := make(chan struct{})
			record := func(next outbox.Handler) outbox.Handler {
				return func(ctx context.Context, d outbox.Delivery) error {
					mu.Lock()
					seen[d.ID]++
					mu.Unlock()
					if count.Add(1) == crashAt {
						close(crash)
					}
					time.Sleep(200 * time.Microsecond) // handlers in flight at the crash
					return next(ctx, d)
				}
			}
			r, err := ob.Relay(pgxtx.FromPool(pool), outbox.RelayConfig{
				AsyncCommit: async, Lease: 2 * time.Second, PollInterval: 50 * time.Millisecond, BatchSize: 50,
				Middleware: []outbox.Middleware{record}, Logger: slog.New(slog.DiscardHandler),
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Handle("t", func(context.Context, outbox.Delivery) error { return nil }); err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.Run(rctx) }()

			<-crash
			srv.ctl(t, "stop", "-m", "immediate")
			time.Sleep(500 * time.Millisecond)
			srv.ctl(t, "start", "-w", "-l", filepath.Join(srv.dir, "log"), "-o", srv.opts)

			deadline := time.Now().Add(90 * time.Second)
			for {
				var left int
				err := pool.QueryRow(ctx, `SELECT count(*) FROM app.outbox`).Scan(&left)
				mu.Lock()
				got := len(seen)
				mu.Unlock()
				if err == nil && left == 0 && got == n {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after 90 s: %d of %d messages delivered, %d rows left (%v)", got, n, left, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			twice := 0
			for id, k := range seen {
				if !published[id] {
					t.Errorf("delivered %v, never published", id)
				}
				if k > 1 {
					twice++
				}
			}
			t.Logf("async %v: %d messages, server crash-restarted after %d deliveries: lost 0, delivered more than once %d", async, n, crashAt, twice)
		})
	}
}

// throwaway is a PostgreSQL server of the test's own, in a temporary data
// directory, owned by the postgres user.
type throwaway struct {
	bin, dir, opts, url string
}

// pgBin returns the directory of the server's binaries (initdb, pg_ctl);
// the test is recorded as skipped without them.
func pgBin(t *testing.T) string {
	t.Helper()
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(matches) == 0 {
		pgtest.Unavailable(t, "no pg_ctl under /usr/lib/postgresql/*/bin for a throwaway server")
	}
	if _, err := osexec.LookPath("runuser"); err != nil && os.Geteuid() == 0 {
		pgtest.Unavailable(t, "running as root without runuser: cannot start a throwaway server as postgres")
	}
	return filepath.Dir(matches[len(matches)-1])
}

// startThrowaway initialises and starts a server on a free port, with
// settings conf ("name=value"), stopped (immediately) when t ends.
func startThrowaway(t *testing.T, bin string, conf ...string) *throwaway {
	t.Helper()
	dir, err := os.MkdirTemp("", "oncommit-crash-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		if out, err := osexec.Command("chown", "postgres:", dir).CombinedOutput(); err != nil {
			t.Fatalf("chown: %v: %s", err, out)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &throwaway{bin: bin, dir: dir,
		opts: fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on", port, dir),
		url:  "postgres://postgres@127.0.0.1:" + strconv.Itoa(port) + "/postgres?sslmode=disable"}
	for _, c := range conf {
		s.opts += " -c " + c
	}
	s.run(t, "initdb", "-D", filepath.Join(dir, "data"), "-A", "trust", "-U", "postgres", "--no-sync")
	s.ctl(t, "start", "-w", "-l", filepath.Join(dir, "log"), "-o", s.opts)
	t.Cleanup(func() { _ = s.command("pg_ctl", "-D", filepath.Join(dir, "data"), "stop", "-m", "immediate").Run() })
	return s
}

// ctl runs pg_ctl on the server's data directory.
func (s *throwaway) ctl(t *testing.T, args ...string) {
	t.Helper()
	s.run(t, "pg_ctl", append([]string{"-D", filepath.Join(s.dir, "data")}, args...)...)
}

func (s *throwaway) run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := s.command(name, args...).CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		t.Fatalf("%s %v: %v\n%s\n%s", name, args, err, out, log)
	}
}

// command is the server binary name with args, run as postgres when the
// test runs as root (initdb and the server refuse root).
func (s *throwaway) command(name string, args ...string) *osexec.Cmd {
	path := filepath.Join(s.bin, name)
	if os.Geteuid() == 0 {
		return osexec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return osexec.Command(path, args...)
}
