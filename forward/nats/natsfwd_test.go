package natsfwd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsfwd "github.com/oncommit/oncommit/forward/nats"
	"github.com/oncommit/oncommit/internal/fwdtest"
	"github.com/oncommit/oncommit/outbox"
)

func forwarder(t testing.TB, js jetstream.JetStream, subj func(string) string, cfg natsfwd.Config) *natsfwd.Forwarder {
	t.Helper()
	cfg.Subject = func(d outbox.Delivery) string { return subj(d.Topic) }
	f, err := natsfwd.New(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// checkOnce fails t unless the stream holds exactly one message per id of
// want, and nothing else.
func checkOnce(t testing.TB, got []stored, want []outbox.ID) {
	t.Helper()
	seen := map[string]int{}
	for _, m := range got {
		seen[m.id]++
	}
	for _, id := range want {
		switch n := seen[id.String()]; n {
		case 1:
		case 0:
			t.Errorf("message %s is not in the stream", id)
		default:
			t.Errorf("message %s is in the stream %d times", id, n)
		}
		delete(seen, id.String())
	}
	for id, n := range seen {
		t.Errorf("stream holds %d message(s) with id %q that was never published", n, id)
	}
	if len(got) != len(want) {
		t.Errorf("stream holds %d messages, want %d", len(got), len(want))
	}
}

// fixture is one test's table, stream and forwarder on the shared server.
type fixture struct {
	env  *fwdtest.Env
	js   jetstream.JetStream
	s    jetstream.Stream
	subj func(topic string) string
	f    *natsfwd.Forwarder
}

func setup(t *testing.T, ordered bool) fixture {
	t.Parallel()
	url := natsURL(t)
	x := fixture{env: fwdtest.New(t, ordered)}
	_, x.js = connect(t, url)
	x.s, x.subj = stream(t, x.js, 20*time.Minute)
	x.f = forwarder(t, x.js, x.subj, natsfwd.Config{})
	return x
}

func TestForward(t *testing.T) {
	x := setup(t, false)
	env, s, subj, f := x.env, x.s, x.subj, x.f
	msgs := append(fwdtest.Messages("orders", 500, 0), fwdtest.Messages("mail", 100, 0)...)
	msgs[0].Headers["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ids := env.Publish(t, msgs...)
	// One registration for every topic.
	env.Drain(t, outbox.RelayConfig{}, outbox.AllTopics, f.Handler(), time.Minute)

	got := read(t, s)
	checkOnce(t, got, ids)
	// With subject, payload and headers carried.
	topics := map[string]int{}
	for i, m := range got {
		topics[m.subject]++
		if m.subject != subj("orders") && m.subject != subj("mail") {
			t.Errorf("message %d: subject %q, want %q or %q", i, m.subject, subj("orders"), subj("mail"))
		}
		var p struct{ N int }
		if err := json.Unmarshal([]byte(m.data), &p); err != nil || strconv.Itoa(p.N) != m.header.Get("n") {
			t.Errorf("message %d: payload %q, header n=%q (%v)", i, m.data, m.header.Get("n"), err)
		}
	}
	if topics[subj("orders")] != 500 || topics[subj("mail")] != 100 {
		t.Errorf("messages per subject %v, want 500 orders and 100 mail", topics)
	}
	if tp := got[0].header.Get("traceparent"); tp != msgs[0].Headers["traceparent"] {
		t.Errorf("traceparent header %q, want %q", tp, msgs[0].Headers["traceparent"])
	}
}

// setting is how a fault test connects, makes its stream and configures
// the forwarder.
type setting struct {
	opts []nats.Option  // the connection's options
	dup  time.Duration  // the stream's duplicate window; 0: the server's (2 min)
	cfg  natsfwd.Config // Subject is set by the test
}

// settings are the defaults, and the settings docs/forwarding.md
// recommends ("Recommended settings") for the relay of the fault tests
// (fwdtest.OutageRelay: 5 s leases, 1 s retry cap): a connection that
// reconnects for good, a duplicate window longer than the lease plus the
// retry cap, which Check confirms, and an AckTimeout below the lease.
var settings = []fwdtest.Setting[setting]{
	{Name: "defaults"},
	{Name: "recommended", C: setting{
		opts: []nats.Option{nats.MaxReconnects(-1)},
		dup:  15 * time.Minute,
		cfg:  natsfwd.Config{AckTimeout: 2 * time.Second, Lease: fwdtest.OutageRelay().Lease, RetryCap: fwdtest.OutageRelay().RetryCap},
	}},
}

// forwarder returns a forwarder of this setting on js with subject
// mapping subj; with a duplicate window set, it checks that Check finds
// the stream's window long enough.
func (s setting) forwarder(t testing.TB, js jetstream.JetStream, subj func(string) string) *natsfwd.Forwarder {
	t.Helper()
	var log fwdtest.Log
	cfg := s.cfg
	cfg.Logger = log.Logger()
	f := forwarder(t, js, subj, cfg)
	if s.dup > 0 {
		if err := f.Check(context.Background(), "orders"); err != nil || log.String() != "" {
			t.Fatalf("Check: %v, log %q; want neither", err, log.String())
		}
	}
	return f
}

// TestKilledAfterAck: a relay killed after JetStream acknowledged its
// messages and before it wrote their outcomes; the next relay delivers
// them again and JetStream drops the second copies (Nats-Msg-Id).
func TestKilledAfterAck(t *testing.T) {
	fwdtest.Under(t, settings, func(t *testing.T, set fwdtest.Setting[setting]) {
		url := natsURL(t)
		env := fwdtest.New(t, false)
		_, js := dial(t, url, set.C.opts...)
		s, subj := stream(t, js, set.C.dup)
		const n = 20
		ids := env.Publish(t, fwdtest.Messages("orders", n, 0)...)

		acked := env.Kill(t, "TestHelperKilledAfterAck", n, time.Minute, "OC_NATSFWD_URL="+url, "OC_NATSFWD_STREAM="+subj(""), "OC_NATSFWD_SETTING="+set.Name)
		if got := read(t, s); len(got) != n {
			t.Fatalf("after the child's acks the stream holds %d messages, want %d", len(got), n)
		}
		if m := env.Rows(t); m["processing"] != n {
			t.Fatalf("after the kill the table holds %v, want %d processing (no outcome written)", m, n)
		}

		h := set.C.forwarder(t, js, subj).Handler()
		var again atomic.Int64
		r := env.Relay(t, outbox.RelayConfig{Lease: time.Second}, "orders", func(ctx context.Context, ds []outbox.Delivery) []error {
			for _, d := range ds {
				if d.Attempt >= 2 {
					again.Add(1)
				}
			}
			return h(ctx, ds)
		})
		stop := fwdtest.Run(t, r)
		env.WaitEmpty(t, time.Minute)
		stop()
		if again.Load() != n {
			t.Errorf("%d redeliveries after the kill, want %d (acked by the child: %d)", again.Load(), n, len(acked))
		}
		checkOnce(t, read(t, s), ids)
	})
}

// TestHelperKilledAfterAck is the child process of TestKilledAfterAck.
func TestHelperKilledAfterAck(t *testing.T) {
	fwdtest.IsChild(t)
	set := fwdtest.Named(t, settings, os.Getenv("OC_NATSFWD_SETTING")).C
	_, js := dial(t, os.Getenv("OC_NATSFWD_URL"), set.opts...)
	prefix := os.Getenv("OC_NATSFWD_STREAM")
	fwdtest.Child(t, set.forwarder(t, js, func(topic string) string { return prefix + topic }).Handler())
}

// TestServerDown: the NATS server stops for 10 s while messages are
// published and forwarded. Nothing is lost, nothing is stored twice, and
// no message is reported done while the server is down.
func TestServerDown(t *testing.T) {
	fwdtest.Under(t, settings, func(t *testing.T, set fwdtest.Setting[setting]) {
		srv := ownServer(t)
		env := fwdtest.New(t, false)
		_, js := dial(t, srv.url(), set.C.opts...)
		s, subj := stream(t, js, set.C.dup)
		f := set.C.forwarder(t, js, subj)
		ids := env.Outage(t, f.Handler(), fwdtest.Fault{Down: srv.stop, Up: srv.start, Grace: 2 * time.Second})
		checkOnce(t, read(t, s), ids)
	})
}

// TestConnectionCut: every connection to the server is cut, and new ones
// refused, for 10 s while messages are published and forwarded.
// TestConnectionStall: every connection stays open but passes nothing
// for 15 s (longer than the default AckTimeout). In both nothing is lost,
// nothing is stored twice, and no message is reported done while the
// server is out of reach.
func TestConnectionCut(t *testing.T) {
	fwdtest.Under(t, settings, func(t *testing.T, set fwdtest.Setting[setting]) { proxied(t, set.C, (*fwdtest.Proxy).CutFault) })
}

func TestConnectionStall(t *testing.T) {
	fwdtest.Under(t, settings, func(t *testing.T, set fwdtest.Setting[setting]) { proxied(t, set.C, (*fwdtest.Proxy).StallFault) })
}

// proxied runs an outage (fwdtest.Outage) on a connection through a
// fault proxy in front of the shared server, with the fault fault makes.
func proxied(t *testing.T, set setting, fault func(*fwdtest.Proxy) fwdtest.Fault) {
	url := natsURL(t)
	env := fwdtest.New(t, false)
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	p := fwdtest.NewProxy(t, u.Host)
	// The streams are made on a direct connection: the proxied one may be
	// away when the test ends.
	_, direct := connect(t, url)
	s, subj := stream(t, direct, set.dup)
	_, js := dial(t, "nats://"+p.Addr(), set.opts...)
	f := set.forwarder(t, js, subj)
	ids := env.Outage(t, f.Handler(), fault(p))
	checkOnce(t, read(t, s), ids)
}

// TestKeyOrder: with ordered delivery, each key's messages are on the
// stream in publish order.
func TestKeyOrder(t *testing.T) {
	x := setup(t, true)
	env, s, f := x.env, x.s, x.f
	ids := env.Publish(t, fwdtest.Messages("orders", 200, 5)...)
	env.Drain(t, outbox.RelayConfig{}, "orders", f.Handler(), time.Minute)
	got := read(t, s)
	checkOnce(t, got, ids)
	var ns []string
	for _, m := range got {
		ns = append(ns, m.header.Get("n"))
	}
	fwdtest.CheckKeyOrder(t, ns, 5)
}

// TestNoStream: a subject no stream stores gets no PubAck: the message is
// retried, then dead, never done.
func TestNoStream(t *testing.T) {
	t.Parallel()
	url := natsURL(t)
	env := fwdtest.New(t, false)
	_, js := connect(t, url)
	f := forwarder(t, js, func(topic string) string { return "ocfwd.nostream." + topic }, natsfwd.Config{AckTimeout: time.Second})
	env.Publish(t, fwdtest.Messages("orders", 3, 0)...)
	var rc fwdtest.Recorder
	stop := fwdtest.Run(t, env.Relay(t, outbox.RelayConfig{MaxAttempts: 2, RetryBase: 50 * time.Millisecond, RetryCap: 50 * time.Millisecond}, "orders", rc.Wrap(f.Handler())))
	env.WaitRows(t, time.Minute, func(m map[string]int) bool { return m["dead"] == 3 })
	stop()
	doneAt, errs := rc.Outcomes()
	if len(doneAt) > 0 || len(errs) != 6 {
		t.Errorf("%d done, %d failed outcomes; want 0 done, 6 failed (3 messages x 2 attempts)", len(doneAt), len(errs))
	}
	t.Logf("outcome: %v", errs[0])
}

// TestBadSubject: a subject NATS refuses dead-letters the message at once:
// retrying cannot help.
func TestBadSubject(t *testing.T) {
	x := setup(t, false)
	f := forwarder(t, x.js, func(string) string { return "has a space" }, natsfwd.Config{})
	x.env.Publish(t, fwdtest.Messages("orders", 2, 0)...)
	var rc fwdtest.Recorder
	stop := fwdtest.Run(t, x.env.Relay(t, outbox.RelayConfig{}, "orders", rc.Wrap(f.Handler())))
	x.env.WaitRows(t, time.Minute, func(m map[string]int) bool { return m["dead"] == 2 })
	stop()
	doneAt, errs := rc.Outcomes()
	var dl *outbox.DeadLetterError
	if len(doneAt) > 0 || len(errs) != 2 || !errors.As(errs[0], &dl) || !errors.Is(errs[0], nats.ErrBadSubject) {
		t.Errorf("%d done, outcomes %v; want 2 dead letters wrapping nats.ErrBadSubject", len(doneAt), errs)
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	url := natsURL(t)
	_, js := connect(t, url)
	short, shortSubj := stream(t, js, time.Minute)
	_, longSubj := stream(t, js, 11*time.Minute)
	var log fwdtest.Log
	check := func(subj func(string) string, topics ...string) (string, error) {
		log.Reset()
		f := forwarder(t, js, subj, natsfwd.Config{Logger: log.Logger()})
		err := f.Check(context.Background(), topics...)
		return log.String(), err
	}
	out, err := check(shortSubj, "a", "b")
	if err != nil || strings.Count(out, "level=WARN") != 1 || !strings.Contains(out, "stream="+short.CachedInfo().Config.Name) {
		t.Errorf("1m window with the default 30s lease and 10m retry cap: err %v, log %q; want one warning naming the stream", err, out)
	}
	out, err = check(longSubj, "a")
	if err != nil || out != "" {
		t.Errorf("11m window: err %v, log %q; want neither", err, out)
	}
	_, err = check(func(topic string) string { return "ocfwd.nostream." + topic }, "a")
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("no stream: err %v, want jetstream.ErrStreamNotFound", err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg   natsfwd.Config
		field string
	}{
		{natsfwd.Config{Window: -1}, "Window"},
		{natsfwd.Config{AckTimeout: -1}, "AckTimeout"},
		{natsfwd.Config{Lease: -1}, "Lease"},
		{natsfwd.Config{RetryCap: -1}, "RetryCap"},
	} {
		_, err := natsfwd.New(fakeJS{}, c.cfg)
		var ce *natsfwd.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%+v: err %v, want a *ConfigError for %s", c.cfg, err, c.field)
		}
	}
	var ce *natsfwd.ConfigError
	if _, err := natsfwd.New(nil, natsfwd.Config{}); !errors.As(err, &ce) || ce.Field != "js" {
		t.Errorf("nil JetStream: err %v, want a *ConfigError for js", err)
	}
	if _, err := natsfwd.New(fakeJS{}, natsfwd.Config{}); !errors.As(err, &ce) || ce.Field != "js" {
		t.Errorf("JetStream without a connection: err %v, want a *ConfigError for js", err)
	}
}

// fakeJS is a JetStream with no connection.
type fakeJS struct{ jetstream.JetStream }

func (fakeJS) Conn() *nats.Conn { return nil }

// TestLostAcks: 4,000 publishes whose PubAck never comes (their subject
// has a plain subscriber and no stream, so the server neither stores nor
// answers them; 4,000 is nats.go's default cap of unanswered publishes)
// time out; after them the same forwarder still publishes to a healthy
// stream. A forwarder that kept the futures of the publishes it gave up
// on would be stalled at the cap for good (jetstream.ErrTooManyStalledMsgs).
func TestLostAcks(t *testing.T) {
	x := setup(t, false)
	nc, _ := connect(t, natsURL(t))
	sink := x.subj("")[:len(x.subj(""))-1] + "_SINK" // outside the stream's subjects
	sub, err := nc.Subscribe(sink, func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	f := forwarder(t, x.js, func(topic string) string {
		if topic == "lost" {
			return sink
		}
		return x.subj(topic)
	}, natsfwd.Config{Window: 1000, AckTimeout: time.Second})
	h := f.Handler()
	deliveries := func(topic string, n int) []outbox.Delivery {
		ds := make([]outbox.Delivery, n)
		for i := range ds {
			ds[i] = outbox.Delivery{ID: outbox.NewID(), Topic: topic, Payload: fmt.Appendf(nil, `{"n":%d}`, i), Attempt: 1, CreatedAt: time.Now()}
		}
		return ds
	}
	ctx := context.Background()
	for range 4 {
		for i, err := range h(ctx, deliveries("lost", 1000)) {
			if !errors.Is(err, natsfwd.ErrAckTimeout) {
				t.Fatalf("lost publish %d: outcome %v, want ErrAckTimeout", i, err)
			}
		}
	}
	ok := deliveries("orders", 10)
	ids := make([]outbox.ID, len(ok))
	for i, err := range h(ctx, ok) {
		if err != nil {
			t.Errorf("publish %d to the healthy stream after 4,000 lost acks: %v", i, err)
		}
		ids[i] = ok[i].ID
	}
	checkOnce(t, read(t, x.s), ids)
}

// TestBrokerHeaders: message headers in the server's Nats- namespace
// never reach JetStream: a Nats-Rollup does not purge the subject, a
// Nats-Expected-Stream naming another stream does not fail the publish,
// a forged Nats-Msg-Id (in any case) does not replace the message's id,
// and none of them is stored. Each dropped name is warned about once;
// other headers pass.
func TestBrokerHeaders(t *testing.T) {
	t.Parallel()
	url := natsURL(t)
	env := fwdtest.New(t, false)
	_, js := connect(t, url)
	s, subj := streamWith(t, js, func(c *jetstream.StreamConfig) { c.AllowRollup = true })
	var log fwdtest.Log
	f := forwarder(t, js, subj, natsfwd.Config{Logger: log.Logger()})
	relay := outbox.RelayConfig{MaxAttempts: 2, RetryBase: 50 * time.Millisecond, RetryCap: 50 * time.Millisecond}
	drain := func(msgs ...outbox.Message) []outbox.ID {
		ids := env.Publish(t, msgs...)
		stop := fwdtest.Run(t, env.Relay(t, relay, "orders", f.Handler()))
		env.WaitRows(t, time.Minute, func(m map[string]int) bool { return m["pending"]+m["processing"] == 0 })
		stop()
		if m := env.Rows(t); len(m) != 0 {
			t.Errorf("the table holds %v, want every message delivered", m)
		}
		return ids
	}
	msg := func(n int, h map[string]string) outbox.Message {
		m := fwdtest.Messages("orders", 1, 0)[0]
		m.Headers["n"] = fmt.Sprint(n)
		for k, v := range h {
			m.Headers[k] = v
		}
		return m
	}
	first := drain(msg(0, nil)) // on the subject before a rollup
	ids := append(first, drain(
		msg(1, map[string]string{"Nats-Rollup": "sub", "Nats-TTL": "1s", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}),
		msg(2, map[string]string{"Nats-Expected-Stream": "NOT_THIS_ONE", "Nats-Expected-Last-Sequence": "999", "nats-msg-id": "forged", "NATS-TTL": "1s"}),
		msg(3, map[string]string{"Nats-TTL": "1s"}),
	)...)
	got := read(t, s)
	checkOnce(t, got, ids)
	for _, m := range got {
		for k := range m.header {
			if strings.HasPrefix(strings.ToLower(k), "nats-") && k != jetstream.MsgIDHeader {
				t.Errorf("message n=%s carries header %s=%q on the stream", m.header.Get("n"), k, m.header[k])
			}
		}
		if m.header.Get("n") == "1" && m.header.Get("traceparent") == "" {
			t.Errorf("message n=1 lost its traceparent header: %v", m.header)
		}
	}
	out := log.String()
	for _, name := range []string{"Nats-Rollup", "Nats-TTL", "Nats-Expected-Stream", "Nats-Expected-Last-Sequence", "nats-msg-id", "NATS-TTL"} {
		if n := strings.Count(out, "header="+name+" "); n != 1 {
			t.Errorf("%d warnings about header %s, want 1 (log %q)", n, name, out)
		}
	}
	if n := strings.Count(out, "level=WARN"); n != 6 {
		t.Errorf("%d warnings, want 6, one per dropped name (log %q)", n, out)
	}
}
