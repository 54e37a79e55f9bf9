package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncommit/oncommit/forward/rabbitmq"
	"github.com/oncommit/oncommit/internal/fwdtest"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// DefaultURL is the local RabbitMQ tried when OUTBOX_TEST_RABBITMQ_URL is
// unset: the one .ci/run starts.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// rabbitURL returns the URL of a RabbitMQ, or skips (fails under CI=true,
// logged to OUTBOX_TEST_SKIPLOG) the test.
func rabbitURL(t testing.TB) string {
	t.Helper()
	u, from := os.Getenv("OUTBOX_TEST_RABBITMQ_URL"), "OUTBOX_TEST_RABBITMQ_URL="
	if u == "" {
		u, from = DefaultURL, ""
	}
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		pgtest.Unavailable(t, fmt.Sprintf("no RabbitMQ: %s%s does not answer (%v); run rabbitmq-server -detached or set OUTBOX_TEST_RABBITMQ_URL", from, u, err))
	}
	conn.Close()
	return u
}

// broker is one test's exchange (direct) and durable queue bound to it
// with routing keys "orders" and "mail", deleted when the test ends.
type broker struct {
	url      string
	exchange string
	queue    string
	ch       *amqp.Channel
}

func newBroker(t testing.TB) *broker {
	t.Helper()
	b := &broker{url: rabbitURL(t)}
	var r [4]byte
	_, _ = rand.Read(r[:])
	b.exchange = "ocfwd." + hex.EncodeToString(r[:])
	b.queue = b.exchange + ".q"
	conn, err := amqp.Dial(b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if b.ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if err := b.ch.ExchangeDeclare(b.exchange, "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ch.QueueDeclare(b.queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"orders", "mail"} {
		if err := b.ch.QueueBind(b.queue, key, b.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = b.ch.QueueDelete(b.queue, false, false, false)
		_ = b.ch.ExchangeDelete(b.exchange, false, false)
	})
	return b
}

// forwarder returns a forwarder to b's exchange at url (b's when "").
func (b *broker) forwarder(t testing.TB, url string, cfg rabbitmq.Config) *rabbitmq.Forwarder {
	t.Helper()
	if url == "" {
		url = b.url
	}
	cfg.Exchange = b.exchange
	f, err := rabbitmq.New(url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// proxy returns a fault proxy in front of b's broker and the URL to reach
// the broker through it.
func (b *broker) proxy(t testing.TB) (*fwdtest.Proxy, string) {
	t.Helper()
	u, err := amqp.ParseURI(b.url)
	if err != nil {
		t.Fatal(err)
	}
	p := fwdtest.NewProxy(t, net.JoinHostPort(u.Host, strconv.Itoa(u.Port)))
	host, port, _ := net.SplitHostPort(p.Addr())
	u.Host = host
	u.Port, _ = strconv.Atoi(port)
	return p, u.String()
}

// read takes every message in b's queue, in queue order.
func (b *broker) read(t testing.TB) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := b.ch.Get(b.queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// count returns how many times each message id is in ms, and fails t for
// ids never published and for published ids missing.
func count(t testing.TB, ms []amqp.Delivery, want []outbox.ID) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for _, m := range ms {
		seen[m.MessageId]++
	}
	known := map[string]bool{}
	for _, id := range want {
		known[id.String()] = true
		if seen[id.String()] == 0 {
			t.Errorf("message %s is not in the queue", id)
		}
	}
	for id := range seen {
		if !known[id] {
			t.Errorf("queue holds message id %q that was never published", id)
		}
	}
	return seen
}

func TestForward(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	env := fwdtest.New(t, false)
	f := b.forwarder(t, "", rabbitmq.Config{})
	msgs := append(fwdtest.Messages("orders", 500, 0), fwdtest.Messages("mail", 100, 0)...)
	ids := env.Publish(t, msgs...)
	// One registration for every topic.
	env.Drain(t, outbox.RelayConfig{}, outbox.AllTopics, f.Handler(), time.Minute)

	got := b.read(t)
	for id, n := range count(t, got, ids) {
		if n != 1 {
			t.Errorf("message %s is in the queue %d times", id, n)
		}
	}
	types := map[string]int{}
	for i, m := range got {
		types[m.Type]++
		if m.DeliveryMode != amqp.Persistent || m.RoutingKey != m.Type || m.Timestamp.IsZero() {
			t.Errorf("message %d: delivery mode %d, routing key %q, type %q, timestamp %v; want persistent, the topic twice, set", i, m.DeliveryMode, m.RoutingKey, m.Type, m.Timestamp)
		}
		if m.Headers["n"] == nil {
			t.Errorf("message %d: headers %v, want n", i, m.Headers)
		}
	}
	if types["orders"] != 500 || types["mail"] != 100 {
		t.Errorf("messages per topic %v, want 500 orders and 100 mail", types)
	}
}

// settings are the defaults, and the settings docs/forwarding.md
// recommends ("Recommended settings") for the relay of the fault tests
// (fwdtest.OutageRelay: 5 s leases): a ConfirmTimeout below the lease.
var settings = []fwdtest.Setting[rabbitmq.Config]{
	{Name: "defaults"},
	{Name: "recommended", C: rabbitmq.Config{ConfirmTimeout: 2 * time.Second}},
}

// TestKilledAfterAck: a relay killed after the broker confirmed its
// messages and before it wrote their outcomes; the next relay publishes
// them again with the same message-id, which consumers deduplicate on.
func TestKilledAfterAck(t *testing.T) {
	fwdtest.Under(t, settings, func(t *testing.T, set fwdtest.Setting[rabbitmq.Config]) {
		b := newBroker(t)
		env := fwdtest.New(t, false)
		const n = 20
		ids := env.Publish(t, fwdtest.Messages("orders", n, 0)...)
		env.Kill(t, "TestHelperKilledAfterAck", n, time.Minute, "OC_RABBITFWD_URL="+b.url, "OC_RABBITFWD_EXCHANGE="+b.exchange, "OC_RABBITFWD_SETTING="+set.Name)

		f := b.forwarder(t, "", set.C)
		env.Drain(t, outbox.RelayConfig{Lease: time.Second}, "orders", f.Handler(), time.Minute)
		for id, k := range count(t, b.read(t), ids) {
			if k != 2 {
				t.Errorf("message-id %s is in the queue %d times, want 2 (before the kill and after)", id, k)
			}
		}
	})
}

// TestHelperKilledAfterAck is the child process of TestKilledAfterAck.
func TestHelperKilledAfterAck(t *testing.T) {
	fwdtest.IsChild(t)
	cfg := fwdtest.Named(t, settings, os.Getenv("OC_RABBITFWD_SETTING")).C
	cfg.Exchange = os.Getenv("OC_RABBITFWD_EXCHANGE")
	f, err := rabbitmq.New(os.Getenv("OC_RABBITFWD_URL"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	fwdtest.Child(t, f.Handler())
}

// TestConnectionCut: every connection to the broker is cut, and new ones
// refused, for 10 s while messages are published and forwarded.
// TestConnectionStall: every connection stays open but passes nothing
// for 15 s (longer than the default ConfirmTimeout). In both nothing is
// lost, and no message is reported done while the broker is out of
// reach.
func TestConnectionCut(t *testing.T) {
	fwdtest.Under(t, settings, func(t *testing.T, set fwdtest.Setting[rabbitmq.Config]) { proxied(t, set.C, (*fwdtest.Proxy).CutFault) })
}

func TestConnectionStall(t *testing.T) {
	fwdtest.Under(t, settings, func(t *testing.T, set fwdtest.Setting[rabbitmq.Config]) {
		proxied(t, set.C, (*fwdtest.Proxy).StallFault)
	})
}

// proxied runs an outage (fwdtest.Outage) on a connection through a
// fault proxy, with the fault fault makes.
func proxied(t *testing.T, cfg rabbitmq.Config, fault func(*fwdtest.Proxy) fwdtest.Fault) {
	b := newBroker(t)
	env := fwdtest.New(t, false)
	p, url := b.proxy(t)
	f := b.forwarder(t, url, cfg)
	ids := env.Outage(t, f.Handler(), fault(p))
	dup := 0
	for _, k := range count(t, b.read(t), ids) {
		dup += k - 1
	}
	t.Logf("%d second copies in the queue (same message-id)", dup)
}

// TestStallBounded: while the connection to the broker is stalled (open,
// passing nothing, with heartbeats too far apart to notice), batches
// return failed within about ConfirmTimeout, those that must open a
// channel included, and so does Close; after the stall the forwarder
// delivers again. (A batch that opened a channel under the forwarder's
// lock held up every other batch until the heartbeats gave up on the
// connection.)
func TestStallBounded(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p, url := b.proxy(t)
	f := b.forwarder(t, url, rabbitmq.Config{ConfirmTimeout: time.Second, Dial: func(url string) (*amqp.Connection, error) {
		return amqp.DialConfig(url, amqp.Config{Heartbeat: time.Minute, Dial: amqp.DefaultDial(2 * time.Second)})
	}})
	h := f.Handler()
	batch := func(n int) []outbox.Delivery {
		ds := make([]outbox.Delivery, n)
		for i := range ds {
			ds[i] = outbox.Delivery{ID: outbox.NewID(), Topic: "orders", Payload: []byte(`{}`), Attempt: 1, CreatedAt: time.Now()}
		}
		return ds
	}
	ctx := context.Background()
	for _, err := range h(ctx, batch(1)) { // a connection with one idle channel
		if err != nil {
			t.Fatal(err)
		}
	}
	// Ample for a 1 s ConfirmTimeout, far short of the heartbeats' 90 s.
	const bound = 30 * time.Second
	p.Stall()
	// Three batches at once: one takes the idle channel, two must open one.
	results := make(chan []error, 3)
	for range 3 {
		go func() { results <- h(ctx, batch(5)) }()
	}
	for range 3 {
		select {
		case out := <-results:
			for _, err := range out {
				if err == nil {
					t.Error("a message was done while the connection was stalled")
				}
			}
		case <-time.After(bound):
			t.Fatalf("a batch did not return within %v of the stall (ConfirmTimeout 1 s)", bound)
		}
	}
	p.Restore()
	for _, err := range h(ctx, batch(5)) {
		if err != nil {
			t.Errorf("after the stall: %v", err)
		}
	}
	p.Stall()
	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	select {
	case <-closed:
	case <-time.After(bound):
		t.Fatalf("Close did not return within %v of the stall (ConfirmTimeout 1 s)", bound)
	}
	p.Restore()
}

// TestUnroutable: a message no queue is bound for is returned by the
// broker: retried, then dead, never done (dead at once with
// DeadLetterUnroutable).
func TestUnroutable(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	for _, c := range []struct {
		name     string
		deadNow  bool
		attempts int
	}{{"retried", false, 2}, {"dead-lettered", true, 1}} {
		t.Run(c.name, func(t *testing.T) {
			env := fwdtest.New(t, false)
			f := b.forwarder(t, "", rabbitmq.Config{DeadLetterUnroutable: c.deadNow, RoutingKey: func(outbox.Delivery) string { return "nowhere" }})
			env.Publish(t, fwdtest.Messages("orders", 3, 0)...)
			var rc fwdtest.Recorder
			stop := fwdtest.Run(t, env.Relay(t, outbox.RelayConfig{MaxAttempts: 2, RetryBase: 50 * time.Millisecond, RetryCap: 50 * time.Millisecond}, "orders", rc.Wrap(f.Handler())))
			env.WaitRows(t, time.Minute, func(m map[string]int) bool { return m["dead"] == 3 })
			stop()
			doneAt, errs := rc.Outcomes()
			if len(doneAt) > 0 || len(errs) != 3*c.attempts {
				t.Errorf("%d done, %d failed outcomes; want 0 done, %d failed", len(doneAt), len(errs), 3*c.attempts)
			}
			for _, err := range errs {
				var ue *rabbitmq.UnroutableError
				if !errors.As(err, &ue) || ue.RoutingKey != "nowhere" || ue.Code != 312 {
					t.Errorf("outcome %v, want an *UnroutableError (312, routing key nowhere)", err)
				}
			}
			if got := b.read(t); len(got) != 0 {
				t.Errorf("%d messages in the queue, want 0", len(got))
			}
		})
	}
}

// TestKeyOrder: with ordered delivery, each key's messages are in the
// queue in publish order.
func TestKeyOrder(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	env := fwdtest.New(t, true)
	f := b.forwarder(t, "", rabbitmq.Config{})
	ids := env.Publish(t, fwdtest.Messages("orders", 200, 5)...)
	env.Drain(t, outbox.RelayConfig{}, "orders", f.Handler(), time.Minute)
	got := b.read(t)
	count(t, got, ids)
	var ns []string
	for _, m := range got {
		ns = append(ns, fmt.Sprint(m.Headers["n"]))
	}
	fwdtest.CheckKeyOrder(t, ns, 5)
}

// TestReconnect: a connection closed between batches is dialled again on
// the next batch.
func TestReconnect(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	env := fwdtest.New(t, false)
	p, url := b.proxy(t)
	var log fwdtest.Log
	f := b.forwarder(t, url, rabbitmq.Config{Logger: log.Logger()})
	ids := env.Publish(t, fwdtest.Messages("orders", 5, 0)...)
	env.Drain(t, outbox.RelayConfig{}, "orders", f.Handler(), time.Minute)
	p.Cut()
	p.Restore()
	ids = append(ids, env.Publish(t, fwdtest.Messages("orders", 5, 0)...)...)
	env.Drain(t, outbox.RelayConfig{RetryBase: 50 * time.Millisecond, RetryCap: 50 * time.Millisecond}, "orders", f.Handler(), time.Minute)
	count(t, b.read(t), ids)
	if !strings.Contains(log.String(), "rabbitmq: reconnected") {
		t.Errorf("log %q, want a reconnect", log.String())
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		url   string
		cfg   rabbitmq.Config
		field string
	}{
		{"", rabbitmq.Config{}, "url"},
		{"http://x", rabbitmq.Config{}, "url"},
		{DefaultURL, rabbitmq.Config{Window: -1}, "Window"},
		{DefaultURL, rabbitmq.Config{ConfirmTimeout: -1}, "ConfirmTimeout"},
	} {
		_, err := rabbitmq.New(c.url, c.cfg)
		var ce *rabbitmq.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%q %+v: err %v, want a *ConfigError for %s", c.url, c.cfg, err, c.field)
		}
	}
}

// TestBrokerHeaders: message headers RabbitMQ acts on never reach it: CC
// and BCC (extra routing keys; a string value, which is all a message
// header can be, makes the broker refuse the publish) and the x- names
// (the broker's and its plugins': x-delay, x-death, ...), in any case.
// The message is delivered without them; each dropped name is warned
// about once; other headers pass.
func TestBrokerHeaders(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	env := fwdtest.New(t, false)
	var log fwdtest.Log
	f := b.forwarder(t, "", rabbitmq.Config{Logger: log.Logger()})
	msg := func(h map[string]string) outbox.Message {
		m := fwdtest.Messages("orders", 1, 0)[0]
		for k, v := range h {
			m.Headers[k] = v
		}
		return m
	}
	ids := env.Publish(t,
		msg(map[string]string{"CC": "mail", "x-delay": "60000", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}),
		msg(map[string]string{"BCC": "mail", "x-death": "forged", "X-Request-Id": "r-1"}),
		msg(map[string]string{"cc": "mail", "x-delay": "60000", "X-Stream-Filter-Value": "a"}),
	)
	stop := fwdtest.Run(t, env.Relay(t, outbox.RelayConfig{MaxAttempts: 2, RetryBase: 50 * time.Millisecond, RetryCap: 50 * time.Millisecond}, "orders", f.Handler()))
	env.WaitRows(t, time.Minute, func(m map[string]int) bool { return m["pending"]+m["processing"] == 0 })
	stop()
	if m := env.Rows(t); len(m) != 0 {
		t.Errorf("the table holds %v, want every message delivered", m)
	}
	got := b.read(t)
	for id, n := range count(t, got, ids) {
		if n != 1 {
			t.Errorf("message %s is in the queue %d times, want 1 (CC or BCC routed it again)", id, n)
		}
	}
	for _, m := range got {
		for k := range m.Headers {
			if l := strings.ToLower(k); l == "cc" || l == "bcc" || strings.HasPrefix(l, "x-") {
				t.Errorf("message %s carries header %s=%v in the queue", m.MessageId, k, m.Headers[k])
			}
		}
		if m.Headers["n"] == nil {
			t.Errorf("message %s lost its header n: %v", m.MessageId, m.Headers)
		}
	}
	out := log.String()
	for _, name := range []string{"CC", "BCC", "cc", "x-delay", "x-death", "X-Request-Id", "X-Stream-Filter-Value"} {
		if n := strings.Count(out, "header="+name+" "); n != 1 {
			t.Errorf("%d warnings about header %s, want 1 (log %q)", n, name, out)
		}
	}
	if n := strings.Count(out, "level=WARN"); n != 7 {
		t.Errorf("%d warnings, want 7, one per dropped name (log %q)", n, out)
	}
}
