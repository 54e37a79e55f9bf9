package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// recommendedDSN is the options the package documentation recommends.
const recommendedDSN = "?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"

// openFile opens the SQLite file path with the DSN options opts, migrated,
// closed when tb ends.
func openFile(tb testing.TB, path, opts string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("sqlite", "file:"+path+opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	if err := sqlite.Migrate(context.Background(), db, ""); err != nil {
		tb.Fatal(err)
	}
	return db
}

// readThenPublish runs publishers goroutines for d, each running
// transactions that read, publish, then commit, and returns the errors they
// met (at most one per transaction) and the number of commits.
func readThenPublish(t *testing.T, dsn string, publishers int, d time.Duration) (errs []error, commits int) {
	t.Helper()
	db := openFile(t, filepath.Join(t.TempDir(), "r.db"), dsn)
	ctx := context.Background()
	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	once := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM outbox WHERE topic = 'none'`).Scan(&n); err != nil {
			return err
		}
		if _, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "t", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		return tx.Commit()
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for range publishers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				err := once()
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					commits++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errs, commits
}

// TestReadThenPublish: eight publishers whose transactions read before they
// publish. With deferred transactions (no _txlock) SQLite answers
// SQLITE_BUSY at once, whatever the busy timeout, and Publish's error says
// so (sqlite.ErrBusy); with the recommended DSN (_txlock=immediate) each
// transaction waits for the write lock and none fails.
func TestReadThenPublish(t *testing.T) {
	t.Run("deferred", func(t *testing.T) {
		errs, commits := readThenPublish(t, "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)", 8, 2*time.Second)
		t.Logf("%d commits, %d errors", commits, len(errs))
		if len(errs) == 0 {
			t.Fatal("no transaction failed: the deferred transactions never conflicted")
		}
		for _, err := range errs {
			if !errors.Is(err, sqlite.ErrBusy) || !errors.Is(err, outbox.ErrRetryTx) {
				t.Fatalf("error not classified as sqlite.ErrBusy: %v", err)
			}
		}
	})
	t.Run("immediate", func(t *testing.T) {
		errs, commits := readThenPublish(t, recommendedDSN, 8, 2*time.Second)
		t.Logf("%d commits, %d errors", commits, len(errs))
		if commits == 0 {
			t.Fatal("nothing committed")
		}
		for i, err := range errs {
			if i == 5 {
				t.Fatalf("... %d errors in all", len(errs))
			}
			t.Errorf("transaction failed: %v", err)
		}
	})
}

// TestRelayStatementsWaitOutBusy: a claim, a renewal and a settle that meet
// SQLITE_BUSY after the busy timeout (50 ms here; another connection holds
// the write lock for 400 ms) run again and succeed once the lock is free;
// a claim whose context ends first fails with the context's error.
func TestRelayStatementsWaitOutBusy(t *testing.T) {
	ctx := context.Background()
	db := openFile(t, filepath.Join(t.TempDir(), "w.db"), "?_txlock=immediate&_pragma=busy_timeout(50)&_pragma=journal_mode(WAL)")
	ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{})
	publish(t, db, ob, outbox.Message{Topic: "t", Payload: []byte(`{}`)})
	d := sqlite.Dialect().(outboxdriver.RelayDialect)
	pool := sqltx.FromDB(db)
	p := outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5}

	// hold takes the write lock on a connection of its own and gives it up
	// after d.
	hold := func(d time.Duration) {
		t.Helper()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(d, func() {
			_, _ = conn.ExecContext(ctx, "COMMIT")
			conn.Close()
		})
	}

	hold(400 * time.Millisecond)
	short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	_, _, err := d.Claim(short, pool, outbox.Table{Name: "outbox"}, p)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("claim whose context ended while the lock was held: got %v, want an error wrapping context.DeadlineExceeded", err)
	}
	time.Sleep(300 * time.Millisecond) // the lock is free again

	hold(400 * time.Millisecond)
	claimed, _, err := d.Claim(ctx, pool, outbox.Table{Name: "outbox"}, p)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %d claimed, %v", len(claimed), err)
	}
	f := outboxdriver.Fence{ID: claimed[0].ID, Attempts: claimed[0].Attempts}

	hold(400 * time.Millisecond)
	kept, err := d.Renew(ctx, pool, outbox.Table{Name: "outbox"}, time.Minute, []outboxdriver.Fence{f})
	if err != nil || len(kept) != 1 {
		t.Fatalf("renew: %d kept, %v", len(kept), err)
	}

	hold(400 * time.Millisecond)
	applied, err := d.Settle(ctx, pool, outbox.Table{Name: "outbox"}, outboxdriver.SettleParams{}, []outboxdriver.Settlement{{Fence: f, Kind: outboxdriver.SettleDone}})
	if err != nil || len(applied) != 1 {
		t.Fatalf("settle: %d applied, %v", len(applied), err)
	}
	if n := count(t, db, "outbox"); n != 0 {
		t.Errorf("%d rows left after the settle", n)
	}
}
