package dialecttest

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

// retryAtClamped: a handler asking for a retry at a time no timestamp
// column stores (year 300000, 5001 BC) gets a stored retry, clamped into
// 1970-9999: the far one waits, the past one is due at once; no settle
// fails.
func retryAtClamped(t *testing.T, e *env) {
	tr := NewTrace()
	var pastRuns atomic.Int32
	e.relay(t, outbox.RelayConfig{Tracer: tr}, map[string]outbox.Handler{
		"far": func(context.Context, outbox.Delivery) error {
			return outbox.RetryAt(time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC), errors.New("much later"))
		},
		"past": func(_ context.Context, d outbox.Delivery) error {
			pastRuns.Add(1)
			if d.Attempt == 1 {
				return outbox.RetryAt(time.Date(-5000, 1, 1, 0, 0, 0, 0, time.FixedZone("x", 3600)), errors.New("long ago"))
			}
			return nil
		},
	})
	far := e.publish(t, outbox.Message{Topic: "far"}, outbox.Message{Topic: "past"})[0]
	waitFor(t, "far rescheduled", func() bool { return e.count(t, idIs(far.ID)+" AND state = 'pending' AND attempts = 1") == 1 })
	waitFor(t, "past delivered on its second attempt", func() bool { return e.count(t, "topic = 'past'") == 0 })
	if n := pastRuns.Load(); n != 2 {
		t.Errorf("past ran %d times, want 2", n)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, err := range append(tr.settleErrs, tr.claimErrs...) {
		t.Errorf("a claim or settle failed: %v", err)
	}
}

// unlimitedAttempts: MaxAttempts above what the attempts column holds is
// refused when the relay is built; UnlimitedAttempts claims and retries
// without errors.
func unlimitedAttempts(t *testing.T, e *env) {
	if _, err := e.ob.Relay(e.DB, outbox.RelayConfig{MaxAttempts: math.MaxInt32 + 1}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("MaxAttempts over int32: %v, want ErrInvalidConfig", err)
	}
	tr := NewTrace()
	var runs atomic.Int32
	e.relay(t, outbox.RelayConfig{MaxAttempts: outbox.UnlimitedAttempts, Tracer: tr}, map[string]outbox.Handler{
		"t": func(context.Context, outbox.Delivery) error {
			if runs.Add(1) < 4 {
				return errors.New("not yet")
			}
			return nil
		},
	})
	e.publish(t, outbox.Message{Topic: "t"})
	waitFor(t, "delivered on the fourth attempt", func() bool { return e.count(t, "") == 0 })
	tr.CheckClaimedOnce(t, 4, nil)
}
