package outbox

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// blockingDialect records Settle batches; a Settle call blocks while
// block is set, after signalling entered.
type blockingDialect struct {
	mu      sync.Mutex
	batches [][]outboxdriver.Settlement
	block   chan struct{} // nil: do not block
	entered chan struct{}
}

func (*blockingDialect) Name() string                            { return "blocking" }
func (*blockingDialect) Capabilities() outboxdriver.Capabilities { return outboxdriver.Capabilities{} }
func (*blockingDialect) Insert(Table, []outboxdriver.Row, outboxdriver.Wake) (string, []any) {
	return "", nil
}
func (*blockingDialect) Classify(err error) error { return err }
func (*blockingDialect) Claim(context.Context, DB, Table, outboxdriver.ClaimParams) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	return nil, nil, nil
}
func (d *blockingDialect) Settle(_ context.Context, _ DB, _ Table, _ outboxdriver.SettleParams, s []outboxdriver.Settlement) ([]outboxdriver.Fence, error) {
	d.mu.Lock()
	d.batches = append(d.batches, append([]outboxdriver.Settlement(nil), s...))
	block := d.block
	d.mu.Unlock()
	if block != nil {
		d.entered <- struct{}{}
		<-block
	}
	fences := make([]outboxdriver.Fence, len(s))
	for i := range s {
		fences[i] = s[i].Fence
	}
	return fences, nil
}
func (*blockingDialect) Renew(context.Context, DB, Table, time.Duration, []outboxdriver.Fence) ([]outboxdriver.Fence, error) {
	return nil, nil
}
func (*blockingDialect) Redrive(context.Context, DB, Table, string) (int64, error) { return 0, nil }
func (*blockingDialect) Purge(context.Context, DB, Table, []State, time.Duration) (int64, error) {
	return 0, nil
}
func (*blockingDialect) Stats(context.Context, DB, Table) ([]TopicStats, error) { return nil, nil }
func (*blockingDialect) ListenSQL(Table) string                                 { return "" }
func (*blockingDialect) Check(context.Context, DB, Table) error                 { return nil }

type noDB struct{}

func (noDB) QueryDB(context.Context, string, ...any) (outboxdriver.Rows, error) { return nil, nil }

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startSettler builds a relay on d and runs only its settler, until stop
// is closed.
func startSettler(t *testing.T, d outboxdriver.RelayDialect) (*Relay, *syncBuffer, chan struct{}) {
	ob, err := New(d, Config{})
	if err != nil {
		t.Fatal(err)
	}
	logs := new(syncBuffer)
	r, err := ob.Relay(noDB{}, RelayConfig{Listen: ListenOff, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r.out.init()
	stop := make(chan struct{})
	go r.settleLoop(context.Background(), stop)
	return r, logs, stop
}

// TestOutcomeDuringFinalSettle (issue 19 item 2): an outcome sent while
// the settler writes its last batch at shutdown is either written or
// logged as dropped, never lost without a trace. Before the fix, the
// settler drained its channel, then wrote; a send meanwhile found the
// channel open and reported success, and nobody ever read it.
func TestOutcomeDuringFinalSettle(t *testing.T) {
	d := &blockingDialect{block: make(chan struct{}), entered: make(chan struct{}, 1)}
	r, logs, stop := startSettler(t, d)

	first := queued{Settlement: outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: NewID(), Attempts: 1}, Kind: outboxdriver.SettleDone}}
	r.send(first) // waits doneLinger for a claim: still waiting at stop
	close(stop)
	<-d.entered // the final write has begun, with first
	late := queued{Settlement: outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: NewID(), Attempts: 1}, Kind: outboxdriver.SettleRetry, Delay: time.Second, Error: "late"}}
	r.send(late)
	close(d.block)
	<-r.out.stopped

	written := false
	d.mu.Lock()
	for _, b := range d.batches {
		for _, s := range b {
			written = written || s.ID == late.ID
		}
	}
	d.mu.Unlock()
	logged := strings.Contains(logs.String(), "outcomes dropped") && strings.Contains(logs.String(), late.ID.String())
	if !written && !logged {
		t.Fatalf("the late outcome was neither written nor logged as dropped; logs:\n%s", logs.String())
	}
}

// TestFailedSettleIsRetried (issue 19 item 3): outcomes whose write fails
// go back to be written again after a backoff, and are dropped (logged)
// only once their lease has lapsed.
func TestFailedSettleIsRetried(t *testing.T) {
	d := &failingDialect{failures: 2}
	r, logs, stop := startSettler(t, d)
	live := queued{outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: NewID(), Attempts: 1}, Kind: outboxdriver.SettleRetry, Error: "x"}, time.Now().Add(time.Minute)}
	lapsed := queued{outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: NewID(), Attempts: 1}, Kind: outboxdriver.SettleRetry, Error: "y"}, time.Now().Add(-time.Second)}
	r.send(live)
	r.send(lapsed)
	deadline := time.Now().Add(5 * time.Second)
	for !d.wrote(live.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("the outcome was not written again after two failed writes; logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	<-r.out.stopped
	if d.wrote(lapsed.ID) {
		t.Error("an outcome whose lease had lapsed was written again")
	}
	if !strings.Contains(logs.String(), lapsed.ID.String()) {
		t.Errorf("the lapsed outcome was not logged as dropped:\n%s", logs.String())
	}
}

// failingDialect fails its first failures Settle calls.
type failingDialect struct {
	blockingDialect
	failures int
	written  map[ID]bool
}

func (d *failingDialect) Settle(_ context.Context, _ DB, _ Table, _ outboxdriver.SettleParams, s []outboxdriver.Settlement) ([]outboxdriver.Fence, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failures > 0 {
		d.failures--
		return nil, errInjected
	}
	if d.written == nil {
		d.written = map[ID]bool{}
	}
	fences := make([]outboxdriver.Fence, len(s))
	for i := range s {
		d.written[s[i].ID] = true
		fences[i] = s[i].Fence
	}
	return fences, nil
}

func (d *failingDialect) wrote(id ID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.written[id]
}

var errInjected = &ConfigError{Field: "test", Reason: "injected settle failure"}

// TestSettlerRecoversWhenNothingIsLeftToRetry: after a failed write whose
// outcomes are gone by the time the retry timer fires (a claim carried the
// successes, or their lease lapsed), the settler leaves its backoff and
// writes the next outcome at once. Before the fix it stayed in backoff with
// no timer armed, and wrote retries and dead letters only at shutdown.
func TestSettlerRecoversWhenNothingIsLeftToRetry(t *testing.T) {
	d := &failingDialect{failures: 1}
	r, logs, stop := startSettler(t, d)
	defer func() { close(stop); <-r.out.stopped }()
	done := queued{outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: NewID(), Attempts: 1}, Kind: outboxdriver.SettleDone}, time.Now().Add(time.Minute)}
	r.send(done) // the settler's write of it fails, and it goes back on the list
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "settle failed") {
		if time.Now().After(deadline) {
			t.Fatalf("the write did not fail; logs:\n%s", logs.String())
		}
		time.Sleep(time.Millisecond)
	}
	if got := r.out.takeDone(maxSettleBatch); len(got) != 1 { // a claim carries it
		t.Fatalf("took %d successes back, want 1", len(got))
	}
	time.Sleep(300 * time.Millisecond) // the retry timer fires and finds nothing
	next := queued{outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: NewID(), Attempts: 1}, Kind: outboxdriver.SettleRetry, Error: "x"}, time.Now().Add(time.Minute)}
	r.send(next)
	deadline = time.Now().Add(2 * time.Second)
	for !d.wrote(next.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("an outcome sent after the backoff ran dry was not written; logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStatsWhileHandling: Relay.Stats may run while handlers are still
// being registered (a readiness endpoint served during start-up); it reads
// the handlers under the relay's lock (go test -race found the old read).
func TestStatsWhileHandling(t *testing.T) {
	d := &statsDialect{}
	ob, err := New(d, Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := ob.Relay(noDB{}, RelayConfig{Listen: ListenOff})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 100 {
			_ = r.Handle("t"+string(rune('a'+i%26))+string(rune('a'+i/26)), func(context.Context, Delivery) error { return nil })
		}
	})
	for range 100 {
		if _, err := r.Stats(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}

// statsDialect reports one topic with a due message.
type statsDialect struct{ blockingDialect }

func (*statsDialect) Stats(context.Context, DB, Table) ([]TopicStats, error) {
	return []TopicStats{{Topic: "x", Pending: 1, OldestPending: time.Second}}, nil
}
