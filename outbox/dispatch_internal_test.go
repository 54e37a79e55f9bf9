package outbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

type ctxKey struct{}

// TestHandlerCtx: a handler's context carries the relay context's values,
// is cancelled by cancel (once), and contexts derived from it (WithCancel,
// WithTimeout, AfterFunc) follow it without a goroutine each.
func TestHandlerCtx(t *testing.T) {
	hc := &handlerCtx{parent: context.WithoutCancel(context.WithValue(context.Background(), ctxKey{}, "v"))}
	if got := hc.Value(ctxKey{}); got != "v" {
		t.Fatalf("Value = %v, want v", got)
	}
	if hc.Err() != nil {
		t.Fatalf("Err before cancel = %v", hc.Err())
	}
	if _, ok := hc.Deadline(); ok {
		t.Fatal("Deadline set")
	}
	before := runtime.NumGoroutine()
	const children = 50
	var kids []context.Context
	var cancels []context.CancelFunc
	for range children {
		k, cancel := context.WithTimeout(hc, time.Hour)
		kids = append(kids, k)
		cancels = append(cancels, cancel)
	}
	if n := runtime.NumGoroutine(); n > before+5 {
		t.Errorf("%d goroutines after deriving %d contexts, %d before: want none per context", n, children, before)
	}
	// A child cancelled on its own unregisters (stop reports it did).
	cancels[0]()
	var ran atomic.Bool
	stopped := context.AfterFunc(hc, func() { ran.Store(true) })
	notRun := context.AfterFunc(hc, func() { t.Error("stopped AfterFunc ran") })
	if !notRun() {
		t.Error("stop before cancel returned false")
	}
	done := hc.Done()
	select {
	case <-done:
		t.Fatal("Done closed before cancel")
	default:
	}
	hc.cancel()
	hc.cancel() // idempotent
	<-done
	if !errors.Is(hc.Err(), context.Canceled) {
		t.Errorf("Err = %v, want Canceled", hc.Err())
	}
	for i, k := range kids {
		select {
		case <-k.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("child %d not cancelled", i)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for !ran.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !ran.Load() {
		t.Error("AfterFunc did not run after cancel")
	}
	if stopped() {
		t.Error("stop after the function ran returned true")
	}
	// Registered after cancellation: runs at once.
	late := make(chan struct{})
	context.AfterFunc(hc, func() { close(late) })
	<-late
	for _, c := range cancels {
		c()
	}
	// A Done asked for after cancel is closed.
	hc2 := &handlerCtx{parent: context.Background()}
	hc2.cancel()
	<-hc2.Done()
}

// TestHandlerQueueBlockingHandlers: when handlers block, every queued job
// gets a goroutine of its own (all run at once), though the queue wakes
// one goroutine at a time.
func TestHandlerQueueBlockingHandlers(t *testing.T) {
	const n = 100
	var started sync.WaitGroup
	started.Add(n)
	release := make(chan struct{})
	var ran atomic.Int32
	var exited sync.WaitGroup
	var q *handlerQueue
	q = newHandlerQueue(func() {
		exited.Add(1)
		go func() {
			defer exited.Done()
			for j := q.next(false); j != nil; j = q.next(true) {
				started.Done()
				<-release
				ran.Add(1)
			}
		}()
	})
	jobs := make([]job, n)
	ptrs := make([]*job, n)
	for i := range jobs {
		ptrs[i] = &jobs[i]
	}
	q.push(ptrs[:n/2])
	q.push(ptrs[n/2:])
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatal("not every blocked job got a goroutine")
	}
	close(release)
	q.close()
	exited.Wait()
	if ran.Load() != n {
		t.Fatalf("ran %d jobs, want %d", ran.Load(), n)
	}
}

// TestHandlerQueueRetire: idle goroutines exit on retire; the queue starts
// new ones for later jobs.
func TestHandlerQueueRetire(t *testing.T) {
	var live atomic.Int32
	var ran atomic.Int32
	var q *handlerQueue
	q = newHandlerQueue(func() {
		live.Add(1)
		go func() {
			defer live.Add(-1)
			for j := q.next(false); j != nil; j = q.next(true) {
				ran.Add(1)
			}
		}()
	})
	var jobs [3]job
	q.push([]*job{&jobs[0], &jobs[1]})
	waitFor(t, func() bool { return ran.Load() == 2 })
	waitFor(t, func() bool { q.mu.Lock(); defer q.mu.Unlock(); return q.idle == int(live.Load()) })
	q.retire()
	waitFor(t, func() bool { return live.Load() == 0 })
	q.push([]*job{&jobs[2]})
	waitFor(t, func() bool { return ran.Load() == 3 })
	q.close()
	waitFor(t, func() bool { return live.Load() == 0 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLeaseEnd: an outcome expires a lease after its claim, or after the
// last renewal of its batch's leases once one has succeeded.
func TestLeaseEnd(t *testing.T) {
	t0 := time.Now()
	b := &claimBatch{claimed: t0}
	const lease = 30 * time.Second
	if got := b.leaseEnd(lease); !got.Equal(t0.Add(lease)) {
		t.Fatalf("leaseEnd before any renewal = %v, want claim + lease %v", got, t0.Add(lease))
	}
	b.renewed.Store(int64(12 * time.Second))
	if got, want := b.leaseEnd(lease), t0.Add(12*time.Second+lease); !got.Equal(want) {
		t.Fatalf("leaseEnd after a renewal = %v, want renewal + lease %v", got, want)
	}
}

// renewDialect counts renewals and keeps every lease, or fails them all.
type renewDialect struct {
	blockingDialect
	fail  bool
	calls chan struct{}
}

func (d *renewDialect) Renew(_ context.Context, _ DB, _ Table, _ time.Duration, held []outboxdriver.Fence) ([]outboxdriver.Fence, error) {
	select {
	case d.calls <- struct{}{}:
	default:
	}
	if d.fail {
		return nil, errors.New("renewal failed")
	}
	return held, nil
}

// TestRenewalMovesLeaseEnd: a renewal that succeeded moves the lease end
// of its batch's outcomes (leaseEnd) to a lease after the renewal; one
// that failed leaves it a lease after the claim.
func TestRenewalMovesLeaseEnd(t *testing.T) {
	for _, fail := range []bool{false, true} {
		d := &renewDialect{fail: fail, calls: make(chan struct{}, 1)}
		ob, err := New(d, Config{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := ob.Relay(noDB{}, RelayConfig{Listen: ListenOff, Lease: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		claimed := time.Now().Add(-500 * time.Millisecond) // past a third of the lease: renewed at the next tick
		b := &claimBatch{jobs: make([]job, 1), claimed: claimed}
		b.jobs[0].c, b.jobs[0].b = &outboxdriver.Claimed{ID: NewID(), Topic: "t", Attempts: 1}, b
		r.inflightMu.Lock()
		r.inflight[b] = struct{}{}
		r.inflightMu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); r.renewLoop(ctx) }()
		<-d.calls
		<-d.calls // the first renewal has returned
		cancel()
		<-done
		end := b.leaseEnd(time.Second)
		if fail && !end.Equal(claimed.Add(time.Second)) {
			t.Errorf("after failed renewals: lease end %v, want a lease after the claim, %v", end, claimed.Add(time.Second))
		}
		if !fail && !end.After(claimed.Add(time.Second+100*time.Millisecond)) {
			t.Errorf("after a renewal: lease end %v, want a lease after the renewal (claimed %v)", end, claimed)
		}
	}
}
