package dialecttest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// purgeBatch is the most rows one statement of a purge deletes, on every
// dialect.
const purgeBatch = 1000

// purgeBatches: a purge of several batches' worth of rows deletes them in
// batches, each committed on its own (issue 19 item 7: one unbounded
// DELETE that outlived the command timeout was rolled back, and a large
// backlog was never purged). A purge whose context ends after one
// statement returns what it deleted with the context's error, and the
// table agrees; the next purge deletes the rest, and only delivered rows.
func purgeBatches(t *testing.T, e *env) {
	ctx := context.Background()
	const delivered = 2*purgeBatch + 500
	lease := outboxdriver.ClaimParams{Limit: 500, Lease: time.Hour, MaxAttempts: 5}
	for left := delivered; left > 0; left -= 500 {
		msgs := make([]outbox.Message, min(500, left))
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "done"}
		}
		e.publish(t, msgs...)
		lease.Topics = []string{"done"}
		cs := claim(t, e, lease)
		ss := make([]outboxdriver.Settlement, len(cs))
		for i, c := range cs {
			ss[i] = outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}, Kind: outboxdriver.SettleDone}
		}
		if applied, err := e.rd.Settle(ctx, e.DB, e.ob.Table(), outboxdriver.SettleParams{KeepDelivered: true}, ss); err != nil || len(applied) != len(msgs) {
			t.Fatalf("settled %d of %d: %v", len(applied), len(msgs), err)
		}
	}
	// Five of each other state: dead, pending, processing.
	five := func(topic string) {
		e.publish(t, outbox.Message{Topic: topic}, outbox.Message{Topic: topic}, outbox.Message{Topic: topic}, outbox.Message{Topic: topic}, outbox.Message{Topic: topic})
	}
	five("dead")
	lease.Topics = []string{"dead"}
	var dead []outboxdriver.Settlement
	for _, c := range claim(t, e, lease) {
		dead = append(dead, outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}, Kind: outboxdriver.SettleDead, Error: "x"})
	}
	if applied, err := e.rd.Settle(ctx, e.DB, e.ob.Table(), outboxdriver.SettleParams{}, dead); err != nil || len(applied) != 5 {
		t.Fatalf("dead-lettered %d of 5: %v", len(applied), err)
	}
	five("busy")
	lease.Topics = []string{"busy"}
	if n := len(claim(t, e, lease)); n != 5 {
		t.Fatalf("claimed %d of 5", n)
	}
	five("waiting")
	others := func(what string) {
		t.Helper()
		for _, where := range []string{"topic = 'dead' AND state = 'dead'", "topic = 'busy' AND state = 'processing'", "topic = 'waiting' AND state = 'pending'"} {
			if n := e.count(t, where); n != 5 {
				t.Errorf("%s: %d rows where %s, want 5", what, n, where)
			}
		}
	}
	time.Sleep(20 * time.Millisecond) // settled_at strictly before now, in milliseconds
	only := outbox.PurgeOptions{States: []outbox.State{outbox.StateDelivered}}

	if n, err := e.ob.Purge(ctx, e.DB, outbox.PurgeOptions{States: only.States, OlderThan: time.Hour}); err != nil || n != 0 {
		t.Errorf("purge of delivered rows older than an hour: %d, %v; want 0", n, err)
	}

	// Cancelled as the second statement is sent.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cut := &countingDB{DB: e.DB, cancelAt: 2, cancel: cancel}
	n, err := e.ob.Purge(cctx, cut, only)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("purge cancelled after one statement: %d, %v; want context.Canceled", n, err)
	}
	if n <= 0 || n >= delivered || n%purgeBatch != 0 {
		t.Errorf("purge cancelled after one statement deleted %d, want whole batches of %d, not all %d", n, purgeBatch, delivered)
	}
	if left := e.count(t, "state = 'delivered'"); left != delivered-int(n) {
		t.Errorf("purge said it deleted %d of %d; %d left", n, delivered, left)
	}
	others("after the cancelled purge")

	all := &countingDB{DB: e.DB}
	rest, err := e.ob.Purge(ctx, all, only)
	if err != nil || n+rest != delivered {
		t.Errorf("second purge: %d, %v; want %d", rest, err, delivered-n)
	}
	if s := all.statements.Load(); s < 2 {
		t.Errorf("%d rows purged with %d statements, want batches of at most %d", rest, s, purgeBatch)
	}
	if left := e.count(t, "state = 'delivered'"); left != 0 {
		t.Errorf("%d delivered rows left", left)
	}
	others("after the purge of delivered rows")
	if n, err := e.ob.Purge(ctx, e.DB, outbox.PurgeOptions{States: []outbox.State{outbox.StateDead}}); err != nil || n != 5 {
		t.Errorf("purge of dead rows: %d, %v; want 5", n, err)
	}
	if n := e.count(t, ""); n != 10 {
		t.Errorf("%d rows left, want the 10 pending and processing", n)
	}
}

// countingDB counts the statements sent outside a transaction; when
// cancelAt is not 0, it calls cancel as statement cancelAt is sent (the
// statement then runs on a cancelled context). It runs a dialect's
// transactions (outboxdriver.TxDB) on its DB.
type countingDB struct {
	outbox.DB
	statements atomic.Int32
	cancelAt   int32
	cancel     func()
}

func (c *countingDB) QueryDB(ctx context.Context, query string, args ...any) (outboxdriver.Rows, error) {
	if n := c.statements.Add(1); c.cancelAt != 0 && n >= c.cancelAt {
		c.cancel()
	}
	return c.DB.QueryDB(ctx, query, args...)
}

func (c *countingDB) InTx(ctx context.Context, f func(tx outbox.DB) error) error {
	tdb, ok := c.DB.(outboxdriver.TxDB)
	if !ok {
		return fmt.Errorf("%w: %T has no transactions", outbox.ErrUnsupported, c.DB)
	}
	return tdb.InTx(ctx, f)
}
