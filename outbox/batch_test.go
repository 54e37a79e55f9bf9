package outbox_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

func TestHandleBatchErrors(t *testing.T) {
	d := &memDialect{payload: []byte(`{}`), ids: []outbox.ID{outbox.NewID()}}
	ob, err := outbox.New(d, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := ob.Relay(nopDB{}, outbox.RelayConfig{Listen: outbox.ListenOff})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, []outbox.Delivery) []error { return nil }
	var ce *outbox.ConfigError
	if err := r.HandleBatch("", ok); !errors.As(err, &ce) || ce.Field != "topic" {
		t.Errorf("empty topic: %v, want a ConfigError on topic", err)
	}
	if err := r.HandleBatch("t", nil); !errors.As(err, &ce) || ce.Field != "handler" {
		t.Errorf("nil handler: %v, want a ConfigError on handler", err)
	}
	if err := r.Handle("t", func(context.Context, outbox.Delivery) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := r.HandleBatch("t", ok); !errors.Is(err, outbox.ErrDuplicateHandler) {
		t.Errorf("a batch handler for a topic with a handler: %v, want ErrDuplicateHandler", err)
	}
	if err := r.HandleBatch("u", ok); err != nil {
		t.Fatal(err)
	}
	if err := r.Handle("u", func(context.Context, outbox.Delivery) error { return nil }); !errors.Is(err, outbox.ErrDuplicateHandler) {
		t.Errorf("a handler for a topic with a batch handler: %v, want ErrDuplicateHandler", err)
	}
	// The memory dialect cannot claim every topic.
	for _, err := range []error{r.HandleBatch(outbox.AllTopics, ok), r.Handle(outbox.AllTopics, func(context.Context, outbox.Delivery) error { return nil })} {
		if !errors.Is(err, outbox.ErrUnsupported) {
			t.Errorf("catch-all on a dialect without AllTopics: %v, want ErrUnsupported", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for deadline := time.Now().Add(5 * time.Second); !r.Health().Running; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the relay did not start")
		}
	}
	if err := r.HandleBatch("late", ok); !errors.Is(err, outbox.ErrRelayStarted) {
		t.Errorf("HandleBatch on a running relay: %v, want ErrRelayStarted", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := r.HandleBatch("later", ok); !errors.Is(err, outbox.ErrRelayStarted) {
		t.Errorf("HandleBatch after Run: %v, want ErrRelayStarted", err)
	}
}

// lostDialect is memDialect whose renewals find every lease lost but the
// first (that of the message whose job runs the batch: the batch's
// context must be cancelled for the others).
type lostDialect struct{ *memDialect }

func (lostDialect) Capabilities() outboxdriver.Capabilities {
	return outboxdriver.Capabilities{MaxParams: 1 << 16, ParamsPerRow: 1, AllTopics: true}
}

func (lostDialect) Renew(_ context.Context, _ outbox.DB, _ outbox.Table, _ time.Duration, held []outboxdriver.Fence) ([]outboxdriver.Fence, error) {
	return held[:1], nil
}

// countingObserver counts handler starts and ends and lost leases.
type countingObserver struct {
	mu                sync.Mutex
	starts, ends, ost int
	outcomes          map[outbox.Outcome]int
}

func (*countingObserver) ClaimEnd(context.Context, outbox.ClaimEvent) {}
func (o *countingObserver) HandlerStart(ctx context.Context, _ outbox.Delivery) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.starts++
	return ctx
}
func (o *countingObserver) HandlerEnd(_ context.Context, e outbox.HandlerEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ends++
	o.outcomes[e.Outcome]++
}
func (*countingObserver) SettleEnd(context.Context, outbox.SettleEvent)        {}
func (*countingObserver) DeadLettered(context.Context, outbox.DeadLetterEvent) {}
func (o *countingObserver) LeaseLost(context.Context, outbox.LeaseLostEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ost++
}
func (*countingObserver) ListenerChanged(context.Context, outbox.ListenerState) {}

// TestBatchLeaseLost: a batch's context is cancelled when a lease of its
// messages is lost; the observer sees every message of the batch start and
// end; middleware does not wrap batch handlers; the catch-all gets the
// messages of a topic without a handler of its own.
func TestBatchLeaseLost(t *testing.T) {
	d := lostDialect{&memDialect{payload: []byte(`{}`)}}
	for range 3 {
		d.ids = append(d.ids, outbox.NewID())
	}
	d.left.Store(3)
	ob, err := outbox.New(d, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	obs := &countingObserver{outcomes: map[outbox.Outcome]int{}}
	var wrapped int
	mw := func(next outbox.Handler) outbox.Handler { wrapped++; return next }
	r, err := ob.Relay(nopDB{}, outbox.RelayConfig{Listen: outbox.ListenOff, Lease: time.Second, Observer: obs, Middleware: []outbox.Middleware{mw}, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 1)
	cancelled := make(chan error, 1)
	if err := r.HandleBatch(outbox.AllTopics, func(ctx context.Context, ds []outbox.Delivery) []error {
		got <- len(ds)
		select {
		case <-ctx.Done():
			cancelled <- nil
		case <-time.After(5 * time.Second):
			cancelled <- errors.New("the batch's context was not cancelled after its lease was lost")
		}
		return make([]error, len(ds))
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if n := <-got; n != 3 {
		t.Errorf("batch of %d, want the claim's 3", n)
	}
	if err := <-cancelled; err != nil {
		t.Error(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.starts != 3 || obs.ends != 3 || obs.outcomes[outbox.OutcomeDone] != 3 {
		t.Errorf("observer saw %d starts, %d ends, outcomes %v; want 3, 3, 3 done", obs.starts, obs.ends, obs.outcomes)
	}
	if obs.ost != 2 {
		t.Errorf("observer saw %d lost leases, want 2", obs.ost)
	}
	if wrapped != 0 {
		t.Errorf("middleware wrapped a batch handler %d times", wrapped)
	}
}

// limitDialect is memDialect that records the limit of every claim that
// took messages.
type limitDialect struct {
	*memDialect
	mu     sync.Mutex
	limits []int
}

func (d *limitDialect) Claim(ctx context.Context, db outbox.DB, t outbox.Table, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	cs, done, err := d.memDialect.Claim(ctx, db, t, p)
	if len(cs) > 0 {
		d.mu.Lock()
		d.limits = append(d.limits, p.Limit)
		d.mu.Unlock()
	}
	return cs, done, err
}

// TestBatchHoldsSlots: a running batch holds one Concurrency slot per
// message, so no claim comes while it fills them; every slot is free again
// after it.
func TestBatchHoldsSlots(t *testing.T) {
	d := &limitDialect{memDialect: &memDialect{payload: []byte(`{}`)}}
	for range 12 {
		d.ids = append(d.ids, outbox.NewID())
	}
	d.left.Store(12)
	ob, err := outbox.New(d, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := ob.Relay(nopDB{}, outbox.RelayConfig{Listen: outbox.ListenOff, PollInterval: 5 * time.Millisecond, Concurrency: 4, BatchSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var mu sync.Mutex
	sizes := []int{}
	if err := r.HandleBatch("t", func(_ context.Context, ds []outbox.Delivery) []error {
		mu.Lock()
		sizes = append(sizes, len(ds))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			<-release
		}
		return make([]error, len(ds))
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	time.Sleep(200 * time.Millisecond) // 40 polls
	d.mu.Lock()
	claims := len(d.limits)
	d.mu.Unlock()
	if claims != 1 {
		t.Errorf("%d claims while a batch of 4 held the 4 slots, want 1", claims)
	}
	close(release)
	for deadline := time.Now().Add(5 * time.Second); d.left.Load() > 0 || r.Health().InFlight > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the messages after the first batch were not delivered")
		}
	}
	cancel()
	stopped := time.Now()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(stopped); d > 2*time.Second {
		t.Errorf("Run took %v to return with no handler running (the shutdown waited for handlers that had returned)", d)
	}
	mu.Lock()
	defer mu.Unlock()
	// Each batch frees its 4 slots at once: every claim takes 4.
	if !slices.Equal(sizes, []int{4, 4, 4}) {
		t.Errorf("batches %v, want [4 4 4]", sizes)
	}
}

// TestAsyncCommitUnsupported: RelayConfig.AsyncCommit on a dialect whose
// Capabilities lack AsyncCommit makes Relay fail with ErrUnsupported.
func TestAsyncCommitUnsupported(t *testing.T) {
	ob, err := outbox.New(&memDialect{}, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Relay(nopDB{}, outbox.RelayConfig{Listen: outbox.ListenOff, AsyncCommit: true}); !errors.Is(err, outbox.ErrUnsupported) {
		t.Errorf("AsyncCommit on a dialect without it: %v, want ErrUnsupported", err)
	}
	if _, err := ob.Relay(nopDB{}, outbox.RelayConfig{Listen: outbox.ListenOff}); err != nil {
		t.Errorf("the same relay without AsyncCommit: %v", err)
	}
}
