package natsfwd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	natsfwd "github.com/oncommit/oncommit/forward/nats"
	"github.com/oncommit/oncommit/internal/fwdtest"
	"github.com/oncommit/oncommit/outbox"
)

// e2e is NATS JetStream's part in fwdtest.RunE2E: a stream "<run>.>",
// a durable consumer "ledger" with explicit acks and a 2 s AckWait.
func e2e(t testing.TB) fwdtest.E2E {
	url := natsURL(t)
	addrOf := func(addr string) string { return "nats://" + addr }
	return fwdtest.E2E{
		Broker: strings.TrimPrefix(url, "nats://"),
		Setup: func(t testing.TB, run, addr string) {
			_, js := connect(t, addrOf(addr))
			ctx := context.Background()
			s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: run, Subjects: []string{run + ".>"}, Duplicates: 20 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), run) })
			if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "ledger", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, MaxDeliver: -1}); err != nil {
				t.Fatal(err)
			}
		},
		Forward: func(ctx context.Context, t testing.TB, run, addr string) fwdtest.BatchHandler {
			js := e2eConnect(t, addrOf(addr))
			return forwarder(t, js, func(topic string) string { return run + "." + topic }, natsfwd.Config{AckTimeout: 2 * time.Second}).Handler()
		},
		Consume: func(ctx context.Context, t testing.TB, run, addr string, ib *outbox.Inbox, b pgxtx.Beginner, apply fwdtest.Apply, seen func(string)) error {
			js := e2eConnect(t, addrOf(addr))
			c := fwdtest.Startup(t, "the ledger consumer", func() (jetstream.Consumer, error) { return js.Consumer(ctx, run, "ledger") })
			return natsfwd.Consume(ctx, c, ib, b, natsfwd.ConsumeConfig{
				Name: "ledger", DeadLetterSubject: run + ".dead", JetStream: js, RetryDelay: 50 * time.Millisecond,
				OnOutcome: func(o natsfwd.Outcome) {
					if o.Repeat {
						seen(o.ID)
					}
				},
			}, func(ctx context.Context, tx pgx.Tx, m jetstream.Msg) error { return apply(ctx, tx, m.Data()) })
		},
	}
}

// e2eConnect connects a child of the e2e run to url, retrying while the
// parent's chaos keeps the broker away.
func e2eConnect(t testing.TB, url string) jetstream.JetStream {
	nc := fwdtest.Startup(t, "connect to NATS", func() (*nats.Conn, error) {
		return nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Timeout(2*time.Second))
	})
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestE2E: 5,000 messages from a producing service's outbox, forwarded to
// JetStream by relays and applied to a ledger by consumers with the inbox,
// while relays and consumers are SIGKILLed and the broker's connections
// cut: each is applied exactly once.
func TestE2E(t *testing.T) {
	fwdtest.RunE2E(t, "TestHelperE2E", e2e(t), fwdtest.DefaultE2E)
}

func TestHelperE2E(t *testing.T) {
	if !fwdtest.IsE2EChild() {
		t.Skip("helper process of TestE2E")
	}
	fwdtest.E2EChild(t, e2e(t))
}

// consumeEnv is an inbox and a ledger in a fresh schema, a stream with a
// consumer, and a connection.
type consumeEnv struct {
	js     jetstream.JetStream
	cons   jetstream.Consumer
	subj   string
	ib     *outbox.Inbox
	b      pgxtx.Beginner
	ledger string
}

func newConsumeEnv(t *testing.T) consumeEnv {
	t.Parallel()
	_, js := connect(t, natsURL(t))
	s, subj := stream(t, js, time.Minute)
	cons, err := s.CreateOrUpdateConsumer(context.Background(), jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := fwdtest.NewLedger(t)
	return consumeEnv{js: js, cons: cons, subj: subj("orders"), ib: l.Inbox, b: l.Begin, ledger: l.Table}
}

func (e consumeEnv) publish(t *testing.T, id string) {
	t.Helper()
	m := &nats.Msg{Subject: e.subj, Data: []byte(`{}`), Header: nats.Header{}}
	if id != "" {
		m.Header.Set(jetstream.MsgIDHeader, id)
	}
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

func (e consumeEnv) ledgerRows(t *testing.T) []string {
	t.Helper()
	return fwdtest.Ledger{Table: e.ledger}.Rows(t)
}

// outcomes collects a consumer's outcomes.
type outcomes struct {
	mu  sync.Mutex
	all []natsfwd.Outcome
}

func (o *outcomes) add(x natsfwd.Outcome) { o.mu.Lock(); o.all = append(o.all, x); o.mu.Unlock() }
func (o *outcomes) get() []natsfwd.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]natsfwd.Outcome(nil), o.all...)
}

// TestConsumeOnceAndPoison: a message failing every attempt is dead-lettered after
// MaxAttempts deliveries (to a subject, with its reason) and terminated;
// a message without an id is dead-lettered at once; one failing once is
// applied on its second delivery.
func TestConsumeOnceAndPoison(t *testing.T) {
	e := newConsumeEnv(t)
	dead := "dead-" + strings.ReplaceAll(e.subj, ".", "-")
	// The dead letters go to a stream of their own.
	if _, err := e.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: strings.ReplaceAll(dead, ".", "_"), Subjects: []string{dead}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.js.DeleteStream(context.Background(), strings.ReplaceAll(dead, ".", "_")) })
	var got outcomes
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	failedOnce := false
	go func() {
		done <- natsfwd.Consume(ctx, e.cons, e.ib, e.b, natsfwd.ConsumeConfig{Name: "ledger", MaxAttempts: 3, RetryDelay: 20 * time.Millisecond, DeadLetterSubject: dead, JetStream: e.js, OnOutcome: got.add},
			func(ctx context.Context, tx pgx.Tx, m jetstream.Msg) error {
				id := m.Headers().Get(jetstream.MsgIDHeader)
				if id == "poison" {
					return errors.New("cannot apply")
				}
				if id == "flaky" && !failedOnce {
					failedOnce = true
					return errors.New("once")
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+e.ledger+` VALUES ($1)`, id)
				return err
			})
	}()
	e.publish(t, "m-1")
	e.publish(t, "poison")
	e.publish(t, "")
	e.publish(t, "flaky")
	deadline := time.Now().Add(20 * time.Second)
	for len(e.ledgerRows(t)) < 2 || countDead(got.get()) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("ledger %v, outcomes %+v", e.ledgerRows(t), got.get())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if rows := e.ledgerRows(t); fmt.Sprint(rows) != "[flaky m-1]" {
		t.Fatalf("ledger %v, want [flaky m-1]", rows)
	}
	var poisonAttempts int
	for _, o := range got.get() {
		if o.ID == "poison" {
			poisonAttempts = max(poisonAttempts, o.Attempt)
		}
	}
	if poisonAttempts != 3 {
		t.Fatalf("poison dead-lettered after %d deliveries, want 3", poisonAttempts)
	}
	ds, err := e.js.Stream(context.Background(), strings.ReplaceAll(dead, ".", "_"))
	if err != nil {
		t.Fatal(err)
	}
	for seq, want := range map[uint64]string{1: "", 2: "poison/dead"} {
		m, err := ds.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		if id := m.Header.Get(jetstream.MsgIDHeader); id != want {
			t.Fatalf("dead letter %d: id %q, want %q", seq, id, want)
		}
		if m.Header.Get(natsfwd.DeadReasonHeader) == "" {
			t.Fatalf("dead letter %d has no reason", seq)
		}
	}
}

func countDead(os []natsfwd.Outcome) int {
	n := 0
	for _, o := range os {
		if o.Dead {
			n++
		}
	}
	return n
}

// TestConsumeRedelivered: a message whose acknowledgement was lost (the
// consumer's process died after the commit) is delivered again and found a
// repeat: applied once.
func TestConsumeRedelivered(t *testing.T) {
	e := newConsumeEnv(t)
	e.publish(t, "m-1")
	// A first consumer applies m-1 but never acknowledges it (as a process
	// killed between its commit and its ack).
	it, err := e.cons.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	for m := range it.Messages() {
		if _, err := outbox.Receive(context.Background(), e.ib, e.b, "ledger", m.Headers().Get(jetstream.MsgIDHeader), func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+e.ledger+` VALUES ('m-1')`)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if err := m.Nak(); err != nil { // redeliver now rather than after AckWait
			t.Fatal(err)
		}
	}
	var got outcomes
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- natsfwd.Consume(ctx, e.cons, e.ib, e.b, natsfwd.ConsumeConfig{Name: "ledger", DeadLetter: func(context.Context, jetstream.Msg, error) error { return nil }, OnOutcome: got.add},
			func(ctx context.Context, tx pgx.Tx, m jetstream.Msg) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+e.ledger+` VALUES ('m-1')`)
				return err
			})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(got.get()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no redelivery")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if o := got.get()[0]; !o.Repeat || o.Attempt != 2 {
		t.Fatalf("redelivery: %+v, want a repeat on attempt 2", o)
	}
	if rows := e.ledgerRows(t); len(rows) != 1 {
		t.Fatalf("ledger %v, want m-1 once", rows)
	}
}

// TestConsumeConfig: a consumer without a name or a dead letter is
// refused before it reads anything.
func TestConsumeConfig(t *testing.T) {
	var ce *natsfwd.ConfigError
	for _, cfg := range []natsfwd.ConsumeConfig{
		{DeadLetterSubject: "d"},
		{Name: "x"},
		{Name: "x", DeadLetterSubject: "d"},
	} {
		err := natsfwd.Consume(context.Background(), nil, nil, pgxtx.Beginner{}, cfg, func(context.Context, pgx.Tx, jetstream.Msg) error { return nil })
		if !errors.As(err, &ce) {
			t.Fatalf("%+v: %v, want a ConfigError", cfg, err)
		}
	}
}

// TestConsumeDeleted: Consume returns an error once its consumer is
// deleted, rather than waiting for good.
func TestConsumeDeleted(t *testing.T) {
	e := newConsumeEnv(t)
	done := make(chan error, 1)
	go func() {
		done <- natsfwd.Consume(context.Background(), e.cons, e.ib, e.b, natsfwd.ConsumeConfig{Name: "ledger", DeadLetter: func(context.Context, jetstream.Msg, error) error { return nil }},
			func(context.Context, pgx.Tx, jetstream.Msg) error { return nil })
	}()
	time.Sleep(200 * time.Millisecond)
	info := e.cons.CachedInfo()
	if err := e.js.DeleteConsumer(context.Background(), info.Stream, info.Name); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Consume returned nil after its consumer was deleted")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Consume still runs 15 s after its consumer was deleted")
	}
}
