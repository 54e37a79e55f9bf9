package outbox_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// overlapDialect is memDialect whose claims may overlap (when overlap is
// set) and wait for one another: a claim waits until another is in flight
// too (but the first, which none overlaps), or for wait when none comes. It records the most claims in flight
// at once and checks that the rows claimed and not yet handled, plus the
// limits of the claims in flight, never exceed the relay's Concurrency.
type overlapDialect struct {
	*memDialect
	overlap     bool
	wait        time.Duration
	concurrency int

	mu          sync.Mutex
	inFlight    int
	maxInFlight int
	limits      int // of the claims in flight
	claims      int
	outstanding atomic.Int64 // rows claimed, handlers not finished
	overbooked  atomic.Int64 // claims that found the slots exceeded
}

func (d *overlapDialect) Capabilities() outboxdriver.Capabilities {
	c := d.memDialect.Capabilities()
	c.OverlappingClaims = d.overlap
	return c
}

func (d *overlapDialect) Claim(ctx context.Context, db outbox.DB, t outbox.Table, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	d.mu.Lock()
	d.inFlight++
	d.claims++
	d.limits += p.Limit
	d.maxInFlight = max(d.maxInFlight, d.inFlight)
	if int(d.outstanding.Load())+d.limits > d.concurrency {
		d.overbooked.Add(1)
	}
	first := d.claims == 1
	deadline := time.Now().Add(d.wait)
	// The first claim has no full claim before it: none overlaps it. It
	// takes longer than the overlapped claims after it, so that the relay
	// finds that overlapping pays (see overlapGauge).
	if first {
		d.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		d.mu.Lock()
	}
	for !first && d.inFlight < 2 && time.Now().Before(deadline) && d.memDialect.left.Load() > 0 {
		d.mu.Unlock()
		time.Sleep(100 * time.Microsecond) // wait for a second claim, for wait at most
		d.mu.Lock()
	}
	d.mu.Unlock()
	claimed, done, err := d.memDialect.Claim(ctx, db, t, p)
	d.outstanding.Add(int64(len(claimed)))
	d.mu.Lock()
	d.inFlight--
	d.limits -= p.Limit
	d.mu.Unlock()
	return claimed, done, err
}

// TestClaimsOverlap: while claims fill their limit, a relay on a dialect
// whose claims may overlap keeps two in flight at once, never more, and
// the rows of the claims in flight and those being handled never exceed
// Concurrency; on a dialect whose claims may not overlap (SQLite), one
// claim at a time.
func TestClaimsOverlap(t *testing.T) {
	for _, overlap := range []bool{true, false} {
		d := &overlapDialect{memDialect: &memDialect{payload: []byte(`{}`)}, overlap: overlap, concurrency: outbox.DefaultConcurrency}
		d.wait = 5 * time.Second // a second claim comes at once when claims may overlap
		if !overlap {
			d.wait = 2 * time.Millisecond // none comes
		}
		for range 4096 {
			d.ids = append(d.ids, outbox.NewID())
		}
		// Fewer claims than the relay makes before it probes claims
		// alone (64), which here would each wait for a second claim.
		const total = 20 * outbox.DefaultBatchSize
		d.left.Store(total)
		ob, err := outbox.New(d, outbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := ob.Relay(nopDB{}, outbox.RelayConfig{PollInterval: time.Millisecond, Listen: outbox.ListenOff, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		var handled atomic.Int64
		all := make(chan struct{})
		if err := r.Handle("t", func(context.Context, outbox.Delivery) error {
			d.outstanding.Add(-1)
			if handled.Add(1) == total {
				close(all)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		<-all
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		d.mu.Lock()
		most, claims := d.maxInFlight, d.claims
		d.mu.Unlock()
		want := 1
		if overlap {
			want = 2
		}
		if most != want {
			t.Errorf("overlap %v: at most %d claims in flight at once over %d claims, want %d", overlap, most, claims, want)
		}
		if n := d.overbooked.Load(); n > 0 {
			t.Errorf("overlap %v: %d claims started with the rows claimed and in flight over Concurrency %d", overlap, n, outbox.DefaultConcurrency)
		}
	}
}
