package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// TestRelayDelivers: every message is delivered once, through every DB
// adapter, and success deletes the row.
func TestRelayDelivers(t *testing.T) {
	for _, tc := range []struct {
		name string
		db   func(t *testing.T) outbox.DB
	}{
		{"pgxpool", func(t *testing.T) outbox.DB { return pgxtx.FromPool(pgtest.Pool(t)) }},
		{"pgxstdlib", func(t *testing.T) outbox.DB { return pgxtx.FromStdlib(pgtest.Open(t, "pgx")) }},
		{"libpq", func(t *testing.T) outbox.DB { return sqltx.FromDB(pgtest.Open(t, "postgres")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{})
			rec := newRecorder()
			r, err := e.ob.Relay(tc.db(t), fast(t, outbox.RelayConfig{BatchSize: 7}))
			if err != nil {
				t.Fatal(err)
			}
			var key, payload, header atomic.Value
			if err := r.Handle("order.placed", func(ctx context.Context, d outbox.Delivery) error {
				rec.add(d)
				key.Store(d.Key)
				payload.Store(string(d.Payload))
				header.Store(d.Headers["trace"])
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			ids := publishN(t, e, pool(t), 50, outbox.Message{Topic: "order.placed", Key: "k", Payload: []byte(`{"n":1}`), Headers: map[string]string{"trace": "t1"}})
			start(t, r)
			eventually(t, 10*time.Second, "50 deliveries", func() bool { return rec.count() >= 50 })
			eventually(t, 5*time.Second, "empty table", func() bool { return count(t, e.table, "") == 0 })
			for _, id := range ids {
				if a := rec.attempts(id); len(a) != 1 || a[0] != 1 {
					t.Errorf("message %s delivered with attempts %v, want [1]", id, a)
				}
			}
			if key.Load() != "k" || payload.Load() != `{"n": 1}` || header.Load() != "t1" {
				t.Errorf("delivery fields: key %v payload %v header %v", key.Load(), payload.Load(), header.Load())
			}
		})
	}
}

func newRelay(t *testing.T, e *env, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	r, err := e.ob.Relay(pgxtx.FromPool(pool(t)), fast(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRetryThenSuccess: a failure is retried with backoff; the second attempt
// succeeds.
func TestRetryThenSuccess(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	r := newRelay(t, e, outbox.RelayConfig{})
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		rec.add(d)
		if d.Attempt == 1 {
			return errors.New("flaky")
		}
		return nil
	})
	ids := publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
	start(t, r)
	eventually(t, 10*time.Second, "gone", func() bool { return count(t, e.table, "") == 0 })
	if a := rec.attempts(ids[0]); len(a) != 2 || a[0] != 1 || a[1] != 2 {
		t.Errorf("attempts %v, want [1 2]", a)
	}
}

// TestDeadLetterThenRedrive: a message failing every attempt is dead after
// MaxAttempts runs; redrive makes it deliverable again.
func TestDeadLetterThenRedrive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	var fail atomic.Bool
	fail.Store(true)
	rec := newRecorder()
	r := newRelay(t, e, outbox.RelayConfig{MaxAttempts: 3})
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		rec.add(d)
		if fail.Load() {
			return errors.New("boom\x00 with a NUL and \xff bad UTF-8")
		}
		return nil
	})
	ids := publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
	run := start(t, r)
	eventually(t, 10*time.Second, "dead", func() bool { s, _, _ := rowState(t, e, ids[0]); return s == "dead" })
	state, attempts, lastErr := rowState(t, e, ids[0])
	if attempts != 3 || !strings.Contains(lastErr, "boom") {
		t.Errorf("dead row: %s attempts %d last_error %q", state, attempts, lastErr)
	}
	time.Sleep(200 * time.Millisecond) // several polls: dead stays dead
	if a := rec.attempts(ids[0]); len(a) != 3 {
		t.Errorf("handler ran %d times, want 3", len(a))
	}
	fail.Store(false)
	db := pgxtx.FromPool(pool(t))
	if n, err := e.ob.Redrive(context.Background(), db, "other-topic"); err != nil || n != 0 {
		t.Errorf("redrive of another topic: %d, %v", n, err)
	}
	if n, err := e.ob.Redrive(context.Background(), db, "t"); err != nil || n != 1 {
		t.Errorf("redrive: %d, %v", n, err)
	}
	eventually(t, 10*time.Second, "delivered after redrive", func() bool { return count(t, e.table, "") == 0 })
	if a := rec.attempts(ids[0]); len(a) != 4 || a[3] != 1 {
		t.Errorf("attempts %v, want a fresh attempt 1 after redrive", a)
	}
	run.stop(t)
}

// TestCancelAndInvalidPayload: DeadLetter and a payload that does not decode or
// validate dead-letter at once, after one attempt.
func TestCancelAndInvalidPayload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	r := newRelay(t, e, outbox.RelayConfig{MaxAttempts: 5})
	var runs atomic.Int32
	r.Handle("cancel", func(ctx context.Context, d outbox.Delivery) error {
		runs.Add(1)
		return outbox.DeadLetter(errors.New("customer deleted"))
	})
	if err := outbox.HandleJSON(r, "typed", func(ctx context.Context, d outbox.Delivery, o order) error {
		runs.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	p := pool(t)
	cancelled := publishN(t, e, p, 1, outbox.Message{Topic: "cancel"})
	badJSON := publishN(t, e, p, 1, outbox.Message{Topic: "typed", Payload: []byte(`{"id": 5}`)})
	invalid := publishN(t, e, p, 1, outbox.Message{Topic: "typed", Payload: []byte(`{"id": ""}`)})
	noPayload := publishN(t, e, p, 1, outbox.Message{Topic: "typed"})
	good := publishN(t, e, p, 1, outbox.Message{Topic: "typed", Payload: []byte(`{"id": "A-1"}`)})
	start(t, r)
	for _, id := range []outbox.ID{cancelled[0], badJSON[0], invalid[0], noPayload[0]} {
		eventually(t, 10*time.Second, "dead", func() bool { s, _, _ := rowState(t, e, id); return s == "dead" })
		if _, attempts, lastErr := rowState(t, e, id); attempts != 1 || lastErr == "" {
			t.Errorf("%s: attempts %d, last error %q; want dead after 1 attempt", id, attempts, lastErr)
		}
	}
	eventually(t, 10*time.Second, "good delivered", func() bool { s, _, _ := rowState(t, e, good[0]); return s == "gone" })
	if n := runs.Load(); n != 2 {
		t.Errorf("handler bodies ran %d times, want 2 (cancel once, the good one once)", n)
	}
	if _, _, le := rowState(t, e, cancelled[0]); !strings.Contains(le, "customer deleted") {
		t.Errorf("cancel reason not recorded: %q", le)
	}
}

type order struct {
	ID string `json:"id"`
}

func (o order) Validate() error {
	if o.ID == "" {
		return errors.New("id is required")
	}
	return nil
}

// TestRetrySignal: RetryAfter reschedules on the database clock and counts
// an attempt.
func TestRetrySignal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	r := newRelay(t, e, outbox.RelayConfig{})
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		rec.add(d)
		if d.Attempt == 1 {
			return outbox.RetryAfter(time.Hour, errors.New("rate limited"))
		}
		return nil
	})
	ids := publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
	start(t, r)
	eventually(t, 10*time.Second, "rescheduled", func() bool {
		return count(t, e.table, `state = 'pending' AND attempts = 1 AND available_at > now() + interval '59 minutes'`) == 1
	})
	time.Sleep(200 * time.Millisecond)
	if a := rec.attempts(ids[0]); len(a) != 1 {
		t.Errorf("delivered %d times before its time", len(a))
	}
	if _, _, le := rowState(t, e, ids[0]); !strings.Contains(le, "rate limited") {
		t.Errorf("last_error %q", le)
	}
}

// TestRelayDisabled: no handlers means Run refuses to start, and messages
// of topics without a handler are never claimed.
func TestRelayDisabled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	r := newRelay(t, e, outbox.RelayConfig{})
	if err := r.Run(context.Background()); !errors.Is(err, outbox.ErrNoHandlers) {
		t.Fatalf("Run without handlers: %v", err)
	}
	r = newRelay(t, e, outbox.RelayConfig{})
	rec := newRecorder()
	r.Handle("mine", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	if err := r.Handle("mine", func(context.Context, outbox.Delivery) error { return nil }); !errors.Is(err, outbox.ErrDuplicateHandler) {
		t.Errorf("second handler: %v", err)
	}
	p := pool(t)
	publishN(t, e, p, 5, outbox.Message{Topic: "theirs"})
	publishN(t, e, p, 1, outbox.Message{Topic: "mine"})
	run := start(t, r)
	eventually(t, 10*time.Second, "mine delivered", func() bool { return rec.count() == 1 })
	time.Sleep(200 * time.Millisecond)
	if n := count(t, e.table, `topic = 'theirs' AND state = 'pending' AND attempts = 0`); n != 5 {
		t.Errorf("%d untouched messages of a topic without handler, want 5", n)
	}
	if err := r.Handle("late", func(context.Context, outbox.Delivery) error { return nil }); !errors.Is(err, outbox.ErrRelayStarted) {
		t.Errorf("Handle after Run: %v", err)
	}
	run.stop(t)
	if err := r.Run(context.Background()); !errors.Is(err, outbox.ErrRelayStarted) {
		t.Errorf("second Run: %v", err)
	}
}

// TestConcurrencyBound: no more than Concurrency handlers run at once, and
// the bound is reached.
func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	r := newRelay(t, e, outbox.RelayConfig{Concurrency: 3, BatchSize: 10})
	var now, peak atomic.Int32
	var done atomic.Int32
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		n := now.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(30 * time.Millisecond)
		now.Add(-1)
		done.Add(1)
		return nil
	})
	publishN(t, e, pool(t), 30, outbox.Message{Topic: "t"})
	start(t, r)
	eventually(t, 20*time.Second, "all done", func() bool { return done.Load() == 30 })
	if p := peak.Load(); p != 3 {
		t.Errorf("peak concurrency %d, want 3", p)
	}
}

// TestPanicCountsAsFailure: a panicking handler is recovered and retried.
func TestPanicCountsAsFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	var logs logBuffer
	r := newRelay(t, e, outbox.RelayConfig{Logger: logs.logger()})
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		rec.add(d)
		if d.Attempt == 1 {
			panic("nil map")
		}
		return nil
	})
	ids := publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
	start(t, r)
	eventually(t, 10*time.Second, "delivered", func() bool { return count(t, e.table, "") == 0 })
	if a := rec.attempts(ids[0]); len(a) != 2 {
		t.Errorf("attempts %v", a)
	}
	if !strings.Contains(logs.String(), "handler panicked") {
		t.Error("panic not logged")
	}
}

// TestShutdownCancelsStuckHandler: past the grace period Run cancels the
// handler's context and returns; the message is delivered again after its
// lease by another relay.
func TestShutdownCancelsStuckHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	r := newRelay(t, e, outbox.RelayConfig{ShutdownGrace: 300 * time.Millisecond, Lease: time.Second, DisableLeaseRenewal: true})
	started := make(chan struct{})
	var sawCancel atomic.Bool
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		close(started)
		<-ctx.Done()
		sawCancel.Store(true)
		return ctx.Err()
	})
	ids := publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
	run := start(t, r)
	<-started
	begin := time.Now()
	run.stop(t)
	if took := time.Since(begin); took > 300*time.Millisecond+250*time.Millisecond {
		t.Errorf("Run returned %v after cancel, want within grace + 250ms", took)
	}
	if !sawCancel.Load() {
		t.Error("handler context not cancelled")
	}
	// The cancelled handler's error is a retry; either way the message
	// comes back and a second relay delivers it.
	r2 := newRelay(t, e, outbox.RelayConfig{})
	rec := newRecorder()
	r2.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	start(t, r2)
	eventually(t, 10*time.Second, "redelivered", func() bool { return rec.count() == 1 })
	if a := rec.attempts(ids[0]); a[0] != 2 {
		t.Errorf("redelivered as attempt %v, want 2", a)
	}
}

// TestDrainOnShutdown: handlers running at shutdown finish within the grace
// period and their outcomes are written before Run returns.
func TestDrainOnShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	r := newRelay(t, e, outbox.RelayConfig{Concurrency: 50, BatchSize: 50, ShutdownGrace: 5 * time.Second})
	var inFlight atomic.Int32
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		inFlight.Add(1)
		time.Sleep(300 * time.Millisecond)
		return nil
	})
	publishN(t, e, pool(t), 50, outbox.Message{Topic: "t"})
	run := start(t, r)
	eventually(t, 10*time.Second, "50 in flight", func() bool { return inFlight.Load() == 50 })
	run.stop(t)
	if n := count(t, e.table, ""); n != 0 {
		t.Errorf("%d messages left after a drained shutdown, want 0", n)
	}
}

// TestNoSettleAfterRun: a handler that ignores its context keeps running
// past the grace period; Run returns within grace + 250 ms anyway, and the
// handler's late outcome is dropped, not written: the message stays
// processing until its lease lapses and is delivered again.
func TestNoSettleAfterRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	var logs logBuffer
	r := newRelay(t, e, outbox.RelayConfig{ShutdownGrace: 200 * time.Millisecond, Logger: logs.logger()})
	started := make(chan struct{})
	finished := make(chan struct{})
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		close(started)
		time.Sleep(time.Second) // ignores ctx
		defer close(finished)
		return nil
	})
	ids := publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
	run := start(t, r)
	<-started
	begin := time.Now()
	run.stop(t)
	if took := time.Since(begin); took > 200*time.Millisecond+250*time.Millisecond {
		t.Errorf("Run returned after %v, want within grace + 250ms", took)
	}
	<-finished
	time.Sleep(100 * time.Millisecond)
	if s, a, _ := rowState(t, e, ids[0]); s != "processing" || a != 1 {
		t.Errorf("row is %s with %d attempts after Run returned; a late outcome landed", s, a)
	}
	eventually(t, 5*time.Second, "drop logged", func() bool { return strings.Contains(logs.String(), "outcomes dropped") })
}
