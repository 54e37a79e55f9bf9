package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/outbox"
)

// TestSettleFailureRetried: a settle statement that fails once (a
// transient error) is written again after a backoff; the messages are
// not delivered again after their lease. Before the fix the outcomes were
// dropped: the success came back after the 30 s lease, the retry stayed
// processing until then.
func TestSettleFailureRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	var failDelete, failRetry atomic.Int32
	failDelete.Store(1)
	failRetry.Store(1)
	db := &faultDB{inner: pgxtx.FromPool(pool(t)), fail: func(q string) error {
		switch {
		case isSettleDelete(q) && failDelete.Add(-1) >= 0:
			return errors.New("injected settle failure (delete)")
		case strings.Contains(q, "SET state = 'pending', last_error") && failRetry.Add(-1) >= 0:
			return errors.New("injected settle failure (retry)")
		}
		return nil
	}}
	// One poll a minute and no listener: after the first claim, the
	// settler, not a claim, writes the outcomes.
	r, err := e.ob.Relay(db, fast(t, outbox.RelayConfig{PollInterval: time.Minute, Listen: outbox.ListenOff, Lease: 30 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	var okRuns, failRuns atomic.Int32
	r.Handle("ok", func(context.Context, outbox.Delivery) error { okRuns.Add(1); return nil })
	r.Handle("fail", func(context.Context, outbox.Delivery) error {
		failRuns.Add(1)
		return outbox.RetryAfter(time.Hour, errors.New("later"))
	})
	publishN(t, e, pool(t), 1, outbox.Message{Topic: "ok"})
	publishN(t, e, pool(t), 1, outbox.Message{Topic: "fail"})
	start(t, r)
	eventually(t, 5*time.Second, "success written despite one failed delete", func() bool { return count(t, e.table, `topic = 'ok'`) == 0 })
	eventually(t, 5*time.Second, "retry written despite one failed update", func() bool {
		return count(t, e.table, `topic = 'fail' AND state = 'pending' AND last_error LIKE '%later'`) == 1
	})
	if failDelete.Load() >= 0 || failRetry.Load() >= 0 {
		t.Error("the injected failures did not happen")
	}
	if okRuns.Load() != 1 || failRuns.Load() != 1 {
		t.Errorf("handlers ran %d and %d times, want once each", okRuns.Load(), failRuns.Load())
	}
}
