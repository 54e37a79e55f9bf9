package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outbox"
	_ "modernc.org/sqlite"
)

func open(t *testing.T) (*sql.DB, *outbox.Outbox) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := sql.Open("sqlite", "file:"+path+dsnOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	if err := sqlite.Migrate(ctx, db, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return db, ob
}

func count(t *testing.T, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM `+q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPublishAtomicity(t *testing.T) {
	db, ob := open(t)
	ctx := context.Background()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`INSERT INTO orders (id) VALUES ('kept')`); err != nil {
		t.Fatal(err)
	}
	res, err := ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{
		{Topic: "order.placed", Key: "kept", Payload: []byte(`{"n":1}`), Headers: map[string]string{"a": "b"}},
		{Topic: "order.placed", Delay: time.Hour},
		{Topic: "order.placed", NotBefore: time.Now().Add(48 * time.Hour)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if n := count(t, db, `outbox WHERE id = ? AND state = 'pending'`, r.ID.String()); n != 1 {
			t.Errorf("id %s stored %d times", r.ID, n)
		}
	}
	if n := count(t, db, `outbox WHERE id = ? AND available_at - created_at BETWEEN 3599000 AND 3601000`, res[1].ID.String()); n != 1 {
		t.Error("delay not scheduled on the database clock")
	}
	if n := count(t, db, `outbox WHERE id = ? AND available_at > created_at + 47*3600000`, res[2].ID.String()); n != 1 {
		t.Error("NotBefore not stored")
	}

	tx, err = db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.placed", Key: "dropped"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `outbox`); n != 3 {
		t.Errorf("%d messages, want 3", n)
	}
	if _, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "t"}); !errors.Is(err, outbox.ErrTxDone) {
		t.Errorf("finished transaction: %v", err)
	}
}

func TestDedupAndBadInput(t *testing.T) {
	db, ob := open(t)
	ctx := context.Background()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	msg := outbox.Message{Topic: "x", DedupKey: "k"}
	first, err := ob.Publish(ctx, sqltx.From(tx), msg)
	if err != nil || first.Duplicate {
		t.Fatalf("%+v %v", first, err)
	}
	second, err := ob.Publish(ctx, sqltx.From(tx), msg)
	if err != nil || !second.Duplicate {
		t.Fatalf("%+v %v", second, err)
	}
	for _, bad := range []outbox.Message{{}, {Topic: "t", Payload: []byte("{")}, {Topic: "t", Delay: -1}} {
		if _, err := ob.Publish(ctx, sqltx.From(tx), bad); !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if _, err := tx.Exec(`INSERT INTO orders (id) VALUES ('survivor')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if count(t, db, `outbox`) != 1 || count(t, db, `orders`) != 1 {
		t.Error("want one message and one order")
	}
	if _, err := outbox.New(sqlite.Dialect(), outbox.Config{Notify: outbox.NotifyOn}); !errors.Is(err, outbox.ErrUnsupported) {
		t.Errorf("NotifyOn on SQLite: %v", err)
	}
}

// TestMigrateConcurrent opens a new file from four connections at once, 20
// times: SQLite may refuse one of them with SQLITE_BUSY without waiting
// (before Migrate started over on it, about one file in thirteen failed).
func TestMigrateConcurrent(t *testing.T) {
	for i := range 20 {
		migrateConcurrent(t, filepath.Join(t.TempDir(), fmt.Sprintf("m%d.db", i)))
	}
}

func migrateConcurrent(t *testing.T, path string) {
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := sql.Open("sqlite", "file:"+path+dsnOpts)
			if err != nil {
				errs <- err
				return
			}
			defer db.Close()
			errs <- sqlite.Migrate(context.Background(), db, "events_outbox")
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	db, _ := sql.Open("sqlite", "file:"+path)
	defer db.Close()
	migs, err := migrations.Load(migrations.SQLite(), "outbox")
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `oncommit_migrations WHERE table_name = 'events_outbox'`); n != len(migs) {
		t.Errorf("%d migration records, want %d (one per migration)", n, len(migs))
	}
	if n := count(t, db, `sqlite_master WHERE name IN ('events_outbox_claim_idx', 'events_outbox_dedup_idx')`); n != 2 {
		t.Errorf("%d indexes", n)
	}
	if err := sqlite.Migrate(context.Background(), db, "main.outbox"); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("qualified table: %v", err)
	}
}
