package outbox

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// orderedFake is an OrderedDialect whose SettleRuns records what it wrote:
// it fails the calls listed in fail (1-based) and returns as busy the runs
// of the keys in held.
type orderedFake struct {
	blockingDialect
	mu      sync.Mutex
	calls   int
	fail    map[int]bool
	held    map[string]bool
	written map[ID]bool
}

func (*orderedFake) Capabilities() outboxdriver.Capabilities {
	return outboxdriver.Capabilities{Ordered: true}
}
func (*orderedFake) SequenceSQL(Table, []ID) (string, []any) { return "", nil }
func (*orderedFake) ClaimOrdered(context.Context, DB, Table, outboxdriver.ClaimParams, int) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	return nil, nil, nil
}
func (*orderedFake) RedriveOrdered(context.Context, DB, Table, string) (int64, error) { return 0, nil }
func (*orderedFake) SkipHead(context.Context, DB, Table, string, ID) (ID, bool, error) {
	return ID{}, false, nil
}
func (*orderedFake) StatsOrdered(context.Context, DB, Table) ([]TopicStats, error) { return nil, nil }
func (*orderedFake) CheckOrdered(context.Context, DB, Table) error                 { return nil }

func (d *orderedFake) SettleRuns(_ context.Context, _ DB, _ Table, _ outboxdriver.SettleParams, runs []outboxdriver.RunOutcome) ([]outboxdriver.Fence, []int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	if d.fail[d.calls] {
		return nil, nil, errInjected
	}
	if d.written == nil {
		d.written = map[ID]bool{}
	}
	var applied []outboxdriver.Fence
	var busy []int
	for i, r := range runs {
		if d.held[r.Key] {
			busy = append(busy, i)
			continue
		}
		d.written[r.Head.ID] = true
		applied = append(applied, r.Head)
	}
	return applied, busy, nil
}

func (d *orderedFake) wrote(id ID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.written[id]
}

// txNoDB is a DB that can "run" a transaction (ordered relays need one).
type txNoDB struct{ noDB }

func (txNoDB) InTx(ctx context.Context, f func(tx outboxdriver.DB) error) error { return f(noDB{}) }

// orderedRelayOn builds an ordered relay on d without running it.
func orderedRelayOn(t *testing.T, d *orderedFake) (*Relay, *syncBuffer) {
	t.Helper()
	ob, err := New(d, Config{OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	logs := new(syncBuffer)
	r, err := ob.Relay(txNoDB{}, RelayConfig{Listen: ListenOff, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return r, logs
}

func queuedRunOf(key string) queuedRun {
	h := outboxdriver.Fence{ID: NewID(), Attempts: 1}
	return queuedRun{outboxdriver.RunOutcome{Head: h, Key: key, Done: []ID{h.ID}}, time.Now().Add(time.Hour), nil}
}

// TestFinalRunsCountFailuresOnly (issue 31 finding 6): at shutdown, with
// more than two batches of run outcomes queued, one failed write of the
// third is tried again: written batches do not count as attempts. Before
// the fix, the loop's attempt counter grew with every batch, and the third
// batch's first failure dropped it and every run behind it.
func TestFinalRunsCountFailuresOnly(t *testing.T) {
	d := &orderedFake{fail: map[int]bool{3: true}}
	r, logs := orderedRelayOn(t, d)
	var runs []queuedRun
	for range 2*maxSettleBatch + 10 {
		q := queuedRunOf("k")
		runs = append(runs, q)
		r.sendRun(q)
	}
	r.finalRuns(context.Background()) // as runSettleLoop does at quit
	for _, q := range runs {
		if !d.wrote(q.Head.ID) {
			t.Fatalf("a run was not written at shutdown (%d calls); logs:\n%s", d.calls, logs.String())
		}
	}
	if strings.Contains(logs.String(), "dropped") {
		t.Errorf("runs logged as dropped:\n%s", logs.String())
	}
}

// TestHeldKeyDelaysOnlyItsKey (I6, issue 31 finding 3): the run of a key
// whose row an open transaction holds is put back, while the runs of other
// keys are written; at shutdown the relay stops trying within
// finalRunsWithin and logs the held run as dropped (its lease lapses and
// it is delivered again). Before the fix a held key stalled its whole
// batch until CommandTimeout, and shutdown waited for it.
func TestHeldKeyDelaysOnlyItsKey(t *testing.T) {
	d := &orderedFake{held: map[string]bool{"held": true}}
	r, logs := orderedRelayOn(t, d)
	quit := make(chan struct{})
	stopped := make(chan struct{})
	go func() { r.runSettleLoop(context.Background(), quit); close(stopped) }()
	held, other := queuedRunOf("held"), queuedRunOf("other")
	r.sendRun(held)
	r.sendRun(other)
	deadline := time.Now().Add(5 * time.Second)
	for !d.wrote(other.Head.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("the other key's run was not written while one key was held; logs:\n%s", logs.String())
		}
		time.Sleep(time.Millisecond)
	}
	later := queuedRunOf("third")
	r.sendRun(later)
	for !d.wrote(later.Head.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("a later run was not written while one key was held; logs:\n%s", logs.String())
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	close(quit)
	<-stopped
	if took := time.Since(start); took > finalRunsWithin+time.Second {
		t.Errorf("the run settler took %v to stop with a held key", took)
	}
	if d.wrote(held.Head.ID) {
		t.Error("the held key's run was written")
	}
	if !strings.Contains(logs.String(), "held by open transactions") || !strings.Contains(logs.String(), held.Head.ID.String()) {
		t.Errorf("the held run was not logged as dropped:\n%s", logs.String())
	}
}

// TestRunExpiresWithRenewedLease (issue 31 finding 7): a run's outcome
// expires when its claim's lease lapses as renewed until the run ended,
// not as it stood when the run began. Before the fix the expiry was read
// before the run, so a run that outlived its first lease term had its
// outcome dropped while its lease was still held.
func TestRunExpiresWithRenewedLease(t *testing.T) {
	d := &orderedFake{}
	r, _ := orderedRelayOn(t, d)
	b := &claimBatch{claimed: time.Now()}
	renewedBy := 10 * time.Minute
	if err := r.Handle("x", func(context.Context, Delivery) error {
		b.renewed.Store(int64(renewedBy)) // a renewal while the handler ran
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c := &outboxdriver.Claimed{ID: NewID(), Topic: "x", Key: "k", KeySeq: 1, Attempts: 1}
	b.jobs = []job{{c: c, b: b, ctx: handlerCtx{parent: context.Background()}}}
	b.left.Store(1)
	r.inflightN.Add(1)
	if !r.deliverOrdered(&b.jobs[0]) {
		t.Fatal("the ordered head was not delivered as a run")
	}
	runs := r.ord.take(10, false)
	if len(runs) != 1 {
		t.Fatalf("queued %d runs", len(runs))
	}
	if want := b.claimed.Add(renewedBy + r.cfg.Lease); !runs[0].expires.Equal(want) {
		t.Errorf("the run expires at %v, want %v (the renewed lease)", runs[0].expires, want)
	}
}

// TestBatchRunExpiresWithRenewedLease (issue 31 finding 7, the batch
// path): a batch handler's outcome expires with the lease as renewed while
// the handler ran. Before the fix settleBatch took now + Lease after the
// handler returned.
func TestBatchRunExpiresWithRenewedLease(t *testing.T) {
	d := &orderedFake{}
	r, _ := orderedRelayOn(t, d)
	b := &claimBatch{claimed: time.Now().Add(-time.Hour)}
	renewedBy := 10 * time.Minute
	if err := r.HandleBatch("x", func(_ context.Context, ds []Delivery) []error {
		b.renewed.Store(int64(renewedBy)) // a renewal while the handler ran
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c := &outboxdriver.Claimed{ID: NewID(), Topic: "x", Key: "k", KeySeq: 1, Attempts: 1}
	b.jobs = []job{{c: c, b: b, ctx: handlerCtx{parent: context.Background()}}}
	b.jobs[0].group = []*job{&b.jobs[0]}
	b.left.Store(1)
	r.inflightN.Add(1)
	r.deliverBatch(&b.jobs[0])
	runs := r.ord.take(10, false)
	if len(runs) != 1 {
		t.Fatalf("queued %d runs", len(runs))
	}
	if want := b.claimed.Add(renewedBy + r.cfg.Lease); !runs[0].expires.Equal(want) {
		t.Errorf("the batch's run expires at %v, want %v (the renewed lease)", runs[0].expires, want)
	}
}
