package dialecttest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// inboxCases prove the inbox on a store whose Inbox table is migrated.
var inboxCases = []envCase{
	{"InboxNewThenRepeat", inboxNewThenRepeat},
	{"InboxTwoConsumers", inboxTwoConsumers},
	{"InboxRollbackForgets", inboxRollbackForgets},
	{"InboxConcurrentCommit", func(t *testing.T, e *env) { inboxConcurrent(t, e, true) }},
	{"InboxConcurrentRollback", func(t *testing.T, e *env) { inboxConcurrent(t, e, false) }},
	{"InboxBadInput", inboxBadInput},
	{"InboxPurgeAndStats", inboxPurgeAndStats},
	{"InboxReceive", inboxReceive},
	{"InboxHandlerRedelivered", inboxHandlerRedelivered},
}

func (e *env) inbox(t *testing.T, cfg outbox.InboxConfig) *outbox.Inbox {
	t.Helper()
	if e.Inbox == "" {
		t.Fatal("the harness migrated no inbox table (Store.Inbox)")
	}
	cfg.Table = e.Inbox
	ib, err := outbox.NewInbox(e.h.Dialect, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

// record records (consumer, id) in a transaction of its own, committed
// when commit is true, and returns whether it was new.
func (e *env) record(t *testing.T, ib *outbox.Inbox, consumer, id string, commit bool) bool {
	t.Helper()
	tx := e.Begin(t)
	fresh, err := ib.Record(context.Background(), tx.Tx, consumer, id)
	if err != nil {
		t.Fatalf("record %s/%s: %v", consumer, id, err)
	}
	end := tx.Rollback
	if commit {
		end = tx.Commit
	}
	if err := end(); err != nil {
		t.Fatal(err)
	}
	return fresh
}

func inboxNewThenRepeat(t *testing.T, e *env) {
	ib := e.inbox(t, outbox.InboxConfig{})
	if !e.record(t, ib, "billing", "m-1", true) {
		t.Fatal("first record of m-1: not new")
	}
	if e.record(t, ib, "billing", "m-1", true) {
		t.Fatal("second record of m-1: new again")
	}
	if !e.record(t, ib, "billing", "m-2", true) {
		t.Fatal("m-2: not new")
	}
	// Ids compare byte for byte: case and trailing spaces make new ids.
	for _, id := range []string{"M-1", "m-1 ", "é", "e\u0301"} {
		if !e.record(t, ib, "billing", id, true) {
			t.Fatalf("%q: not new (taken for an earlier id)", id)
		}
	}
}

func inboxTwoConsumers(t *testing.T, e *env) {
	ib := e.inbox(t, outbox.InboxConfig{})
	for _, c := range []string{"billing", "shipping"} {
		if !e.record(t, ib, c, "m-1", true) {
			t.Fatalf("%s: m-1 not new", c)
		}
	}
	for _, c := range []string{"billing", "shipping"} {
		if e.record(t, ib, c, "m-1", true) {
			t.Fatalf("%s: m-1 new twice", c)
		}
	}
}

func inboxRollbackForgets(t *testing.T, e *env) {
	ib := e.inbox(t, outbox.InboxConfig{})
	if !e.record(t, ib, "billing", "m-1", false) {
		t.Fatal("m-1 not new")
	}
	if !e.record(t, ib, "billing", "m-1", true) {
		t.Fatal("m-1 kept by a rolled-back transaction")
	}
}

// inboxConcurrent records the same id in two transactions: the second
// starts while the first is open, and must wait for it; it then sees a
// repeat when the first committed (commit) and a new id when it rolled
// back, with no error, and its transaction commits.
func inboxConcurrent(t *testing.T, e *env, commit bool) {
	ib := e.inbox(t, outbox.InboxConfig{})
	ctx := context.Background()
	first := e.Begin(t)
	if fresh, err := ib.Record(ctx, first.Tx, "billing", "m-1"); err != nil || !fresh {
		t.Fatalf("first: fresh %v, err %v", fresh, err)
	}
	type answer struct {
		fresh bool
		err   error
	}
	got := make(chan answer, 1)
	go func() {
		second := e.Begin(t)
		fresh, err := ib.Record(ctx, second.Tx, "billing", "m-1")
		if err == nil {
			err = second.Commit()
		} else {
			_ = second.Rollback()
		}
		got <- answer{fresh, err}
	}()
	select {
	case a := <-got:
		t.Fatalf("the second transaction did not wait for the first: fresh %v, err %v", a.fresh, a.err)
	case <-time.After(300 * time.Millisecond):
	}
	end := first.Rollback
	if commit {
		end = first.Commit
	}
	if err := end(); err != nil {
		t.Fatal(err)
	}
	var a answer
	select {
	case a = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the second transaction still waits after the first ended")
	}
	if a.err != nil {
		t.Fatalf("second transaction: %v", a.err)
	}
	if a.fresh == commit {
		t.Fatalf("first committed %v, second saw the id as new: %v", commit, a.fresh)
	}
	if n := inboxCount(t, e, ib); n != 1 {
		t.Fatalf("%d rows for one id, want 1", n)
	}
}

func inboxCount(t *testing.T, e *env, ib *outbox.Inbox) int64 {
	t.Helper()
	st, err := ib.Stats(context.Background(), e.DB)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, s := range st {
		n += s.Count
	}
	return n
}

// inboxBadInput: every bad value is a *RecordError before any SQL, and
// the transaction stays usable.
func inboxBadInput(t *testing.T, e *env) {
	ib := e.inbox(t, outbox.InboxConfig{})
	ctx := context.Background()
	tx := e.Begin(t)
	long := func(n int) string { return strings.Repeat("x", n) }
	for _, c := range []struct{ consumer, id, field string }{
		{"", "m", "Consumer"},
		{"c", "", "ID"},
		{long(outbox.MaxInboxConsumerBytes + 1), "m", "Consumer"},
		{"c", long(outbox.MaxInboxIDBytes + 1), "ID"},
		{"c", "bad\xff", "ID"},
		{"c\x00", "m", "Consumer"},
	} {
		_, err := ib.Record(ctx, tx.Tx, c.consumer, c.id)
		var re *outbox.RecordError
		if !errors.As(err, &re) || !errors.Is(err, outbox.ErrInvalidRecord) || re.Field != c.field {
			t.Fatalf("Record(%.20q, %.20q): %v, want a RecordError on %s", c.consumer, c.id, err, c.field)
		}
	}
	// The longest values are accepted, and the transaction still works.
	for _, id := range []string{"m-1", long(outbox.MaxInboxIDBytes)} {
		if fresh, err := ib.Record(ctx, tx.Tx, long(outbox.MaxInboxConsumerBytes), id); err != nil || !fresh {
			t.Fatalf("after refused input: fresh %v, err %v", fresh, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if e.record(t, ib, long(outbox.MaxInboxConsumerBytes), long(outbox.MaxInboxIDBytes), true) {
		t.Fatal("the longest id was not kept whole")
	}
	if _, err := ib.Record(ctx, nil, "c", "m"); !errors.Is(err, outbox.ErrNilTx) {
		t.Fatalf("nil tx: %v", err)
	}
}

func inboxPurgeAndStats(t *testing.T, e *env) {
	const retention = 800 * time.Millisecond
	ib := e.inbox(t, outbox.InboxConfig{Retention: retention, PurgeBatch: 2})
	ctx := context.Background()
	if n, err := ib.Purge(ctx, e.DB); err != nil || n != 0 {
		t.Fatalf("purge of an empty inbox: %d, %v", n, err)
	}
	before := time.Now()
	for _, id := range []string{"1", "2", "3", "4", "5"} {
		e.record(t, ib, "billing", id, true)
	}
	e.record(t, ib, "shipping", "1", true)
	time.Sleep(retention + 200*time.Millisecond)
	e.record(t, ib, "billing", "6", true)
	st, err := ib.Stats(ctx, e.DB)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].Consumer != "billing" || st[0].Count != 6 || st[1].Consumer != "shipping" || st[1].Count != 1 {
		t.Fatalf("stats %+v, want billing 6, shipping 1", st)
	}
	// The database clock may differ a little from ours.
	if d := st[0].Oldest.Sub(before); d < -2*time.Second || d > 2*time.Second {
		t.Fatalf("oldest %v, recorded at about %v", st[0].Oldest, before)
	}
	n, err := ib.Purge(ctx, e.DB)
	if err != nil || n != 6 {
		t.Fatalf("purge: %d, %v; want the 6 older than the retention", n, err)
	}
	if st, err = ib.Stats(ctx, e.DB); err != nil || len(st) != 1 || st[0].Count != 1 {
		t.Fatalf("after purge: %+v, %v", st, err)
	}
	// A purged id is new again: the retention must outlast redeliveries.
	if !e.record(t, ib, "billing", "1", true) {
		t.Fatal("a purged id is not new")
	}
}

// txnBeginner begins the store's transactions, for Receive.
type txnBeginner struct {
	e *env
	t *testing.T
}

func (b txnBeginner) Begin(context.Context) (Txn, error)    { return b.e.Begin(b.t), nil }
func (txnBeginner) Tx(x Txn) outboxdriver.Tx                { return x.Tx }
func (txnBeginner) Commit(_ context.Context, x Txn) error   { return x.Commit() }
func (txnBeginner) Rollback(_ context.Context, x Txn) error { return x.Rollback() }
func (b txnBeginner) publish(x Txn, ob *outbox.Outbox, topic string) error {
	_, err := ob.Publish(context.Background(), x.Tx, outbox.Message{Topic: topic})
	return err
}

// inboxReceive: Receive applies an effect (here, a publish in the same
// transaction) once per id; a failing effect keeps nothing.
func inboxReceive(t *testing.T, e *env) {
	ib := e.inbox(t, outbox.InboxConfig{})
	ctx := context.Background()
	b := txnBeginner{e, t}
	calls := 0
	effect := func(_ context.Context, x Txn) error {
		calls++
		return b.publish(x, e.ob, "effect")
	}
	for i := range 3 {
		applied, err := outbox.Receive(ctx, ib, b, "billing", "m-1", effect)
		if err != nil || applied != (i == 0) {
			t.Fatalf("receive %d: applied %v, err %v", i, applied, err)
		}
	}
	boom := errors.New("boom")
	applied, err := outbox.Receive(ctx, ib, b, "billing", "m-2", func(ctx context.Context, x Txn) error {
		if err := effect(ctx, x); err != nil {
			return err
		}
		return boom
	})
	if applied || !errors.Is(err, boom) {
		t.Fatalf("failing effect: applied %v, err %v", applied, err)
	}
	if applied, err = outbox.Receive(ctx, ib, b, "billing", "m-2", effect); err != nil || !applied {
		t.Fatalf("after a failed effect: applied %v, err %v", applied, err)
	}
	if calls != 3 {
		t.Fatalf("effect ran %d times, want 3 (m-1 once, m-2 failed then applied)", calls)
	}
	if n := e.count(t, "topic = 'effect'"); n != 2 {
		t.Fatalf("%d effects kept, want 2 (m-1, m-2)", n)
	}
	if _, err := outbox.Receive(ctx, ib, b, "", "m-3", effect); !errors.Is(err, outbox.ErrInvalidRecord) {
		t.Fatalf("empty consumer: %v", err)
	}
}

// inboxHandlerRedelivered: a relay whose handler's effect committed but
// whose outcome was lost (here: the first attempt reports an error after
// the commit) delivers the message again, and InboxHandler does not apply
// it twice.
func inboxHandlerRedelivered(t *testing.T, e *env) {
	ib := e.inbox(t, outbox.InboxConfig{})
	b := txnBeginner{e, t}
	r, err := e.ob.Relay(e.DB, outbox.RelayConfig{PollInterval: 10 * time.Millisecond, RetryBase: time.Millisecond, RetryCap: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var attempts, effects atomicCounter
	h := outbox.InboxHandler(ib, b, "local", func(_ context.Context, x Txn, d outbox.Delivery) error {
		effects.add()
		return b.publish(x, e.ob, "effect")
	})
	if err := r.Handle("order", func(ctx context.Context, d outbox.Delivery) error {
		err := h(ctx, d)
		if attempts.add() == 1 && err == nil {
			return errors.New("lost after the commit")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.publish(t, outbox.Message{Topic: "order"})
	stop := StartRelay(t, r)
	Eventually(t, 20*time.Second, "the message settled", func() bool { return e.count(t, "topic = 'order'") == 0 })
	stop()
	if a, n := attempts.get(), effects.get(); a != 2 || n != 1 {
		t.Fatalf("%d attempts, %d effects; want 2 attempts and the effect once", a, n)
	}
	if n := e.count(t, "topic = 'effect'"); n != 1 {
		t.Fatalf("%d effects kept, want 1", n)
	}
}

type atomicCounter struct{ n atomic.Int64 }

func (c *atomicCounter) add() int64 { return c.n.Add(1) }
func (c *atomicCounter) get() int64 { return c.n.Load() }
