package outbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

type nopObserver struct{}

func (nopObserver) ClaimEnd(context.Context, ClaimEvent) {}
func (nopObserver) HandlerStart(ctx context.Context, _ Delivery) context.Context {
	return ctx
}
func (nopObserver) HandlerEnd(context.Context, HandlerEvent)       {}
func (nopObserver) SettleEnd(context.Context, SettleEvent)         {}
func (nopObserver) DeadLettered(context.Context, DeadLetterEvent)  {}
func (nopObserver) LeaseLost(context.Context, LeaseLostEvent)      {}
func (nopObserver) ListenerChanged(context.Context, ListenerState) {}

// deliverAllocs is the allocations of one delivery (handler run and
// outcome queued) of a relay with obs as its observer.
func deliverAllocs(t *testing.T, obs RelayObserver) float64 {
	const runs = 1000
	r := &Relay{
		cfg:      RelayConfig{Lease: time.Minute, MaxAttempts: 10, Observer: obs},
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		handlers: map[string]Handler{"t": func(context.Context, Delivery) error { return nil }},
		inflight: map[*claimBatch]struct{}{},
	}
	r.out.init()
	r.out.done = make([]queued, 0, 4*runs)
	c := &outboxdriver.Claimed{ID: NewID(), Topic: "t", Payload: []byte(`{}`), Attempts: 1}
	b := &claimBatch{jobs: make([]job, 1)}
	b.left.Store(1 << 40)
	j := &b.jobs[0]
	j.c, j.b, j.ctx.parent = c, b, context.Background()
	return testing.AllocsPerRun(runs, func() { r.deliver(j) })
}

// TestDeliverAllocs: a relay without an observer allocates nothing per
// delivery on the path from claimed row to queued outcome (no headers, a
// handler that succeeds), so the observer hooks cost nothing unset; with
// a no-op observer the events themselves allocate nothing either.
func TestDeliverAllocs(t *testing.T) {
	if n := deliverAllocs(t, nil); n != 0 {
		t.Errorf("observer unset: %v allocations per delivery, want 0", n)
	}
	if n := deliverAllocs(t, nopObserver{}); n != 0 {
		t.Errorf("no-op observer: %v allocations per delivery, want 0", n)
	}
}

// TestDetachedValues: the handlers' parent context has Run's values,
// none of its cancellation (nor its cause), and looking a value up in it
// allocates nothing.
func TestDetachedValues(t *testing.T) {
	type key struct{}
	run, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
	d := detachedValues(run)
	cancel(errors.New("relay stopped"))
	if got := d.Value(key{}); got != "v" {
		t.Errorf("value %v, want Run's", got)
	}
	if d.Done() != nil || d.Err() != nil || context.Cause(d) != nil {
		t.Errorf("detached context: done %v, err %v, cause %v, want none", d.Done(), d.Err(), context.Cause(d))
	}
	if n := testing.AllocsPerRun(100, func() { _ = d.Value(key{}) }); n != 0 {
		t.Errorf("%v allocations per Value, want 0", n)
	}
}
