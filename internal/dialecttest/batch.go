package dialecttest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// batchCases are the conformance cases of batch handlers
// (Relay.HandleBatch) and of the catch-all handler (outbox.AllTopics).
var batchCases = []struct {
	name string
	f    func(t *testing.T, e *env)
}{
	{"ClaimAllTopics", claimAllTopics},
	{"BatchMixedOutcomes", batchMixedOutcomes},
	{"BatchWrongLength", batchWrongLength},
	{"BatchPanic", batchPanic},
	{"BatchFencing", batchFencing},
	{"CatchAll", catchAll},
}

// batchLog records the batches a batch handler got.
type batchLog struct {
	mu      sync.Mutex
	batches [][]outbox.Delivery
}

func (l *batchLog) add(ds []outbox.Delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches = append(l.batches, slices.Clone(ds))
}

func (l *batchLog) get() [][]outbox.Delivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.batches)
}

// idsOf returns the ids of ds.
func idsOf(ds []outbox.Delivery) []outbox.ID {
	out := make([]outbox.ID, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

// claimAllTopics: a claim of every topic (ClaimParams.AllTopics) takes the
// due messages of every topic, in claim order, never more than its limit,
// and leaves those not due.
func claimAllTopics(t *testing.T, e *env) {
	var msgs []outbox.Message
	for i := range 12 {
		msgs = append(msgs, outbox.Message{Topic: []string{"a", "b", "c", "d"}[i%4], Payload: fmt.Appendf(nil, `{"n": %d}`, i)})
	}
	msgs = append(msgs, outbox.Message{Topic: "e", Delay: time.Hour})
	res := e.publish(t, msgs...)
	topicOf := map[outbox.ID]string{}
	for i, r := range res {
		topicOf[r.ID] = msgs[i].Topic
	}
	var got []outbox.ID
	// Topics, when set, filter nothing: "a" is only a hint.
	for _, p := range []outboxdriver.ClaimParams{{AllTopics: true, Limit: 5}, {AllTopics: true, Topics: []string{"a"}, Limit: 10}} {
		p.Lease, p.MaxAttempts = time.Minute, 3
		cs := claim(t, e, p)
		if len(cs) > p.Limit {
			t.Fatalf("claim of every topic with limit %d took %d", p.Limit, len(cs))
		}
		for _, c := range cs {
			if topicOf[c.ID] != c.Topic {
				t.Errorf("claimed %s of topic %q, published as %q", c.ID, c.Topic, topicOf[c.ID])
			}
			got = append(got, c.ID)
		}
	}
	var want []outbox.ID
	for _, r := range res[:12] {
		want = append(want, r.ID)
	}
	// Published in one statement, the messages share available_at: claim
	// order is then id order, which is publish order.
	if !slices.Equal(got, want) {
		t.Errorf("claims of every topic took %v, want the 12 due messages in claim order %v", got, want)
	}
	if n := e.count(t, "topic = 'e' AND state = 'pending' AND attempts = 0"); n != 1 {
		t.Errorf("the message not due was claimed")
	}
}

// batchMixedOutcomes: one batch gets the claim's messages in claim order,
// and each outcome is settled for its own message: done, an error retried
// then done, a dead letter, a retry at a later time, an error on every
// attempt dead after MaxAttempts.
func batchMixedOutcomes(t *testing.T, e *env) {
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, outbox.Message{Topic: "b", Payload: fmt.Appendf(nil, `{"n": %d}`, i)})
	}
	res := e.publish(t, msgs...)
	index := map[outbox.ID]int{}
	for i, r := range res {
		index[r.ID] = i
	}
	var log batchLog
	e.relayWith(t, outbox.RelayConfig{MaxAttempts: 2}, func(r *outbox.Relay) error {
		return r.HandleBatch("b", func(ctx context.Context, ds []outbox.Delivery) []error {
			log.add(ds)
			errs := make([]error, len(ds))
			for i, d := range ds {
				switch index[d.ID] {
				case 1:
					if d.Attempt == 1 {
						errs[i] = errors.New("first attempt fails")
					}
				case 2:
					errs[i] = outbox.DeadLetter(errors.New("cannot ever work"))
				case 3:
					errs[i] = outbox.RetryAfter(time.Hour, errors.New("later"))
				case 4:
					errs[i] = errors.New("always fails")
				}
			}
			return errs
		})
	})
	waitFor(t, "the outcomes written", func() bool {
		return e.count(t, "state = 'dead'") == 2 && e.count(t, "") == 3
	})
	bs := log.get()
	if len(bs) == 0 || !slices.Equal(idsOf(bs[0]), idsOf(mustDeliveries(t, res))) {
		t.Fatalf("first batch %v, want the five messages in claim order", bs)
	}
	for _, d := range bs[0] {
		if d.Attempt != 1 || d.Topic != "b" || normalize([]string{string(d.Payload)})[0] != fmt.Sprintf(`{"n": %d}`, index[d.ID]) {
			t.Errorf("first batch delivered %+v", d)
		}
	}
	for _, c := range []struct {
		i     int
		where string
	}{
		{0, "1 = 0"}, // done: deleted
		{1, "1 = 0"}, // retried, then done
		{2, "state = 'dead' AND attempts = 1 AND last_error LIKE '%cannot ever work%'"},
		{3, "state = 'pending' AND attempts = 1 AND last_error LIKE '%later%'"},
		{4, "state = 'dead' AND attempts = 2 AND last_error LIKE '%always fails%'"},
	} {
		if n := e.count(t, idIs(res[c.i].ID)+" AND ("+c.where+")"); c.where != "1 = 0" && n != 1 {
			t.Errorf("message %d: not %s", c.i, c.where)
		}
		if n := e.count(t, idIs(res[c.i].ID)); c.where == "1 = 0" && n != 0 {
			t.Errorf("message %d not done", c.i)
		}
	}
	// The retry at a later time is not due within the test.
	if n := e.count(t, idIs(res[3].ID)+" AND available_at <= "+e.later(t, 50*time.Minute)); n != 0 {
		t.Errorf("RetryAfter(1h) rescheduled within 50 minutes")
	}
	// Message 1 came again (attempt 2), in a batch of its own or with 4.
	again := 0
	for _, b := range bs[1:] {
		for _, d := range b {
			if d.ID == res[1].ID && d.Attempt == 2 {
				again++
			}
			if d.ID == res[0].ID || d.ID == res[2].ID {
				t.Errorf("settled message %d delivered again", index[d.ID])
			}
		}
	}
	if again != 1 {
		t.Errorf("message 1 delivered %d times at attempt 2, want 1", again)
	}
}

// later returns SQL for the database time d from now, for e's dialect.
func (e *env) later(t *testing.T, d time.Duration) string {
	switch e.ob.Dialect().Name() {
	case "postgres":
		return fmt.Sprintf("now() + interval '%d seconds'", int(d.Seconds()))
	case "sqlite":
		// available_at is in milliseconds since 1970.
		return fmt.Sprintf("(CAST(unixepoch('subsec') * 1000 AS INTEGER) + %d)", d.Milliseconds())
	case "mysql":
		return fmt.Sprintf("UTC_TIMESTAMP(6) + INTERVAL %d SECOND", int(d.Seconds()))
	}
	t.Fatalf("no SQL for a later time on %s", e.ob.Dialect().Name())
	return ""
}

// mustDeliveries returns deliveries with the ids of res, for comparing ids.
func mustDeliveries(t *testing.T, res []outbox.Result) []outbox.Delivery {
	t.Helper()
	out := make([]outbox.Delivery, len(res))
	for i, r := range res {
		out[i].ID = r.ID
	}
	return out
}

// batchFailsAll runs a batch handler that does what bad does on its first
// call (returns a result of the wrong length, or panics) and succeeds
// after, with MaxAttempts 1: every message of the first batch is dead with
// an error that says why; a message published after is done.
func batchFailsAll(t *testing.T, e *env, bad func(ds []outbox.Delivery) []error, why string) {
	res := e.publish(t, outbox.Message{Topic: "b"}, outbox.Message{Topic: "b"}, outbox.Message{Topic: "b"})
	var mu sync.Mutex
	calls := 0
	e.relayWith(t, outbox.RelayConfig{MaxAttempts: 1}, func(r *outbox.Relay) error {
		return r.HandleBatch("b", func(ctx context.Context, ds []outbox.Delivery) []error {
			mu.Lock()
			calls++
			first := calls == 1
			mu.Unlock()
			if first {
				if len(ds) != 3 {
					t.Errorf("first batch has %d messages, want 3", len(ds))
				}
				return bad(ds)
			}
			return make([]error, len(ds))
		})
	})
	waitFor(t, "the first batch dead", func() bool { return e.count(t, "state = 'dead'") == 3 })
	for _, r := range res {
		if n := e.count(t, idIs(r.ID)+" AND state = 'dead' AND last_error LIKE '%"+why+"%'"); n != 1 {
			t.Errorf("message %s not dead with %q", r.ID, why)
		}
	}
	after := e.publish(t, outbox.Message{Topic: "b"})
	waitFor(t, "a later message done", func() bool { return e.count(t, idIs(after[0].ID)) == 0 })
}

func batchWrongLength(t *testing.T, e *env) {
	batchFailsAll(t, e, func(ds []outbox.Delivery) []error { return make([]error, len(ds)-1) }, "returned 2 outcomes for 3 deliveries")
}

func batchPanic(t *testing.T, e *env) {
	batchFailsAll(t, e, func(ds []outbox.Delivery) []error { panic("boom in batch") }, "panicked: boom in batch")
}

// fenceTracer records the settlements a relay wrote and the fences that
// applied.
type fenceTracer struct {
	mu      sync.Mutex
	settled map[outboxdriver.Fence]bool // fence: applied
}

func (*fenceTracer) TraceClaim(context.Context, []outboxdriver.Claimed, error) {}

func (f *fenceTracer) TraceSettle(_ context.Context, s []outboxdriver.Settlement, applied []outboxdriver.Fence, err error) {
	if err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, x := range s {
		f.settled[x.Fence] = slices.Contains(applied, x.Fence)
	}
}

func (f *fenceTracer) get(fence outboxdriver.Fence) (settled, applied bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	applied, settled = f.settled[fence]
	return settled, applied
}

// batchFencing: a batch whose lease lapsed while it ran (no renewal), and
// whose messages another claim took meanwhile, has its outcomes fenced
// off: they are written, apply to nothing, and the rows stay as the other
// claim left them. (Concurrency 2: the batch holds both slots, so the
// relay itself does not claim the messages again.)
func batchFencing(t *testing.T, e *env) {
	res := e.publish(t, outbox.Message{Topic: "b"}, outbox.Message{Topic: "b"})
	tr := &fenceTracer{settled: map[outboxdriver.Fence]bool{}}
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.relayWith(t, outbox.RelayConfig{Lease: time.Second, DisableLeaseRenewal: true, Tracer: tr, Concurrency: 2}, func(r *outbox.Relay) error {
		return r.HandleBatch("b", func(ctx context.Context, ds []outbox.Delivery) []error {
			once.Do(func() { close(started) })
			<-release
			errs := make([]error, len(ds))
			errs[len(ds)-1] = errors.New("stale failure")
			return errs
		})
	})
	<-started
	time.Sleep(1300 * time.Millisecond) // the lease lapses
	cs := claim(t, e, outboxdriver.ClaimParams{Topics: []string{"b"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5})
	close(release)
	if len(cs) != 2 {
		t.Fatalf("the other claim took %d messages, want both", len(cs))
	}
	for _, r := range res {
		waitFor(t, "the stale outcome written", func() bool { settled, _ := tr.get(outboxdriver.Fence{ID: r.ID, Attempts: 1}); return settled })
		if _, applied := tr.get(outboxdriver.Fence{ID: r.ID, Attempts: 1}); applied {
			t.Errorf("the stale batch's outcome of %s applied", r.ID)
		}
		if n := e.count(t, idIs(r.ID)+" AND state = 'processing' AND attempts = 2"); n != 1 {
			t.Errorf("message %s: the stale batch changed the other claim's row", r.ID)
		}
	}
}

// catchAll: a relay with an exact handler and a catch-all claims every
// topic; the exact registration wins for its topic; the catch-all gets the
// others (several topics in one batch); the relay's stats report no
// unhandled topic.
func catchAll(t *testing.T, e *env) {
	var mu sync.Mutex
	exact := map[string]int{}
	var log batchLog
	msgs := []outbox.Message{{Topic: "a"}, {Topic: "b"}, {Topic: "c"}, {Topic: "a"}, {Topic: "d.e"}, {Topic: outbox.AllTopics}}
	e.publish(t, msgs...)
	r, err := e.ob.Relay(e.DB, outbox.RelayConfig{PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Handle("a", func(_ context.Context, d outbox.Delivery) error {
		mu.Lock()
		exact[d.Topic]++
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.HandleBatch(outbox.AllTopics, func(_ context.Context, ds []outbox.Delivery) []error {
		log.add(ds)
		return make([]error, len(ds))
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.Handle(outbox.AllTopics, func(context.Context, outbox.Delivery) error { return nil }); !errors.Is(err, outbox.ErrDuplicateHandler) {
		t.Errorf("a second catch-all: %v, want ErrDuplicateHandler", err)
	}
	rs, err := r.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Unhandled) != 0 || len(rs.Idle) != 0 {
		t.Errorf("stats with a catch-all: unhandled %q, idle %q; want none", rs.Unhandled, rs.Idle)
	}
	StartRelay(t, r)
	waitFor(t, "every topic delivered", func() bool { return e.count(t, "") == 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(exact) != 1 || exact["a"] != 2 {
		t.Errorf("the exact handler got %v, want a twice", exact)
	}
	var topics []string
	for _, b := range log.get() {
		for _, d := range b {
			topics = append(topics, d.Topic)
		}
	}
	slices.Sort(topics)
	if want := []string{outbox.AllTopics, "b", "c", "d.e"}; !slices.Equal(topics, want) {
		t.Errorf("the catch-all got %q, want %q", topics, want)
	}
}

// orderedClaimAllTopics: an ordered claim of every topic takes the heads
// of every topic, and no topic cuts a run.
func orderedClaimAllTopics(t *testing.T, e *env) {
	ids := resIDs(e.publish(t, outbox.Message{Topic: "q", Key: "K"}, outbox.Message{Topic: "x", Key: "K"}, outbox.Message{Topic: "z", Key: "K"},
		outbox.Message{Topic: "w", Key: "L"}))
	cs, _, err := e.od(t).ClaimOrdered(context.Background(), e.DB, e.ob.Table(), outboxdriver.ClaimParams{
		Topics: []string{"x"}, AllTopics: true, Limit: 10, Lease: time.Minute, MaxAttempts: 3}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 {
		t.Fatalf("claimed %d heads, want 2 (K of topic q, L of topic w)", len(cs))
	}
	for _, c := range cs {
		switch c.ID {
		case ids[0]:
			if len(c.Run) != 2 || c.Run[0].ID != ids[1] || c.Run[1].ID != ids[2] || c.Run[1].Topic != "z" {
				t.Errorf("K's run %v, want its two later messages (topics x, z)", c.Run)
			}
		case ids[3]:
		default:
			t.Errorf("claimed %s (topic %s), not a head", c.ID, c.Topic)
		}
	}
}

// orderedBatchRun: with ordered delivery, a batch holds a head and its
// run, in key order; when a run's message fails, the key's later
// messages are not done even though the handler returned nil for them
// (they stay blocked), and are delivered again after it: never settled
// before it. Other keys flow.
func orderedBatchRun(t *testing.T, e *env) {
	release := make(chan struct{})
	var log batchLog
	ids := resIDs(e.publish(t, outbox.Message{Topic: "x", Key: "K", Payload: []byte(`{"n": 0}`)}, outbox.Message{Topic: "x", Key: "K", Payload: []byte(`{"n": 1}`)},
		outbox.Message{Topic: "x", Key: "K", Payload: []byte(`{"n": 2}`)}, outbox.Message{Topic: "x", Key: "L"}))
	e.relayWith(t, outbox.RelayConfig{MaxAttempts: outbox.UnlimitedAttempts, BatchSize: 10}, func(r *outbox.Relay) error {
		return r.HandleBatch("x", func(ctx context.Context, ds []outbox.Delivery) []error {
			log.add(ds)
			errs := make([]error, len(ds))
			for i, d := range ds {
				if d.ID == ids[1] {
					select {
					case <-release:
					default:
						errs[i] = errors.New("not yet")
					}
				}
			}
			return errs
		})
	})
	waitFor(t, "K's second message failing again", func() bool { return e.count(t, idIs(ids[1])+" AND attempts >= 3") == 1 })
	if got := e.states(t, ids[2]); got != "blocked" {
		t.Errorf("K's third message %s while its second fails, want blocked", got)
	}
	if n := e.count(t, idIs(ids[0])+" OR "+idIs(ids[3])); n != 0 {
		t.Errorf("%d of K's first message and L's not done", n)
	}
	close(release)
	waitFor(t, "all delivered", func() bool { return e.count(t, "") == 0 })
	bs := log.get()
	if len(bs) == 0 {
		t.Fatal("no batch")
	}
	if got := idsOf(bs[0]); len(got) != 4 || !slices.Equal(got[:3], []outbox.ID{ids[0], ids[1], ids[2]}) && !slices.Equal(got[1:], []outbox.ID{ids[0], ids[1], ids[2]}) {
		t.Errorf("first batch %v, want K's three messages in key order and L's", got)
	}
	// Within every batch K's messages come in key order; the third's last
	// delivery is not before the second's.
	last := map[outbox.ID]int{}
	n := 0
	for _, b := range bs {
		prev := -1
		for _, d := range b {
			n++
			last[d.ID] = n
			if i := slices.Index(ids[:3], d.ID); i >= 0 {
				if i <= prev {
					t.Errorf("batch %v has K out of order", idsOf(b))
				}
				prev = i
			}
		}
	}
	if last[ids[2]] < last[ids[1]] {
		t.Errorf("K's third message last delivered before its second")
	}
}

// orderedBatchMixedHandlers: a key whose messages alternate between a
// topic with a batch handler and one with a Handler is delivered in key
// order: a batch's run stops before the Handler's topic, and a Handler's
// run hands a batch handler's message to it as a batch of one.
func orderedBatchMixedHandlers(t *testing.T, e *env) {
	var mu sync.Mutex
	seq := map[string][]string{} // key -> payloads, in delivery order
	record := func(d outbox.Delivery, how string) {
		mu.Lock()
		defer mu.Unlock()
		seq[d.Key] = append(seq[d.Key], fmt.Sprintf("%s %s %d", normalize([]string{string(d.Payload)})[0], how, d.Attempt))
	}
	var msgs []outbox.Message
	for i := range 6 {
		for _, k := range []string{"K", "L"} {
			topic := []string{"x", "y"}[i%2] // K starts on x (batch), L on y after one x
			if k == "L" {
				topic = []string{"y", "x"}[i%2]
			}
			msgs = append(msgs, outbox.Message{Topic: topic, Key: k, Payload: fmt.Appendf(nil, `{"n": %d}`, i)})
		}
	}
	e.publish(t, msgs...)
	e.relayWith(t, outbox.RelayConfig{BatchSize: 10}, func(r *outbox.Relay) error {
		if err := r.HandleBatch("x", func(_ context.Context, ds []outbox.Delivery) []error {
			for _, d := range ds {
				record(d, "batch")
			}
			return make([]error, len(ds))
		}); err != nil {
			return err
		}
		return r.Handle("y", func(_ context.Context, d outbox.Delivery) error { record(d, "one"); return nil })
	})
	waitFor(t, "all delivered", func() bool { return e.count(t, "") == 0 })
	mu.Lock()
	defer mu.Unlock()
	for _, k := range []string{"K", "L"} {
		var want []string
		for i := range 6 {
			how := []string{"batch", "one"}[i%2]
			if k == "L" {
				how = []string{"one", "batch"}[i%2]
			}
			want = append(want, fmt.Sprintf(`{"n": %d} %s 1`, i, how)) // each at its first attempt
		}
		if !slices.Equal(seq[k], want) {
			t.Errorf("key %s delivered %q, want %q", k, seq[k], want)
		}
	}
}
