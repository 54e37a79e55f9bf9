package outbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// TestPlanSaysWhy: on PostgreSQL, with a key halted by its dead head and
// two messages blocked behind it, List takes StateBlocked and shows each
// message's place (KeySeq, HaltsKey), KeyState names the head and counts
// what waits behind it, and Plan says which messages an action leaves
// alone and why: a delete of the key changes nothing (the halted head, to
// be skipped or redriven, and the blocked ones), a skip of a blocked
// message nothing; Targets counts only what would change. Check reports a
// missing table as ErrTableMissing, and Stats too.
func TestPlanSaysWhy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, outbox.Config{OrderByKey: true})
	db := sqltx.FromDB(pgtest.Admin(t))
	tx, err := pgtest.Admin(t).BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{{Topic: "x", Key: "H"}, {Topic: "x", Key: "H"}, {Topic: "x", Key: "H"}, {Topic: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r, err := e.ob.Relay(db, outbox.RelayConfig{MaxAttempts: 1, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Handle("x", func(context.Context, outbox.Delivery) error { return errors.New("refused") }); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	for deadline := time.Now().Add(20 * time.Second); count(t, e.table, `state = 'dead'`) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("H's head and the unordered message not dead in time")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	head, blocked, plain := res[0].ID, []outbox.ID{res[1].ID, res[2].ID}, res[3].ID

	p, err := e.ob.List(ctx, db, outbox.Filter{States: []outbox.State{outbox.StateBlocked}}, 0)
	if err != nil || len(p.Messages) != 2 || p.Messages[0].ID != blocked[0] || p.Messages[0].KeySeq != 2 || p.Messages[1].KeySeq != 3 {
		t.Fatalf("List of the blocked state: %+v, %v", p.Messages, err)
	}
	for _, c := range []struct {
		id     outbox.ID
		halts  bool
		keySeq int64
	}{{head, true, 1}, {plain, false, 0}, {blocked[0], false, 2}} {
		if m, err := e.ob.Get(ctx, db, c.id); err != nil || m.HaltsKey() != c.halts || m.KeySeq != c.keySeq {
			t.Errorf("Get %s: HaltsKey %v, KeySeq %d, %v; want %v, %d", c.id, m.HaltsKey(), m.KeySeq, err, c.halts, c.keySeq)
		}
	}
	if ks, err := e.ob.KeyState(ctx, db, "H"); err != nil || ks.Head.ID != head || !ks.Head.HaltsKey() || ks.Blocked != 2 {
		t.Errorf("KeyState H: %+v, %v; want the head %s halting H, 2 blocked", ks, err, head)
	}
	if ks, err := e.ob.KeyState(ctx, db, "none"); err != nil || !ks.Head.ID.IsZero() || ks.Blocked != 0 {
		t.Errorf("KeyState of a key without messages: %+v, %v", ks, err)
	}

	reasons := func(p outbox.Plan) map[string][]outbox.ID {
		out := map[string][]outbox.ID{}
		for _, r := range p.Refused {
			out[strings.SplitN(r.Reason, ":", 2)[0]] = r.IDs
		}
		return out
	}
	plan, err := e.ob.Plan(ctx, db, outbox.ActDelete, outbox.Filter{Key: "H"})
	if got := reasons(plan); err != nil || len(plan.IDs) != 0 || len(got) != 2 ||
		!slices.Equal(got["halts its ordered key"], []outbox.ID{head}) || !slices.Equal(got["holds its place in its ordered key (its head, or blocked behind it)"], blocked) {
		t.Errorf("Plan of a delete of H: %+v, %v", plan, err)
	}
	if r := plan.Refused[0].Reason; !strings.Contains(r, "skip it") || !strings.Contains(r, "redrive it") {
		t.Errorf("the halted head's reason %q names neither skip nor redrive", r)
	}
	if ids, err := e.ob.Targets(ctx, db, outbox.ActDelete, outbox.Filter{States: []outbox.State{outbox.StateDead}}); err != nil || !slices.Equal(ids, []outbox.ID{plain}) {
		t.Errorf("Targets of a delete of the dead: %v, %v; want only the unordered %s", ids, err, plain)
	}
	if n, err := e.ob.Act(ctx, db, outbox.ActDelete, outbox.Filter{IDs: []outbox.ID{head}}, nil); err != nil || n != 0 {
		t.Errorf("Act: a delete of the halted head changed %d, %v", n, err)
	}
	plan, err = e.ob.Plan(ctx, db, outbox.ActSkip, outbox.Filter{IDs: []outbox.ID{blocked[0], plain, head}})
	if got := reasons(plan); err != nil || !slices.Equal(plan.IDs, []outbox.ID{head}) || len(got) != 2 ||
		!slices.Equal(got["is blocked behind the head of its ordered key"], blocked[:1]) || !slices.Equal(got["is dead but halts no key (not ordered, skipped already, or dead under ContinueKey)"], []outbox.ID{plain}) {
		t.Errorf("Plan of a skip of a blocked, an unordered dead and the halted message: %+v, %v", plan, err)
	}

	missing, err := outbox.New(postgres.Dialect(), outbox.Config{Table: e.schema + ".nosuch", OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := missing.Check(ctx, db); !errors.Is(err, outbox.ErrTableMissing) || !strings.Contains(err.Error(), e.schema+".nosuch") {
		t.Errorf("Check of a missing table: %v", err)
	}
	if _, err := missing.Stats(ctx, db); !errors.Is(err, outbox.ErrTableMissing) {
		t.Errorf("Stats of a missing table: %v", err)
	}
	if err := e.ob.Check(ctx, db); err != nil {
		t.Errorf("Check of the table: %v", err)
	}
}
