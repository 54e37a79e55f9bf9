package mysql_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// TestTextComparedExactly: topics and dedup keys that differ only by
// trailing spaces are different, as they are on PostgreSQL and SQLite.
// utf8mb4_bin is a PAD SPACE collation on MariaDB and MySQL ('k' = 'k '),
// so a UNIQUE index on such a column took "k " for a duplicate of "k" (the
// message was dropped and reported Duplicate), a relay of topic "t" claimed
// messages of "t ", redrive of "t" revived "t ", and stats merged them.
func TestTextComparedExactly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	ctx := context.Background()
	d := mysql.Dialect().(outboxdriver.RelayDialect)
	db := sqltx.FromDB(e.pool)

	tx := e.begin(t)
	res, err := e.ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{
		{Topic: "t", DedupKey: "k"}, {Topic: "t ", DedupKey: "k "}, {Topic: "t  ", DedupKey: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if res[0].Duplicate || res[1].Duplicate || !res[2].Duplicate {
		t.Fatalf("results %+v, want stored, stored (\"k \" is not \"k\"), duplicate", res)
	}
	if n := count(t, e.table, ""); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}

	st, err := d.Stats(ctx, db, e.ob.Table())
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].Topic != "t" || st[0].Pending != 1 || st[1].Topic != "t " || st[1].Pending != 1 {
		t.Errorf("stats %+v, want one pending message for each of \"t\" and \"t \"", st)
	}

	p := outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: time.Minute, MaxAttempts: 1}
	cs, _, err := d.Claim(ctx, db, e.ob.Table(), p)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].ID != res[0].ID || cs[0].Topic != "t" {
		t.Fatalf("a claim of topic \"t\" took %+v, want only %s", cs, res[0].ID)
	}
	// Both dead: the next claims dead-letter them (max attempts 1).
	if _, err := e.pool.Exec(`UPDATE ` + e.table + ` SET available_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, attempts = 1`); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"t", "t "} {
		p.Topics = []string{topic}
		if cs, _, err := d.Claim(ctx, db, e.ob.Table(), p); err != nil || len(cs) != 1 || !cs[0].Dead || cs[0].Topic != topic {
			t.Fatalf("claim of %q: %+v %v, want its one message dead-lettered", topic, cs, err)
		}
	}
	if n, err := d.Redrive(ctx, db, e.ob.Table(), "t"); err != nil || n != 1 {
		t.Errorf("redrive of \"t\" revived %d, %v; want 1", n, err)
	}
	if n := count(t, e.table, `state = 'dead'`); n != 1 {
		t.Errorf("%d dead rows after redriving \"t\", want 1 (the message of \"t \")", n)
	}
}

// TestDedupFirstCopyRollsBack pins a limit of InnoDB that docs/dialects.md
// states: publishers of a dedup key whose first copy is uncommitted wait
// for it; when it rolls back, each waiter holds a gap lock from its
// duplicate check and needs an insert intention lock in that gap, so InnoDB
// breaks the cycle by rolling back all but one (1213, ErrTxAborted, the
// whole business transaction). No message is lost or doubled: exactly one
// waiter stores the key and commits; each other one gets ErrTxAborted.
func TestDedupFirstCopyRollsBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	ctx := context.Background()
	first := e.begin(t)
	if _, err := e.ob.Publish(ctx, sqltx.From(first), outbox.Message{Topic: "x", DedupKey: "k"}); err != nil {
		t.Fatal(err)
	}
	const waiters = 4
	type result struct {
		stored bool
		err    error
	}
	results := make(chan result, waiters)
	for i := range waiters {
		tx := e.begin(t)
		go func() {
			if _, err := tx.Exec(`INSERT INTO `+e.orders+` (id) VALUES (?)`, fmt.Sprint("w", i)); err != nil {
				results <- result{err: err}
				return
			}
			r, err := e.ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "x", DedupKey: "k"})
			if err == nil {
				err = tx.Commit()
			}
			results <- result{stored: err == nil && !r.Duplicate, err: err}
		}()
	}
	for i := 0; lockWaits(t, e.db) < waiters; i++ {
		if i == 50 {
			t.Fatal("the publishers never waited for the first copy")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := first.Rollback(); err != nil {
		t.Fatal(err)
	}
	stored, aborted := 0, 0
	for range waiters {
		r := <-results
		switch {
		case r.stored:
			stored++
		case errors.Is(r.err, outbox.ErrTxAborted) && errors.Is(r.err, outbox.ErrRetryTx):
			aborted++
		default:
			t.Errorf("waiter: stored %v, %v; want the key stored or ErrTxAborted and ErrRetryTx", r.stored, r.err)
		}
	}
	if stored != 1 || count(t, e.table, "") != 1 || count(t, e.orders, "") != 1 {
		t.Errorf("%d waiters stored the key, %d rows, %d business rows; want 1, 1, 1", stored, count(t, e.table, ""), count(t, e.orders, ""))
	}
	t.Logf("after the first copy rolled back: %d of %d waiters stored it, %d were deadlock victims", stored, waiters, aborted)
}

// TestDuplicateLocksFirstCopy pins another limit docs/dialects.md states:
// a duplicate publish locks the stored copy until the duplicate's
// transaction ends (INSERT ... ON DUPLICATE KEY UPDATE takes an exclusive
// lock on the row it finds). Claims skip the copy meanwhile, and a settle
// of it waits; once the transaction ends both go through.
func TestDuplicateLocksFirstCopy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	ctx := context.Background()
	d := mysql.Dialect().(outboxdriver.RelayDialect)
	db := sqltx.FromDB(e.pool)
	ids := e.publish(t, outbox.Message{Topic: "x", DedupKey: "k"})
	p := outboxdriver.ClaimParams{Topics: []string{"x"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5}

	dup := e.begin(t)
	if r, err := e.ob.Publish(ctx, sqltx.From(dup), outbox.Message{Topic: "x", DedupKey: "k"}); err != nil || !r.Duplicate {
		t.Fatalf("duplicate publish: %+v %v", r, err)
	}
	if cs, _, err := d.Claim(ctx, db, e.ob.Table(), p); err != nil || len(cs) != 0 {
		t.Errorf("claim while the duplicate's transaction is open: %v %v, want nothing (the copy is locked)", cs, err)
	}
	if err := dup.Rollback(); err != nil {
		t.Fatal(err)
	}
	if cs, _, err := d.Claim(ctx, db, e.ob.Table(), p); err != nil || len(cs) != 1 {
		t.Fatalf("claim after: %v %v", cs, err)
	}

	dup = e.begin(t)
	if r, err := e.ob.Publish(ctx, sqltx.From(dup), outbox.Message{Topic: "x", DedupKey: "k"}); err != nil || !r.Duplicate {
		t.Fatalf("duplicate publish: %+v %v", r, err)
	}
	done := []outboxdriver.Settlement{{Fence: outboxdriver.Fence{ID: ids[0], Attempts: 1}, Kind: outboxdriver.SettleDone}}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := d.Settle(short, db, e.ob.Table(), outboxdriver.SettleParams{}, done); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("settle while the duplicate's transaction is open: %v, want it to wait", err)
	}
	if err := dup.Commit(); err != nil {
		t.Fatal(err)
	}
	if applied, err := d.Settle(ctx, db, e.ob.Table(), outboxdriver.SettleParams{}, done); err != nil || len(applied) != 1 {
		t.Errorf("settle after: %v %v", applied, err)
	}
}
