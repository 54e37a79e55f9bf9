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
)

// recommendedDSN is the options the package documentation recommends.
const recommendedDSN = "?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"

// readThenPublish runs publishers goroutines for d, each running
// transactions that read, publish, then commit, and returns the errors they
// met (at most one per transaction) and the number of commits.
func readThenPublish(t *testing.T, dsn string, publishers int, d time.Duration) (errs []error, commits int) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "r.db")+dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := sqlite.Migrate(ctx, db, ""); err != nil {
		t.Fatal(err)
	}
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
			if !errors.Is(err, sqlite.ErrBusy) {
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
