package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/forward/rabbitmq"
	"github.com/oncommit/oncommit/internal/fwdtest"
	"github.com/oncommit/oncommit/internal/receive"
	"github.com/oncommit/oncommit/outbox"
)

// e2e is RabbitMQ's part in fwdtest.RunE2E: a direct exchange "<run>"
// bound with routing key "orders" to a durable classic queue "<run>", and
// a queue "<run>.dead" for dead letters.
func e2e(t testing.TB) fwdtest.E2E {
	url := rabbitURL(t)
	u, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	urlOf := func(addr string) string {
		host, port, _ := net.SplitHostPort(addr)
		v := u
		v.Host = host
		v.Port, _ = strconv.Atoi(port)
		return v.String()
	}
	return fwdtest.E2E{
		Broker: net.JoinHostPort(u.Host, strconv.Itoa(u.Port)),
		Setup: func(t testing.TB, run, addr string) {
			ch := channel(t, urlOf(addr))
			if err := ch.ExchangeDeclare(run, "direct", true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ch.ExchangeDelete(run, false, false) })
			for _, q := range []string{run, run + ".dead"} {
				declare(t, ch, q, nil)
			}
			if err := ch.QueueBind(run, "orders", run, false, nil); err != nil {
				t.Fatal(err)
			}
		},
		Forward: func(ctx context.Context, t testing.TB, run, addr string) fwdtest.BatchHandler {
			f := fwdtest.Startup(t, "the forwarder", func() (*rabbitmq.Forwarder, error) {
				return rabbitmq.New(urlOf(addr), rabbitmq.Config{Exchange: run, ConfirmTimeout: 2 * time.Second})
			})
			t.Cleanup(func() { f.Close() })
			return f.Handler()
		},
		Consume: func(ctx context.Context, t testing.TB, run, addr string, ib *outbox.Inbox, b pgxtx.Beginner, apply fwdtest.Apply, seen func(string)) error {
			return rabbitmq.Consume(ctx, urlOf(addr), ib, b, rabbitmq.ConsumeConfig{
				Name: "ledger", Queue: run, DeadLetterRoutingKey: run + ".dead", RetryDelay: 50 * time.Millisecond, ConfirmTimeout: 2 * time.Second,
				OnOutcome: func(o rabbitmq.Outcome) {
					if o.Repeat {
						seen(o.ID)
					}
				},
			}, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error { return apply(ctx, tx, d.Body) })
		},
	}
}

// TestE2E: 5,000 messages from a producing service's outbox, forwarded to
// RabbitMQ by relays and applied to a ledger by consumers with the inbox,
// while relays and consumers are SIGKILLed and the broker's connections
// cut and stalled: each is applied exactly once.
func TestE2E(t *testing.T) {
	fwdtest.RunE2E(t, "TestHelperE2E", e2e(t), fwdtest.DefaultE2E)
}

func TestHelperE2E(t *testing.T) {
	if !fwdtest.IsE2EChild() {
		t.Skip("helper process of TestE2E")
	}
	fwdtest.E2EChild(t, e2e(t))
}

// channel returns a channel on a connection to url, closed when t ends.
func channel(t testing.TB, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// declare declares a durable queue with args, deleted when t ends.
func declare(t testing.TB, ch *amqp.Channel, name string, args amqp.Table) {
	t.Helper()
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(name, false, false, false) })
}

// queue types under test: a classic queue gives no delivery count, a
// quorum queue gives x-delivery-count.
var queueTypes = []struct {
	name string
	args amqp.Table
}{
	{"classic", nil},
	{"quorum", amqp.Table{"x-queue-type": "quorum"}},
}

// consumeEnv is an inbox and a ledger in a fresh schema, a queue of its
// own and a channel.
type consumeEnv struct {
	url    string
	ch     *amqp.Channel
	queue  string
	ib     *outbox.Inbox
	b      pgxtx.Beginner
	ledger string
}

func newConsumeEnv(t *testing.T, args amqp.Table) consumeEnv {
	url := rabbitURL(t)
	e := consumeEnv{url: url, ch: channel(t, url), queue: "occons." + randomHex()}
	declare(t, e.ch, e.queue, args)
	l := fwdtest.NewLedger(t)
	e.ib, e.b, e.ledger = l.Inbox, l.Begin, l.Table
	return e
}

func randomHex() string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return hex.EncodeToString(r[:])
}

// publish sends a message with message-id id ("": none) to e's queue.
func (e consumeEnv) publish(t *testing.T, id string) {
	t.Helper()
	if err := e.ch.PublishWithContext(context.Background(), "", e.queue, true, false, amqp.Publishing{MessageId: id, Body: []byte(`{}`), DeliveryMode: amqp.Persistent}); err != nil {
		t.Fatal(err)
	}
}

// insert is an effect: one ledger row with d's message-id.
func (e consumeEnv) insert(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+e.ledger+` VALUES ($1)`, d.MessageId)
	return err
}

func (e consumeEnv) ledgerRows(t *testing.T) []string {
	t.Helper()
	return fwdtest.Ledger{Table: e.ledger}.Rows(t)
}

// consume runs Consume on e's queue at url (e's when "") until the
// returned stop, which returns Consume's error.
func (e consumeEnv) consume(url string, cfg rabbitmq.ConsumeConfig, fn func(context.Context, pgx.Tx, amqp.Delivery) error) (stop func() error) {
	if url == "" {
		url = e.url
	}
	if cfg.Name == "" {
		cfg.Name = "ledger"
	}
	cfg.Queue = e.queue
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rabbitmq.Consume(ctx, url, e.ib, e.b, cfg, fn) }()
	return func() error {
		cancel()
		return <-done
	}
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get takes the messages in queue.
func get(t *testing.T, ch *amqp.Channel, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// outcomes collects a consumer's outcomes.
type outcomes struct {
	mu  sync.Mutex
	all []rabbitmq.Outcome
}

func (o *outcomes) add(x rabbitmq.Outcome) { o.mu.Lock(); o.all = append(o.all, x); o.mu.Unlock() }
func (o *outcomes) get() []rabbitmq.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]rabbitmq.Outcome(nil), o.all...)
}

func (o *outcomes) count(f func(rabbitmq.Outcome) bool) int {
	n := 0
	for _, x := range o.get() {
		if f(x) {
			n++
		}
	}
	return n
}

// TestConsumeOnceAndPoison: a message failing every attempt is
// dead-lettered after MaxAttempts deliveries (published to a queue, with
// its reason) and acknowledged; a message without an id is dead-lettered
// at once; one failing once is applied on its second delivery. On a
// classic queue the attempts are counted in memory, on a quorum queue from
// x-delivery-count.
func TestConsumeOnceAndPoison(t *testing.T) {
	t.Parallel()
	for _, qt := range queueTypes {
		t.Run(qt.name, func(t *testing.T) {
			t.Parallel()
			e := newConsumeEnv(t, qt.args)
			dead := e.queue + ".dead"
			declare(t, e.ch, dead, nil)
			var got outcomes
			failedOnce := false
			stop := e.consume("", rabbitmq.ConsumeConfig{MaxAttempts: 3, RetryDelay: 20 * time.Millisecond, DeadLetterRoutingKey: dead, OnOutcome: got.add},
				func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
					if d.MessageId == "poison" {
						return errors.New("cannot apply")
					}
					if d.MessageId == "flaky" && !failedOnce {
						failedOnce = true
						return errors.New("once")
					}
					return e.insert(ctx, tx, d)
				})
			e.publish(t, "m-1")
			e.publish(t, "poison")
			e.publish(t, "")
			e.publish(t, "flaky")
			isDead := func(o rabbitmq.Outcome) bool { return o.Dead }
			waitFor(t, func() string { return fmt.Sprintf("ledger %v, outcomes %+v", e.ledgerRows(t), got.get()) },
				func() bool { return len(e.ledgerRows(t)) == 2 && got.count(isDead) == 2 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if rows := e.ledgerRows(t); fmt.Sprint(rows) != "[flaky m-1]" {
				t.Fatalf("ledger %v, want [flaky m-1]", rows)
			}
			var poison []int
			for _, o := range got.get() {
				if o.ID == "poison" {
					poison = append(poison, o.Attempt)
					if o.Attempt > 1 && !o.Redelivered {
						t.Errorf("poison attempt %d not flagged redelivered", o.Attempt)
					}
				}
			}
			if fmt.Sprint(poison) != "[1 2 3]" {
				t.Fatalf("poison delivered as attempts %v, want [1 2 3] (dead after 3)", poison)
			}
			if rest := get(t, e.ch, e.queue); len(rest) != 0 {
				t.Fatalf("%d messages left in the queue, want 0 (dead letters acknowledged)", len(rest))
			}
			letters := map[string]amqp.Delivery{}
			for _, d := range get(t, e.ch, dead) {
				letters[d.MessageId] = d
			}
			if len(letters) != 2 {
				t.Fatalf("dead letters %v, want 2", letters)
			}
			for id, reason := range map[string]string{"poison/dead": "cannot apply", "": receive.ErrNoID.Error()} {
				d, ok := letters[id]
				if !ok {
					t.Fatalf("no dead letter with message-id %q", id)
				}
				if r, _ := d.Headers[rabbitmq.DeadReasonHeader].(string); !strings.Contains(r, reason) {
					t.Errorf("dead letter %q: reason %q, want it to say %q", id, r, reason)
				}
				if string(d.Body) != `{}` || d.DeliveryMode != amqp.Persistent {
					t.Errorf("dead letter %q: body %q, delivery mode %d", id, d.Body, d.DeliveryMode)
				}
			}
		})
	}
}

// TestConsumeDeadLetterModes: a poison message goes to the DeadLetter
// func (with its reason), or is rejected to the queue's own dead-letter
// exchange; when its dead letter fails (unroutable), it is not
// acknowledged but stays in the queue.
func TestConsumeDeadLetterModes(t *testing.T) {
	t.Parallel()
	fail := func(context.Context, pgx.Tx, amqp.Delivery) error { return errors.New("cannot apply") }
	t.Run("func", func(t *testing.T) {
		t.Parallel()
		e := newConsumeEnv(t, nil)
		var mu sync.Mutex
		var letters []string
		var got outcomes
		stop := e.consume("", rabbitmq.ConsumeConfig{MaxAttempts: 2, RetryDelay: 10 * time.Millisecond, OnOutcome: got.add,
			DeadLetter: func(_ context.Context, d amqp.Delivery, reason error) error {
				mu.Lock()
				letters = append(letters, d.MessageId+": "+reason.Error())
				mu.Unlock()
				return nil
			}}, fail)
		e.publish(t, "poison")
		waitFor(t, func() string { return fmt.Sprint(got.get()) }, func() bool { return got.count(func(o rabbitmq.Outcome) bool { return o.Dead }) == 1 })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(letters) != "[poison: cannot apply]" {
			t.Fatalf("dead letters %q, want poison's once", letters)
		}
		if rest := get(t, e.ch, e.queue); len(rest) != 0 {
			t.Fatalf("%d messages left in the queue, want 0", len(rest))
		}
	})
	t.Run("reject", func(t *testing.T) {
		t.Parallel()
		url := rabbitURL(t)
		dlq := "occons." + randomHex() + ".dlq"
		declare(t, channel(t, url), dlq, nil)
		e := newConsumeEnv(t, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
		var got outcomes
		stop := e.consume("", rabbitmq.ConsumeConfig{MaxAttempts: 2, RetryDelay: 10 * time.Millisecond, DeadLetterReject: true, OnOutcome: got.add}, fail)
		e.publish(t, "poison")
		waitFor(t, func() string { return fmt.Sprint(got.get()) }, func() bool { return got.count(func(o rabbitmq.Outcome) bool { return o.Dead }) == 1 })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		var letters []amqp.Delivery
		waitFor(t, func() string { return "no dead letter in " + dlq }, func() bool {
			letters = append(letters, get(t, e.ch, dlq)...)
			return len(letters) > 0
		})
		if len(letters) != 1 || letters[0].MessageId != "poison" || letters[0].Headers["x-death"] == nil {
			t.Fatalf("dead letters %+v, want poison once, with x-death", letters)
		}
		if rest := get(t, e.ch, e.queue); len(rest) != 0 {
			t.Fatalf("%d messages left in the queue, want 0", len(rest))
		}
	})
	t.Run("unroutable", func(t *testing.T) {
		t.Parallel()
		e := newConsumeEnv(t, nil)
		var got outcomes
		stop := e.consume("", rabbitmq.ConsumeConfig{MaxAttempts: 1, RetryDelay: 10 * time.Millisecond, DeadLetterRoutingKey: e.queue + ".nowhere", OnOutcome: got.add}, fail)
		e.publish(t, "poison")
		unroutable := func(o rabbitmq.Outcome) bool {
			var ue *rabbitmq.UnroutableError
			return errors.As(o.Err, &ue) && ue.Code == 312
		}
		waitFor(t, func() string { return fmt.Sprint(got.get()) }, func() bool { return got.count(unroutable) >= 2 })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if n := got.count(func(o rabbitmq.Outcome) bool { return o.Dead }); n != 0 {
			t.Fatalf("outcomes %+v: want none dead", got.get())
		}
		if rest := get(t, e.ch, e.queue); len(rest) != 1 || rest[0].MessageId != "poison" {
			t.Fatalf("queue holds %d messages, want poison still there", len(rest))
		}
	})
}

// TestConsumeRedelivered: a message whose acknowledgement was lost (the
// consumer's channel closed after the commit) is delivered again and found
// a repeat: applied once. A quorum queue counts it the second attempt; a
// classic queue, whose consumer in another process had no failure to
// count, the first (flagged redelivered).
func TestConsumeRedelivered(t *testing.T) {
	t.Parallel()
	for _, qt := range queueTypes {
		t.Run(qt.name, func(t *testing.T) {
			t.Parallel()
			e := newConsumeEnv(t, qt.args)
			e.publish(t, "m-1")
			// A first consumer applies m-1 but never acknowledges it (as a
			// process killed between its commit and its ack).
			first := channel(t, e.url)
			var d amqp.Delivery
			waitFor(t, func() string { return "m-1 not in the queue" }, func() bool {
				var ok bool
				var err error
				if d, ok, err = first.Get(e.queue, false); err != nil {
					t.Fatal(err)
				}
				return ok
			})
			if _, err := outbox.Receive(context.Background(), e.ib, e.b, "ledger", d.MessageId, func(ctx context.Context, tx pgx.Tx) error { return e.insert(ctx, tx, d) }); err != nil {
				t.Fatal(err)
			}
			if err := first.Close(); err != nil {
				t.Fatal(err)
			}
			var got outcomes
			stop := e.consume("", rabbitmq.ConsumeConfig{DeadLetter: func(context.Context, amqp.Delivery, error) error { return nil }, OnOutcome: got.add}, e.insert)
			waitFor(t, func() string { return "no redelivery" }, func() bool { return len(got.get()) > 0 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			want := 1
			if qt.name == "quorum" {
				want = 2
			}
			if o := got.get()[0]; !o.Repeat || o.Applied || !o.Redelivered || o.Attempt != want {
				t.Fatalf("redelivery: %+v, want a repeat, redelivered, attempt %d", o, want)
			}
			if rows := e.ledgerRows(t); len(rows) != 1 {
				t.Fatalf("ledger %v, want m-1 once", rows)
			}
			if rest := get(t, e.ch, e.queue); len(rest) != 0 {
				t.Fatalf("%d messages left in the queue, want 0 (the repeat acknowledged)", len(rest))
			}
		})
	}
}

// TestConsumeReconnect: the consumer's connection is cut (and new ones
// refused for a while), then stalled longer than its heartbeats allow:
// each time it dials again and applies the messages published after.
func TestConsumeReconnect(t *testing.T) {
	t.Parallel()
	e := newConsumeEnv(t, nil)
	p, url := (&broker{url: e.url}).proxy(t)
	var log fwdtest.Log
	var got outcomes
	stop := e.consume(url, rabbitmq.ConsumeConfig{DeadLetter: func(context.Context, amqp.Delivery, error) error { return nil }, OnOutcome: got.add, Logger: log.Logger(),
		Dial: func(url string) (*amqp.Connection, error) {
			return amqp.DialConfig(url, amqp.Config{Heartbeat: time.Second, Dial: amqp.DefaultDial(2 * time.Second)})
		}}, e.insert)
	applied := func(n int) {
		t.Helper()
		waitFor(t, func() string { return fmt.Sprintf("ledger %v, log %s", e.ledgerRows(t), log.String()) }, func() bool { return len(e.ledgerRows(t)) == n })
	}
	e.publish(t, "m-1")
	applied(1)
	p.Cut()
	time.Sleep(500 * time.Millisecond)
	p.Restore()
	e.publish(t, "m-2")
	applied(2)
	// Heartbeats every 0.5 s, given up after 1.5 s of silence.
	p.Stall()
	time.Sleep(4 * time.Second)
	p.Restore()
	e.publish(t, "m-3")
	applied(3)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows := e.ledgerRows(t); fmt.Sprint(rows) != "[m-1 m-2 m-3]" {
		t.Fatalf("ledger %v", rows)
	}
	if n := strings.Count(log.String(), "rabbitmq: consume: reconnected"); n < 2 {
		t.Fatalf("%d reconnects, want 2 (after the cut and after the stall); log %s", n, log.String())
	}
}

// TestConsumeNoQueue: a queue the broker does not have ends Consume with
// its refusal, rather than a dial loop.
func TestConsumeNoQueue(t *testing.T) {
	t.Parallel()
	e := newConsumeEnv(t, nil)
	e.queue += ".missing"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := rabbitmq.Consume(ctx, e.url, e.ib, e.b, rabbitmq.ConsumeConfig{Name: "ledger", Queue: e.queue, DeadLetterReject: true}, e.insert)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Fatalf("Consume: %v, want 404 NOT_FOUND", err)
	}
}

// TestConsumeConfig: a consumer without a name, a queue or a dead letter
// (or with two) is refused before it connects.
func TestConsumeConfig(t *testing.T) {
	dl := func(context.Context, amqp.Delivery, error) error { return nil }
	fn := func(context.Context, pgx.Tx, amqp.Delivery) error { return nil }
	ib, err := outbox.NewInbox(postgres.Dialect(), outbox.InboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		url   string
		ib    *outbox.Inbox
		cfg   rabbitmq.ConsumeConfig
		field string
	}{
		{DefaultURL, ib, rabbitmq.ConsumeConfig{Queue: "q", DeadLetterReject: true}, "Name"},
		{DefaultURL, ib, rabbitmq.ConsumeConfig{Name: "x", DeadLetterReject: true}, "Queue"},
		{DefaultURL, ib, rabbitmq.ConsumeConfig{Name: "x", Queue: "q"}, "DeadLetter"},
		{DefaultURL, ib, rabbitmq.ConsumeConfig{Name: "x", Queue: "q", DeadLetter: dl, DeadLetterRoutingKey: "d"}, "DeadLetter"},
		{DefaultURL, ib, rabbitmq.ConsumeConfig{Name: "x", Queue: "q", DeadLetterExchange: "d", DeadLetterReject: true}, "DeadLetter"},
		{DefaultURL, ib, rabbitmq.ConsumeConfig{Name: "x", Queue: "q", DeadLetterReject: true, RetryDelay: -1}, "RetryDelay"},
		{DefaultURL, ib, rabbitmq.ConsumeConfig{Name: "x", Queue: "q", DeadLetterReject: true, Prefetch: -1}, "Prefetch"},
		{DefaultURL, ib, rabbitmq.ConsumeConfig{Name: "x", Queue: "q", DeadLetterReject: true, ConfirmTimeout: -1}, "ConfirmTimeout"},
		{"", ib, rabbitmq.ConsumeConfig{Name: "x", Queue: "q", DeadLetterReject: true}, "url"},
		{"http://x", ib, rabbitmq.ConsumeConfig{Name: "x", Queue: "q", DeadLetterReject: true}, "url"},
		{DefaultURL, nil, rabbitmq.ConsumeConfig{Name: "x", Queue: "q", DeadLetterReject: true}, "Inbox"},
	} {
		// An unreachable broker: a config accepted would dial until ctx ends.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rabbitmq.Consume(ctx, c.url, c.ib, pgxtx.Beginner{}, c.cfg, fn)
		cancel()
		var ce *rabbitmq.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%q %+v: %v, want a *ConfigError for %s", c.url, c.cfg, err, c.field)
		}
	}
}
