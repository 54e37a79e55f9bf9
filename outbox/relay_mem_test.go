package outbox_test

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// memDialect serves claims from a counter in memory: with it a relay's
// cost is its own (dispatch, handler goroutines, bookkeeping, settles),
// without a database's noise.
type memDialect struct {
	left    atomic.Int64
	ids     []outbox.ID
	next    atomic.Int64
	payload []byte
}

func (*memDialect) Name() string { return "mem" }
func (*memDialect) Capabilities() outboxdriver.Capabilities {
	return outboxdriver.Capabilities{MaxParams: 1 << 16, ParamsPerRow: 1}
}
func (*memDialect) Insert(outbox.Table, []outboxdriver.Row, outboxdriver.Wake) (string, []any) {
	return "", nil
}
func (*memDialect) Classify(err error) error { return err }

func (m *memDialect) Claim(_ context.Context, _ outbox.DB, _ outbox.Table, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	n := int64(p.Limit)
	if left := m.left.Add(-n); left < 0 {
		n += left
		m.left.Add(-left)
	}
	claimed := make([]outboxdriver.Claimed, max(n, 0))
	for i := range claimed {
		k := m.next.Add(1)
		claimed[i] = outboxdriver.Claimed{ID: m.ids[k%int64(len(m.ids))], Topic: "t", Payload: m.payload, Attempts: 1}
	}
	return claimed, p.Done, nil
}

func (*memDialect) Settle(_ context.Context, _ outbox.DB, _ outbox.Table, _ outboxdriver.SettleParams, s []outboxdriver.Settlement) ([]outboxdriver.Fence, error) {
	f := make([]outboxdriver.Fence, len(s))
	for i := range s {
		f[i] = s[i].Fence
	}
	return f, nil
}

func (*memDialect) Renew(_ context.Context, _ outbox.DB, _ outbox.Table, _ time.Duration, held []outboxdriver.Fence) ([]outboxdriver.Fence, error) {
	return held, nil
}
func (*memDialect) Redrive(context.Context, outbox.DB, outbox.Table, string) (int64, error) {
	return 0, nil
}
func (*memDialect) Purge(context.Context, outbox.DB, outbox.Table, []outbox.State, time.Duration) (int64, error) {
	return 0, nil
}
func (*memDialect) Stats(context.Context, outbox.DB, outbox.Table) ([]outbox.TopicStats, error) {
	return nil, nil
}
func (*memDialect) ListenSQL(outbox.Table) string                        { return "" }
func (*memDialect) Check(context.Context, outbox.DB, outbox.Table) error { return nil }

var _ outboxdriver.RelayDialect = (*memDialect)(nil)

type nopDB struct{}

func (nopDB) QueryDB(context.Context, string, ...any) (outboxdriver.Rows, error) {
	panic("memDialect sends no SQL")
}

// BenchmarkRelayOverhead is the relay's own cost per delivered message
// (ns/op, allocs/op), with default settings, claims served from memory,
// and a no-op handler (nop) or one that decodes the JSON payload (json):
//
//	go test ./outbox -run '^$' -bench RelayOverhead -count 6
func BenchmarkRelayOverhead(b *testing.B) {
	b.Run("nop", func(b *testing.B) { relayOverhead(b, func(outbox.Delivery) {}) })
	b.Run("json", func(b *testing.B) {
		relayOverhead(b, func(d outbox.Delivery) {
			var v struct {
				OrderID    string `json:"order_id"`
				Email      string `json:"email"`
				TotalCents int    `json:"total_cents"`
			}
			if err := json.Unmarshal(d.Payload, &v); err != nil || v.TotalCents != 4200 {
				panic(err)
			}
		})
	})
}

func relayOverhead(b *testing.B, work func(outbox.Delivery)) {
	d := &memDialect{payload: []byte(`{"order_id":"0193a1f2","email":"someone@example.com","total_cents":4200}`)}
	for range 4096 {
		d.ids = append(d.ids, outbox.NewID())
	}
	d.left.Store(int64(b.N))
	ob, err := outbox.New(d, outbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	r, err := ob.Relay(nopDB{}, outbox.RelayConfig{PollInterval: time.Millisecond, Listen: outbox.ListenOff, JanitorEvery: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	var handled atomic.Int64
	all := make(chan struct{})
	r.Handle("t", func(_ context.Context, d outbox.Delivery) error {
		work(d)
		if handled.Add(1) == int64(b.N) {
			close(all)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	go func() { done <- r.Run(ctx) }()
	<-all
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// TestIdleHandlerGoroutinesExit: the handler goroutines a burst started
// wait for more work while the relay is busy, and exit once it has been
// idle for a while (5 s), while Run goes on. Not parallel: it counts the
// handler goroutines of the whole process, other tests' relays included.
func TestIdleHandlerGoroutinesExit(t *testing.T) {
	d := &memDialect{payload: []byte(`{}`), ids: []outbox.ID{outbox.NewID()}}
	d.left.Store(400)
	ob, err := outbox.New(d, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := ob.Relay(nopDB{}, outbox.RelayConfig{PollInterval: 20 * time.Millisecond, Listen: outbox.ListenOff})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	r.Handle("t", func(context.Context, outbox.Delivery) error {
		time.Sleep(5 * time.Millisecond)
		handled.Add(1)
		return nil
	})
	workers := func() int {
		buf := make([]byte, 1<<22)
		return strings.Count(string(buf[:runtime.Stack(buf, true)]), "outbox.(*Relay).work(")
	}
	rr := start(t, r)
	eventually(t, 10*time.Second, "400 handled", func() bool { return handled.Load() == 400 })
	if n := workers(); n < 10 {
		t.Fatalf("%d handler goroutines right after a burst of 400 messages of 5 ms each, want them kept for reuse", n)
	}
	eventually(t, 15*time.Second, "idle handler goroutines gone", func() bool { return workers() == 0 })
	rr.stop(t)
}
