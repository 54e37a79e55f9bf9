package dialecttest

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/oncommit/oncommit/outbox"
)

// The fan-out cases: a topic with two subscribers (Config.Subscribers),
// each copy delivered, retried and dead-lettered on its own; with
// OrderByKey, each subscriber's copies of a key in order, whatever the
// other subscriber does.

const fanTopic = "order.placed"

var fanSubs = map[string][]string{fanTopic: {"mail", "fwd"}}

func runFanOut(t *testing.T, h Harness) {
	runCases(t, h, outbox.Config{Subscribers: fanSubs}, []envCase{
		{"FanOutPublish", fanOutPublish},
		{"FanOutOneFails", fanOutOneFails},
		{"FanOutDeadLetters", fanOutDeadLetters},
		{"FanOutConfig", fanOutConfig},
		{"FanOutPlainRows", fanOutPlainRows},
	})
	if h.Dialect.Capabilities().Ordered {
		runCases(t, h, outbox.Config{Subscribers: fanSubs, OrderByKey: true}, []envCase{
			{"FanOutOrdered", fanOutOrdered},
			{"FanOutOrderedDead", fanOutOrderedDead},
		})
	}
}

// fanLog records the deliveries of each subscriber.
type fanLog struct {
	mu sync.Mutex
	by map[string][]outbox.Delivery
}

func (l *fanLog) add(d outbox.Delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = map[string][]outbox.Delivery{}
	}
	l.by[d.Subscriber] = append(l.by[d.Subscriber], d)
}

func (l *fanLog) get(sub string) []outbox.Delivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.by[sub])
}

// payloads returns the payloads of ds (each a JSON number), in order.
func payloads(ds []outbox.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = string(d.Payload)
	}
	return out
}

func fanMsg(i int, key string) outbox.Message {
	return outbox.Message{Topic: fanTopic, Key: key, Payload: []byte(strconv.Itoa(i))}
}

func fanOutPublish(t *testing.T, e *env) {
	ctx := context.Background()
	res := e.publish(t, fanMsg(1, "k1"), outbox.Message{Topic: "plain", Key: "k1"},
		outbox.Message{Topic: fanTopic, DedupKey: "d1"})
	if len(res[0].Copies) != 2 || res[0].ID != res[0].Copies[0] || res[0].Copies[0] == res[0].Copies[1] {
		t.Fatalf("fan-out result %+v: want two distinct copies, ID the first", res[0])
	}
	if res[1].Copies != nil || res[1].ID.IsZero() {
		t.Fatalf("plain result %+v", res[1])
	}
	if got := e.count(t, "1 = 1"); got != 5 {
		t.Fatalf("%d rows, want 5 (two copies of each fan-out message, one plain)", got)
	}
	// The same dedup key again: every copy is a duplicate.
	again := e.publish(t, outbox.Message{Topic: fanTopic, DedupKey: "d1"})
	if !again[0].Duplicate || !again[0].ID.IsZero() || again[0].Copies[0] != (outbox.ID{}) || again[0].Copies[1] != (outbox.ID{}) {
		t.Fatalf("second publish of dedup key d1: %+v, want a duplicate", again[0])
	}
	if got := e.count(t, "1 = 1"); got != 5 {
		t.Fatalf("%d rows after the duplicate, want 5", got)
	}
	// Operators see each copy's subscriber, and the message's key.
	page, err := e.ob.List(ctx, e.DB, outbox.Filter{Subscriber: "fwd"}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Messages) != 2 {
		t.Fatalf("fwd's copies: %d, want 2", len(page.Messages))
	}
	for _, m := range page.Messages {
		if m.Subscriber != "fwd" || m.Topic != fanTopic {
			t.Fatalf("copy %+v", m)
		}
	}
	if m := page.Messages[0]; m.ID != res[0].Copies[1] || m.Key != "k1" {
		t.Fatalf("fwd's first copy %v key %q, want %v key k1", m.ID, m.Key, res[0].Copies[1])
	}
	if m := page.Messages[1]; m.DedupKey != "d1" || m.Key != "" {
		t.Fatalf("fwd's second copy: key %q dedup %q, want no key, dedup d1", m.Key, m.DedupKey)
	}
	n, err := e.ob.Count(ctx, e.DB, outbox.Filter{Subscriber: "mail", Key: "k1"})
	if err != nil || n != 1 {
		t.Fatalf("mail's copies of key k1: %d, %v; want 1", n, err)
	}
	if n, err = e.ob.Count(ctx, e.DB, outbox.Filter{Key: "k1"}); err != nil || n != 1 {
		t.Fatalf("messages of key k1 without a subscriber: %d, %v; want 1 (the plain one)", n, err)
	}
	// The separator is refused in keys before any SQL; the transaction
	// stays usable.
	tx := e.Begin(t)
	for _, m := range []outbox.Message{{Topic: fanTopic, Key: "a\x1fb"}, {Topic: "plain", DedupKey: "mail\x1fd1"}} {
		_, err := e.ob.Publish(ctx, tx.Tx, m)
		var me *outbox.MessageError
		if !errors.As(err, &me) || !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Fatalf("publish %+v: %v, want a MessageError", m, err)
		}
	}
	if _, err := e.ob.Publish(ctx, tx.Tx, fanMsg(2, "")); err != nil {
		t.Fatalf("publish after refusals: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := e.count(t, "1 = 1"); got != 7 {
		t.Fatalf("%d rows, want 7", got)
	}
	// One subscriber: one copy, still a copy.
	solo, err := outbox.New(e.ob.Dialect(), outbox.Config{Table: e.Table, Subscribers: map[string][]string{"solo": {"only"}}})
	if err != nil {
		t.Fatal(err)
	}
	tx = e.Begin(t)
	r, err := solo.Publish(ctx, tx.Tx, outbox.Message{Topic: "solo"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if len(r.Copies) != 1 || r.Copies[0] != r.ID {
		t.Fatalf("one subscriber's result %+v: want one copy, its id the ID", r)
	}
	if n, err := e.ob.Count(ctx, e.DB, outbox.Filter{Subscriber: "only"}); err != nil || n != 1 {
		t.Fatalf("copies of subscriber only: %d, %v; want 1", n, err)
	}
}

// fanOutPlainRows: a topic's rows stored without subscribers (published
// before the topic had them, or through an Outbox without them) fail in a
// relay that only subscribes, clearly and without harming the copies, and
// are delivered by the topic's own handler (Handle) once one is there.
func fanOutPlainRows(t *testing.T, e *env) {
	ctx := context.Background()
	plain, err := outbox.New(e.ob.Dialect(), outbox.Config{Table: e.Table})
	if err != nil {
		t.Fatal(err)
	}
	tx := e.Begin(t)
	old, err := plain.Publish(ctx, tx.Tx, fanMsg(0, "k"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	e.publish(t, fanMsg(1, "k"))
	var log fanLog
	h := func(_ context.Context, d outbox.Delivery) error { log.add(d); return nil }
	stop := e.fanRelay(t, outbox.RelayConfig{MaxAttempts: 2}, h, h)
	waitFor(t, "the copies delivered, the plain row dead", func() bool {
		return e.count(t, "1 = 1") == 1 && e.count(t, "state = 'dead'") == 1
	})
	stop()
	m, err := e.ob.Get(ctx, e.DB, old.ID)
	if err != nil || m.Subscriber != "" || !strings.Contains(m.LastError, "register one with Handle") {
		t.Fatalf("the plain row: %+v, %v; want dead, its error naming Handle", m, err)
	}
	if len(log.get("mail")) != 1 || len(log.get("fwd")) != 1 || len(log.get("")) != 0 {
		t.Fatalf("deliveries: mail %d, fwd %d, plain %d; want 1, 1, 0", len(log.get("mail")), len(log.get("fwd")), len(log.get("")))
	}
	// With the topic's own handler beside the subscribers' handlers.
	if n, err := e.ob.Redrive(ctx, e.DB, fanTopic); err != nil || n != 1 {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	stop = e.relayWith(t, outbox.RelayConfig{}, func(r *outbox.Relay) error {
		if err := r.Handle(fanTopic, h); err != nil {
			return err
		}
		if err := r.Subscribe(fanTopic, "mail", h); err != nil {
			return err
		}
		return r.Subscribe(fanTopic, "fwd", h)
	})
	waitFor(t, "the plain row delivered", func() bool { return e.count(t, "1 = 1") == 0 })
	stop()
	if ds := log.get(""); len(ds) != 1 || ds[0].ID != old.ID || ds[0].Key != "k" {
		t.Fatalf("the topic's own handler got %+v, want the plain row", ds)
	}
}

// fanRelay runs a relay with a handler per subscriber of fanTopic.
func (e *env) fanRelay(t *testing.T, cfg outbox.RelayConfig, mail, fwd outbox.Handler) (stop func()) {
	t.Helper()
	return e.relayWith(t, cfg, func(r *outbox.Relay) error {
		if err := r.Subscribe(fanTopic, "mail", mail); err != nil {
			return err
		}
		return r.Subscribe(fanTopic, "fwd", fwd)
	})
}

// fanBatchRelay is fanRelay with fwd a batch handler (a forwarder's
// shape) running fwd on each delivery of its batches.
func (e *env) fanBatchRelay(t *testing.T, cfg outbox.RelayConfig, mail, fwd outbox.Handler) (stop func()) {
	t.Helper()
	return e.relayWith(t, cfg, func(r *outbox.Relay) error {
		if err := r.Subscribe(fanTopic, "mail", mail); err != nil {
			return err
		}
		return r.SubscribeBatch(fanTopic, "fwd", func(ctx context.Context, ds []outbox.Delivery) []error {
			errs := make([]error, len(ds))
			for i, d := range ds {
				errs[i] = fwd(ctx, d)
			}
			return errs
		})
	})
}

// fanOutOneFails: mail fails each message failures times; fwd (through
// SubscribeJSON), which succeeds, sees each message once.
func fanOutOneFails(t *testing.T, e *env) {
	const msgs, failures = 5, 3
	var log fanLog
	var mu sync.Mutex
	failed := map[string]int{}
	var ms []outbox.Message
	for i := range msgs {
		ms = append(ms, fanMsg(i, "k"+strconv.Itoa(i)))
	}
	e.publish(t, ms...)
	mailH := func(_ context.Context, d outbox.Delivery) error {
		log.add(d)
		mu.Lock()
		defer mu.Unlock()
		if failed[string(d.Payload)] < failures {
			failed[string(d.Payload)]++
			return errors.New("mail server down")
		}
		return nil
	}
	stop := e.relayWith(t, outbox.RelayConfig{MaxAttempts: failures + 1}, func(r *outbox.Relay) error {
		if err := r.Subscribe(fanTopic, "mail", mailH); err != nil {
			return err
		}
		return outbox.SubscribeJSON(r, fanTopic, "fwd", func(_ context.Context, d outbox.Delivery, n int) error {
			if strconv.Itoa(n) != string(d.Payload) {
				t.Errorf("fwd decoded %d from %s", n, d.Payload)
			}
			log.add(d)
			return nil
		})
	})
	waitFor(t, "every copy settled", func() bool { return e.count(t, "1 = 1") == 0 })
	stop()
	fwd, mail := log.get("fwd"), log.get("mail")
	if p := payloads(fwd); len(p) != msgs || len(uniq(p)) != msgs {
		t.Fatalf("fwd saw %v, want each of %d messages once", p, msgs)
	}
	if len(mail) != msgs*(failures+1) {
		t.Fatalf("mail saw %d deliveries, want %d", len(mail), msgs*(failures+1))
	}
	attempts := map[string][]int{}
	for _, d := range mail {
		attempts[string(d.Payload)] = append(attempts[string(d.Payload)], d.Attempt)
	}
	for p, a := range attempts {
		if !slices.Equal(a, []int{1, 2, 3, 4}) {
			t.Fatalf("mail's attempts of message %s: %v, want 1 2 3 4 (its own count)", p, a)
		}
	}
	for _, d := range append(fwd, mail...) {
		i, _ := strconv.Atoi(string(d.Payload))
		if d.Topic != fanTopic || d.Key != "k"+strconv.Itoa(i) {
			t.Fatalf("delivery %+v: want topic %s and the message's own key", d, fanTopic)
		}
		if d.Attempt != 1 && d.Subscriber == "fwd" {
			t.Fatalf("fwd's delivery %+v is not a first attempt", d)
		}
	}
	// The two subscribers' copies of one message have different ids.
	ids := map[outbox.ID]string{}
	for _, d := range append(fwd, mail...) {
		if s, ok := ids[d.ID]; ok && s != d.Subscriber {
			t.Fatalf("id %v delivered to %s and %s", d.ID, s, d.Subscriber)
		}
		ids[d.ID] = d.Subscriber
	}
}

func uniq(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// fanOutDeadLetters: mail's copies die (max attempts and a cancel); fwd's
// are delivered. The dead letters are mail's alone, in List, Stats and
// redrive, which delivers to mail only.
func fanOutDeadLetters(t *testing.T, e *env) {
	ctx := context.Background()
	const msgs = 4
	var ms []outbox.Message
	for i := range msgs {
		ms = append(ms, fanMsg(i, ""))
	}
	e.publish(t, ms...)
	var log fanLog
	var healthy sync.Mutex
	broken := true
	mail := func(_ context.Context, d outbox.Delivery) error {
		log.add(d)
		healthy.Lock()
		defer healthy.Unlock()
		switch {
		case !broken:
			return nil
		case string(d.Payload) == "0":
			return outbox.DeadLetter(errors.New("bad address"))
		}
		return errors.New("mail server down")
	}
	fwd := func(_ context.Context, d outbox.Delivery) error { log.add(d); return nil }
	stop := e.fanBatchRelay(t, outbox.RelayConfig{MaxAttempts: 2}, mail, fwd)
	waitFor(t, "mail's copies dead, fwd's delivered", func() bool {
		return e.count(t, "state = 'dead'") == msgs && e.count(t, "1 = 1") == msgs
	})
	stop()
	for sub, want := range map[string]int{"mail": msgs, "fwd": 0} {
		n, err := e.ob.Count(ctx, e.DB, outbox.Filter{Subscriber: sub, States: []outbox.State{outbox.StateDead}})
		if err != nil || n != int64(want) {
			t.Fatalf("dead copies of %s: %d, %v; want %d", sub, n, err, want)
		}
	}
	st, err := e.ob.Stats(ctx, e.DB)
	if err != nil {
		t.Fatal(err)
	}
	var mailStats *outbox.TopicStats
	for i := range st {
		if st[i].Topic == fanTopic && st[i].Subscriber == "mail" {
			mailStats = &st[i]
		} else if st[i].Topic == fanTopic {
			t.Fatalf("stats of another subscriber with no copy left: %+v", st[i])
		}
	}
	if mailStats == nil || mailStats.Dead != msgs || mailStats.Pending != 0 {
		t.Fatalf("mail's stats %+v, want %d dead", mailStats, msgs)
	}
	fwdSeen := len(log.get("fwd"))
	if fwdSeen != msgs {
		t.Fatalf("fwd saw %d deliveries, want %d", fwdSeen, msgs)
	}
	// Redrive mail's dead letters: mail gets them again, fwd nothing.
	healthy.Lock()
	broken = false
	healthy.Unlock()
	n, err := e.ob.Act(ctx, e.DB, outbox.ActRedrive, outbox.Filter{Topic: fanTopic, Subscriber: "mail"}, nil)
	if err != nil || n != msgs {
		t.Fatalf("redrive mail's dead letters: %d, %v; want %d", n, err, msgs)
	}
	stop = e.fanRelay(t, outbox.RelayConfig{MaxAttempts: 2}, mail, fwd)
	waitFor(t, "the redriven copies delivered", func() bool { return e.count(t, "1 = 1") == 0 })
	stop()
	if got := len(log.get("fwd")); got != fwdSeen {
		t.Fatalf("fwd saw %d deliveries after mail's redrive, want %d (no more)", got, fwdSeen)
	}
	last := log.get("mail")
	if p := payloads(last[len(last)-msgs:]); len(uniq(p)) != msgs {
		t.Fatalf("mail's deliveries after the redrive: %v", p)
	}
}

// fanOutConfig: what a relay refuses about subscribers.
func fanOutConfig(t *testing.T, e *env) {
	ok := func(context.Context, outbox.Delivery) error { return nil }
	newRelay := func() *outbox.Relay {
		r, err := e.ob.Relay(e.DB, outbox.RelayConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var ce *outbox.ConfigError
	r := newRelay()
	if err := r.Subscribe(fanTopic, "sms", ok); !errors.As(err, &ce) {
		t.Fatalf("Subscribe of an unknown subscriber: %v, want a ConfigError", err)
	}
	if err := r.Subscribe("plain", "mail", ok); !errors.As(err, &ce) {
		t.Fatalf("Subscribe to a topic without subscribers: %v, want a ConfigError", err)
	}
	if err := r.Subscribe(fanTopic, "mail", ok); err != nil {
		t.Fatal(err)
	}
	if err := r.Subscribe(fanTopic, "mail", ok); !errors.Is(err, outbox.ErrDuplicateHandler) {
		t.Fatalf("second Subscribe of mail: %v, want ErrDuplicateHandler", err)
	}
	// fwd has no handler: Run refuses, rather than claim fwd's copies.
	if err := r.Run(context.Background()); !errors.As(err, &ce) {
		t.Fatalf("Run without fwd's handler: %v, want a ConfigError", err)
	}
	if e.ob.Dialect().Capabilities().AllTopics {
		r = newRelay()
		if err := r.Handle(outbox.AllTopics, ok); err != nil {
			t.Fatal(err)
		}
		if err := r.Run(context.Background()); !errors.As(err, &ce) {
			t.Fatalf("Run of a catch-all without the subscribers' handlers: %v, want a ConfigError", err)
		}
	}
	for _, subs := range []map[string][]string{
		{fanTopic: {}}, {fanTopic: {"a", "a"}}, {fanTopic: {"a b"}}, {outbox.AllTopics: {"a"}}, {"": {"a"}},
	} {
		if _, err := outbox.New(e.ob.Dialect(), outbox.Config{Subscribers: subs}); !errors.As(err, &ce) {
			t.Fatalf("Subscribers %v: %v, want a ConfigError", subs, err)
		}
	}
}

// fanOutOrdered: with OrderByKey, mail's first message of key k0 fails
// until released; fwd (a batch handler) gets every message of both keys
// in order meanwhile, and mail then gets each key's messages in order.
func fanOutOrdered(t *testing.T, e *env) {
	const perKey = 4
	keys := []string{"k0", "k1"}
	var ms []outbox.Message
	for i := range perKey {
		for _, k := range keys {
			ms = append(ms, fanMsg(i, k))
		}
	}
	e.publish(t, ms...)
	var log fanLog
	release := make(chan struct{})
	var failures int
	var mu sync.Mutex
	mail := func(_ context.Context, d outbox.Delivery) error {
		log.add(d)
		if d.Key == "k0" && string(d.Payload) == "0" {
			select {
			case <-release:
			default:
				mu.Lock()
				failures++
				mu.Unlock()
				return errors.New("mail server down")
			}
		}
		return nil
	}
	fwd := func(_ context.Context, d outbox.Delivery) error { log.add(d); return nil }
	stop := e.fanBatchRelay(t, outbox.RelayConfig{}, mail, fwd)
	waitFor(t, "fwd has every message while mail's head of k0 fails", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(log.get("fwd")) == len(ms) && failures >= 2
	})
	// Nothing of k0 after its failing head reached mail.
	for _, d := range log.get("mail") {
		if d.Key == "k0" && string(d.Payload) != "0" {
			t.Fatalf("mail got %s of k0 before the key's first message succeeded", d.Payload)
		}
	}
	close(release)
	waitFor(t, "every copy settled", func() bool { return e.count(t, "1 = 1") == 0 })
	stop()
	for _, sub := range []string{"mail", "fwd"} {
		byKey := map[string][]string{}
		for _, d := range log.get(sub) {
			byKey[d.Key] = append(byKey[d.Key], string(d.Payload))
		}
		for _, k := range keys {
			got := slices.Compact(byKey[k]) // mail's retries of k0's head
			if want := []string{"0", "1", "2", "3"}; !slices.Equal(got, want) {
				t.Fatalf("%s got key %s as %v, want %v", sub, k, byKey[k], want)
			}
		}
	}
	if got := payloads(log.get("fwd")); len(got) != len(ms) {
		t.Fatalf("fwd saw %d deliveries, want %d: %v", len(got), len(ms), got)
	}
}

// fanOutOrderedDead: under the Halt policy mail's dead head halts mail's
// copies of its key only; fwd's copies of that key are all delivered.
func fanOutOrderedDead(t *testing.T, e *env) {
	ctx := context.Background()
	var ms []outbox.Message
	for i := range 3 {
		ms = append(ms, fanMsg(i, "k"))
	}
	e.publish(t, ms...)
	var log fanLog
	mail := func(_ context.Context, d outbox.Delivery) error {
		log.add(d)
		if string(d.Payload) == "0" {
			return outbox.DeadLetter(errors.New("bad address"))
		}
		return nil
	}
	fwd := func(_ context.Context, d outbox.Delivery) error { log.add(d); return nil }
	stop := e.fanRelay(t, outbox.RelayConfig{}, mail, fwd)
	waitFor(t, "fwd's copies delivered, mail's key halted", func() bool {
		return len(log.get("fwd")) == 3 && e.count(t, "state = 'dead'") == 1
	})
	stop()
	if p := payloads(log.get("fwd")); !slices.Equal(p, []string{"0", "1", "2"}) {
		t.Fatalf("fwd got %v, want 0 1 2", p)
	}
	if p := payloads(log.get("mail")); !slices.Equal(p, []string{"0"}) {
		t.Fatalf("mail got %v, want 0 only (its key halted)", p)
	}
	page, err := e.ob.List(ctx, e.DB, outbox.Filter{Subscriber: "mail"}, 100)
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for _, m := range page.Messages {
		states = append(states, string(m.State))
		if m.Key != "k" || m.Subscriber != "mail" {
			t.Fatalf("copy %+v", m)
		}
	}
	if want := []string{"dead", "blocked", "blocked"}; !slices.Equal(states, want) {
		t.Fatalf("mail's copies %v, want %v", states, want)
	}
	if !page.Messages[0].HaltsKey() {
		t.Fatalf("mail's dead head %+v does not halt its key", page.Messages[0])
	}
	ks, err := e.ob.SubscriberKeyState(ctx, e.DB, "mail", "k")
	if err != nil || ks.Head.ID != page.Messages[0].ID || ks.Blocked != 2 {
		t.Fatalf("mail's key k: %+v, %v; want its dead head, 2 blocked", ks, err)
	}
	if ks, err = e.ob.SubscriberKeyState(ctx, e.DB, "fwd", "k"); err != nil || !ks.Head.ID.IsZero() || ks.Blocked != 0 {
		t.Fatalf("fwd's key k: %+v, %v; want no head", ks, err)
	}
	// Skipping mail's dead head moves mail's key on, and mail alone.
	n, err := e.ob.Act(ctx, e.DB, outbox.ActSkip, outbox.Filter{Subscriber: "mail", Key: "k"}, nil)
	if err != nil || n != 1 {
		t.Fatalf("skip mail's head: %d, %v; want 1", n, err)
	}
	stop = e.fanRelay(t, outbox.RelayConfig{}, mail, fwd)
	waitFor(t, "mail's next copies delivered", func() bool { return len(log.get("mail")) == 3 })
	stop()
	if p := payloads(log.get("mail")); !slices.Equal(p, []string{"0", "1", "2"}) {
		t.Fatalf("mail got %v after the skip, want 0 1 2", p)
	}
	if p := payloads(log.get("fwd")); len(p) != 3 {
		t.Fatalf("fwd got %v after mail's skip, want its 3 deliveries only", p)
	}
}
