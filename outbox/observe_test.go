package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/outbox"
)

// obsRecorder is a RelayObserver that records what it is told.
type obsRecorder struct {
	mu        sync.Mutex
	claims    []outbox.ClaimEvent
	handled   []outbox.HandlerEvent
	settles   []outbox.SettleEvent
	dead      []outbox.DeadLetterEvent
	lost      []outbox.LeaseLostEvent
	listener  []outbox.ListenerState
	startCtxs atomic.Int64
}

type obsKey struct{}

func (o *obsRecorder) ClaimEnd(_ context.Context, e outbox.ClaimEvent) {
	o.mu.Lock()
	o.claims = append(o.claims, e)
	o.mu.Unlock()
}
func (o *obsRecorder) HandlerStart(ctx context.Context, d outbox.Delivery) context.Context {
	o.startCtxs.Add(1)
	return context.WithValue(ctx, obsKey{}, d.ID)
}
func (o *obsRecorder) HandlerEnd(ctx context.Context, e outbox.HandlerEvent) {
	if ctx.Value(obsKey{}) != e.Delivery.ID {
		panic("HandlerEnd without HandlerStart's context")
	}
	o.mu.Lock()
	o.handled = append(o.handled, e)
	o.mu.Unlock()
}
func (o *obsRecorder) SettleEnd(_ context.Context, e outbox.SettleEvent) {
	o.mu.Lock()
	o.settles = append(o.settles, e)
	o.mu.Unlock()
}
func (o *obsRecorder) DeadLettered(_ context.Context, e outbox.DeadLetterEvent) {
	o.mu.Lock()
	o.dead = append(o.dead, e)
	o.mu.Unlock()
}
func (o *obsRecorder) LeaseLost(_ context.Context, e outbox.LeaseLostEvent) {
	o.mu.Lock()
	o.lost = append(o.lost, e)
	o.mu.Unlock()
}

// fencedOff returns the outcomes the settles reported fenced off.
func (o *obsRecorder) fencedOff() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, s := range o.settles {
		n += s.FencedOff
	}
	return n
}
func (o *obsRecorder) ListenerChanged(_ context.Context, s outbox.ListenerState) {
	o.mu.Lock()
	o.listener = append(o.listener, s)
	o.mu.Unlock()
}

func (o *obsRecorder) handledN() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.handled)
}

// TestRelayObserver: the observer hears every claim, each handler's start
// (its context reaches the handler) and end with its outcome, attempt and
// duration, the dead letters with their reason, the writes of outcomes
// with their counts, and the listener going up.
func TestRelayObserver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	p := pool(t)
	obs := &obsRecorder{}
	r, err := e.ob.Relay(pgxtx.FromPool(p), fast(t, outbox.RelayConfig{Observer: obs, MaxAttempts: 2}))
	if err != nil {
		t.Fatal(err)
	}
	var ctxSeen atomic.Int64
	handler := func(err error) outbox.Handler {
		return func(ctx context.Context, d outbox.Delivery) error {
			if ctx.Value(obsKey{}) == d.ID {
				ctxSeen.Add(1)
			}
			time.Sleep(2 * time.Millisecond)
			return err
		}
	}
	boom := errors.New("boom")
	for topic, err := range map[string]error{"ok": nil, "fail": boom, "cancel": outbox.DeadLetter(boom)} {
		if err := r.Handle(topic, handler(err)); err != nil {
			t.Fatal(err)
		}
	}
	publishN(t, e, p, 3, outbox.Message{Topic: "ok"})
	publishN(t, e, p, 1, outbox.Message{Topic: "fail"})
	publishN(t, e, p, 1, outbox.Message{Topic: "cancel"})
	start(t, r)
	// ok x3, fail twice (retry, then dead at its last attempt), cancel once.
	eventually(t, 10*time.Second, "6 handler runs", func() bool { return obs.handledN() >= 6 })
	eventually(t, 10*time.Second, "all rows settled", func() bool {
		return count(t, e.table, "state IN ('pending', 'processing')") == 0
	})
	time.Sleep(100 * time.Millisecond) // the last SettleEnd follows the write
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if n := ctxSeen.Load(); n != 6 {
		t.Errorf("%d handlers saw HandlerStart's context, want 6", n)
	}
	outcomes := map[string][]string{}
	for _, h := range obs.handled {
		outcomes[h.Delivery.Topic] = append(outcomes[h.Delivery.Topic], h.Outcome.String())
		if h.Duration < 2*time.Millisecond {
			t.Errorf("%s: handler duration %v, want >= 2ms", h.Delivery.Topic, h.Duration)
		}
		if h.Outcome == outbox.OutcomeRetry && (h.RetryIn <= 0 || h.Err == nil) {
			t.Errorf("retry without delay or error: %+v", h)
		}
	}
	want := map[string]string{"ok": "done done done", "fail": "retry dead", "cancel": "dead"}
	for topic, w := range want {
		if got := strings.Join(outcomes[topic], " "); got != w {
			t.Errorf("%s: outcomes %q, want %q", topic, got, w)
		}
	}
	reasons := map[string]string{}
	for _, d := range obs.dead {
		reasons[d.Topic] = d.Reason.String()
	}
	if reasons["fail"] != "last_attempt" || reasons["cancel"] != "cancelled" || len(obs.dead) != 2 {
		t.Errorf("dead letters %+v, want fail: last_attempt and cancel: cancelled", obs.dead)
	}
	claimed, settled := 0, 0
	for _, c := range obs.claims {
		if c.Err != nil || c.Claimed > c.Limit {
			t.Errorf("claim %+v", c)
		}
		claimed += c.Claimed
	}
	for _, s := range obs.settles {
		if s.Err != nil || s.FencedOff != 0 || s.Applied != s.Count {
			t.Errorf("settle %+v", s)
		}
		settled += s.Applied
	}
	if claimed != 6 || settled != 6 {
		t.Errorf("claims took %d rows and settles applied %d outcomes, want 6 and 6", claimed, settled)
	}
	if len(obs.listener) < 2 || obs.listener[0] != outbox.ListenerConnecting || obs.listener[1] != outbox.ListenerListening {
		t.Errorf("listener states %v, want connecting, listening", obs.listener)
	}
}

// TestMiddleware: middleware wraps every handler, HandleJSON's included,
// the first element outermost, once at registration; a nil one is a
// ConfigError.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	p := pool(t)
	var mu sync.Mutex
	var trail []string
	var wrapped atomic.Int64
	mw := func(name string) outbox.Middleware {
		return func(next outbox.Handler) outbox.Handler {
			wrapped.Add(1)
			return func(ctx context.Context, d outbox.Delivery) error {
				mu.Lock()
				trail = append(trail, name+">"+d.Topic)
				mu.Unlock()
				return next(ctx, d)
			}
		}
	}
	if _, err := e.ob.Relay(pgxtx.FromPool(p), outbox.RelayConfig{Middleware: []outbox.Middleware{nil}}); err != nil {
		t.Fatalf("Relay with a nil middleware: %v (the error comes from Handle)", err)
	}
	bad, _ := e.ob.Relay(pgxtx.FromPool(p), outbox.RelayConfig{Middleware: []outbox.Middleware{nil}})
	var cerr *outbox.ConfigError
	if err := bad.Handle("x", func(context.Context, outbox.Delivery) error { return nil }); !errors.As(err, &cerr) || cerr.Field != "Middleware" {
		t.Errorf("Handle with a nil middleware: %v, want a ConfigError for Middleware", err)
	}
	r, err := e.ob.Relay(pgxtx.FromPool(p), fast(t, outbox.RelayConfig{Middleware: []outbox.Middleware{mw("a"), mw("b")}}))
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	r.Handle("plain", func(context.Context, outbox.Delivery) error {
		mu.Lock()
		trail = append(trail, "h>plain")
		mu.Unlock()
		handled.Add(1)
		return nil
	})
	outbox.HandleJSON(r, "json", func(_ context.Context, _ outbox.Delivery, v struct{ N int }) error {
		mu.Lock()
		trail = append(trail, "h>json")
		mu.Unlock()
		handled.Add(1)
		return nil
	})
	publishN(t, e, p, 1, outbox.Message{Topic: "plain"})
	start(t, r)
	eventually(t, 10*time.Second, "plain handled", func() bool { return handled.Load() == 1 })
	publishN(t, e, p, 1, outbox.Message{Topic: "json", Payload: []byte(`{"N":1}`)})
	eventually(t, 10*time.Second, "json handled", func() bool { return handled.Load() == 2 })
	mu.Lock()
	defer mu.Unlock()
	if got, want := strings.Join(trail, " "), "a>plain b>plain h>plain a>json b>json h>json"; got != want {
		t.Errorf("calls %q, want %q", got, want)
	}
	if n := wrapped.Load(); n != 4 {
		t.Errorf("middleware applied %d times, want 4 (2 per topic, at registration)", n)
	}
}

// hookRecorder is a PublishHook that adds a header and records the ends.
type hookRecorder struct {
	mu   sync.Mutex
	ends []outbox.PublishEvent
}

type hookKey struct{}

func (h *hookRecorder) PublishStart(ctx context.Context, m *outbox.Message) context.Context {
	if m.Headers == nil {
		m.Headers = map[string]string{}
	}
	m.Headers["traceparent"] = "tp-" + m.Topic
	return context.WithValue(ctx, hookKey{}, m.Topic)
}

func (h *hookRecorder) PublishEnd(_ context.Context, e outbox.PublishEvent) {
	h.mu.Lock()
	h.ends = append(h.ends, e)
	h.mu.Unlock()
}

// TestPublishHook: the hook adds headers before validation (they are
// stored; the caller's map is untouched), sees each call's end with the
// ids, and a message validation refuses reaches PublishEnd with the typed
// error, no SQL sent, the transaction usable.
func TestPublishHook(t *testing.T) {
	t.Parallel()
	hook := &hookRecorder{}
	e := newEnv(t, outbox.Config{Hook: hook})
	p := pool(t)
	ctx := context.Background()
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	mine := map[string]string{"k": "v"}
	res, err := e.ob.PublishBatch(ctx, pgxtx.From(tx), []outbox.Message{{Topic: "a", Headers: mine}, {Topic: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(mine) != 1 {
		t.Errorf("the caller's headers were changed: %v", mine)
	}
	_, err = e.ob.Publish(ctx, pgxtx.From(tx), outbox.Message{Topic: ""})
	var merr *outbox.MessageError
	if !errors.As(err, &merr) {
		t.Fatalf("Publish of an empty topic: %v, want a *MessageError", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after a refused message: %v", err)
	}
	for i, topic := range []string{"a", "b"} {
		var tp string
		if err := p.QueryRow(ctx, `SELECT headers->>'traceparent' FROM `+e.table+` WHERE id = $1`, res[i].ID.String()).Scan(&tp); err != nil {
			t.Fatal(err)
		}
		if tp != "tp-"+topic {
			t.Errorf("stored traceparent %q, want %q", tp, "tp-"+topic)
		}
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if len(hook.ends) != 2 {
		t.Fatalf("%d PublishEnd calls, want 2", len(hook.ends))
	}
	b := hook.ends[0]
	if b.Err != nil || len(b.Results) != 2 || b.Results[1].ID != res[1].ID || b.Contexts[1].Value(hookKey{}) != "b" || b.Messages[0].Headers["k"] != "v" {
		t.Errorf("batch PublishEnd %+v", b)
	}
	if f := hook.ends[1]; !errors.As(f.Err, &merr) || f.Results != nil {
		t.Errorf("refused PublishEnd %+v, want the MessageError and no results", f)
	}
}
