package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncommit/oncommit/forward/rabbitmq"
	"github.com/oncommit/oncommit/internal/fwdtest"
	"github.com/oncommit/oncommit/outbox"
)

// TestEnvelope: each message in the queue carries the envelope, every
// field of it checked as received, in plain mode and in CloudEvents mode,
// with the default source and a configured one: message-id, content-type,
// app-id, type and timestamp properties, the key (oncommit-key, or
// cloudEvents_partitionkey) and the CloudEvents headers; the message's
// own headers go along but for those that collide with the envelope's
// (dropped, each warned about once), and no other header is added.
func TestEnvelope(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	for _, c := range []struct {
		name        string
		source      string // configured; "" for the default
		cloudEvents bool
	}{
		{"plain/default-source", "", false},
		{"plain/source", "/shop/orders", false},
		{"cloudevents/default-source", "", true},
		{"cloudevents/source", "urn:shop:orders", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := fwdtest.New(t, false)
			var log fwdtest.Log
			f := b.forwarder(t, "", rabbitmq.Config{Source: c.source, CloudEvents: c.cloudEvents, Logger: log.Logger()})
			const trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			forged := []string{"oncommit-key", "Oncommit-Key", "cloudEvents_id", "CLOUDEVENTS_TYPE", "cloudEvents:source", "cloudevents_partitionkey", "cloudEvents_time", "cloudEvents_specversion"}
			msgs := []outbox.Message{
				{Topic: "orders", Key: "order-42", Payload: []byte(`{"n":0}`), Headers: map[string]string{"n": "0", "traceparent": trace,
					"oncommit-key": "forged", "Oncommit-Key": "forged", "cloudEvents_id": "forged", "CLOUDEVENTS_TYPE": "forged",
					"cloudEvents:source": "forged", "cloudevents_partitionkey": "forged"}},
				{Topic: "orders", Payload: []byte(`{"n":1}`), Headers: map[string]string{"n": "1", "cloudEvents_time": "1999-01-01T00:00:00Z", "cloudEvents_specversion": "0.3"}},
				{Topic: "mail", Headers: map[string]string{"n": "2"}}, // no payload, no key
			}
			ids := env.Publish(t, msgs...)
			created := env.CreatedAt(t)
			env.Drain(t, outbox.RelayConfig{}, outbox.AllTopics, f.Handler(), time.Minute)
			source := c.source
			if source == "" {
				source = "oncommit"
			}

			got := b.read(t)
			for id, n := range count(t, got, ids) {
				if n != 1 {
					t.Errorf("message %s is in the queue %d times", id, n)
				}
			}
			byID := map[string]amqp.Delivery{}
			for _, m := range got {
				byID[m.MessageId] = m
			}
			for i, msg := range msgs {
				id := ids[i].String()
				m, ok := byID[id]
				if !ok {
					continue // count reported it
				}
				at, ok := created[id]
				if !ok {
					t.Fatalf("message %s: no created_at in the table", id)
				}
				contentType := "application/json"
				if msg.Payload == nil {
					contentType = ""
				}
				if m.ContentType != contentType || m.AppId != source || m.Type != msg.Topic || m.RoutingKey != msg.Topic ||
					m.DeliveryMode != amqp.Persistent || !m.Timestamp.Equal(at.Truncate(time.Second)) {
					t.Errorf("message %d: content-type %q, app-id %q, type %q, routing key %q, delivery mode %d, timestamp %v; want %q, %q, %q twice, persistent, %v",
						i, m.ContentType, m.AppId, m.Type, m.RoutingKey, m.DeliveryMode, m.Timestamp, contentType, source, msg.Topic, at.Truncate(time.Second))
				}
				// The headers, exactly: the message's own but the forged
				// ones, and the envelope's.
				want := amqp.Table{}
				for k, v := range msg.Headers {
					want[k] = v
				}
				for _, k := range forged {
					delete(want, k)
				}
				if len(want) != 2 && (i == 0) || len(want) != 1 && i > 0 {
					t.Fatalf("message %d: test bug: kept headers %v", i, want)
				}
				if c.cloudEvents {
					maps.Copy(want, amqp.Table{"cloudEvents_id": id, "cloudEvents_source": source, "cloudEvents_specversion": "1.0", "cloudEvents_type": msg.Topic})
					if msg.Key != "" {
						want["cloudEvents_partitionkey"] = msg.Key
					}
				} else if msg.Key != "" {
					want["oncommit-key"] = msg.Key
				}
				if i == 0 {
					t.Logf("received: message-id %s, content-type %s, app-id %s, type %s, timestamp %s, headers %v",
						m.MessageId, m.ContentType, m.AppId, m.Type, m.Timestamp.UTC().Format(time.RFC3339), m.Headers)
				}
				h := maps.Clone(m.Headers)
				if c.cloudEvents {
					s, ok := h["cloudEvents_time"].(string)
					if !ok {
						t.Errorf("message %d: cloudEvents_time %#v, want a string", i, h["cloudEvents_time"])
					} else if ts, err := time.Parse(time.RFC3339, s); err != nil || !ts.Equal(at) || !strings.HasSuffix(s, "Z") {
						t.Errorf("message %d: cloudEvents_time %q (%v), want RFC 3339 in UTC equal to created_at %s", i, s, err, at.UTC().Format(time.RFC3339Nano))
					}
					delete(h, "cloudEvents_time")
				}
				if !reflect.DeepEqual(h, want) {
					t.Errorf("message %d: headers\n%v\nwant\n%v", i, m.Headers, want)
				}
			}
			out := log.String()
			for _, name := range forged {
				if n := strings.Count(out, "header="+name+" "); n != 1 {
					t.Errorf("%d warnings about header %s, want 1 (log %q)", n, name, out)
				}
			}
		})
	}
}

// TestEnvelopeMicroseconds: cloudEvents_time keeps the database's
// microseconds (not the whole seconds of the timestamp property), and
// a created_at on a whole second has no fraction.
func TestEnvelopeMicroseconds(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	f := b.forwarder(t, "", rabbitmq.Config{CloudEvents: true})
	at := []time.Time{
		time.Date(2026, 12, 7, 1, 2, 3, 456789000, time.FixedZone("CET", 3600)),
		time.Date(2026, 12, 7, 1, 2, 3, 0, time.UTC),
	}
	ds := []outbox.Delivery{
		{ID: outbox.NewID(), Topic: "orders", Payload: []byte(`{}`), Attempt: 1, CreatedAt: at[0]},
		{ID: outbox.NewID(), Topic: "orders", Payload: []byte(`{}`), Attempt: 1, CreatedAt: at[1]},
	}
	for _, err := range f.Handler()(context.Background(), ds) {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{ds[0].ID.String(): "2026-12-07T00:02:03.456789Z", ds[1].ID.String(): "2026-12-07T01:02:03Z"}
	got := b.read(t)
	if len(got) != 2 {
		t.Fatalf("%d messages in the queue, want 2", len(got))
	}
	for _, m := range got {
		if s := m.Headers["cloudEvents_time"]; s != want[m.MessageId] {
			t.Errorf("message %s: cloudEvents_time %v, want %s", m.MessageId, s, want[m.MessageId])
		}
	}
}

func TestEnvelopeConfig(t *testing.T) {
	_, err := rabbitmq.New(DefaultURL, rabbitmq.Config{Source: strings.Repeat("s", 256)})
	var ce *rabbitmq.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Source" {
		t.Errorf("a 256-byte Source: %v, want a *ConfigError for Source", err)
	}
	if _, err := rabbitmq.New(DefaultURL, rabbitmq.Config{Source: strings.Repeat("s", 255)}); err != nil {
		t.Errorf("a 255-byte Source: %v", err)
	}
}

// topology is a Topology with fresh names, whose queues and exchanges are
// deleted when t ends.
func topology(t *testing.T, url string, quorum bool) rabbitmq.Topology {
	t.Helper()
	n := "octopo." + randomHex()
	top := rabbitmq.Topology{Exchange: n, Queue: n + ".q", Quorum: quorum, DeadLetterExchange: n + ".dlx", DeadLetterQueue: n + ".dlq"}
	t.Cleanup(func() {
		// A channel of its own: a refused declaration closed others.
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Error(err)
			return
		}
		for _, q := range []string{top.Queue, top.DeadLetterQueue} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("delete queue %s: %v", q, err)
			}
		}
		for _, x := range []string{top.Exchange, top.DeadLetterExchange} {
			if err := ch.ExchangeDelete(x, false, false); err != nil {
				t.Errorf("delete exchange %s: %v", x, err)
			}
		}
	})
	return top
}

// TestDeclareTopology: declared twice in a row (the second a no-op), the
// topology takes the forwarder's messages (topic exchange, binding "#")
// into the queue, and a message Consume rejects (DeadLetterReject) lands
// in the dead-letter queue, with the broker's x-death; on a classic and a
// quorum queue.
func TestDeclareTopology(t *testing.T) {
	t.Parallel()
	url := rabbitURL(t)
	for _, qt := range []struct {
		name   string
		quorum bool
	}{{"classic", false}, {"quorum", true}} {
		t.Run(qt.name, func(t *testing.T) {
			t.Parallel()
			top := topology(t, url, qt.quorum)
			ctx := context.Background()
			for i := range 2 {
				if err := rabbitmq.DeclareTopology(ctx, url, top); err != nil {
					t.Fatalf("declaration %d: %v", i+1, err)
				}
			}
			ch := channel(t, url)
			q, err := ch.QueueDeclarePassive(top.Queue, true, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			if q.Messages != 0 {
				t.Fatalf("a fresh queue holds %d messages", q.Messages)
			}

			// The forwarder's messages, routing key = topic, reach the queue.
			env := fwdtest.New(t, false)
			f, err := rabbitmq.New(url, rabbitmq.Config{Exchange: top.Exchange})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			ids := env.Publish(t, append(fwdtest.Messages("orders", 3, 0), fwdtest.Messages("mail.sent", 2, 0)...)...)
			env.Drain(t, outbox.RelayConfig{}, outbox.AllTopics, f.Handler(), time.Minute)
			for id, n := range count(t, get(t, ch, top.Queue), ids) {
				if n != 1 {
					t.Errorf("message %s is in the queue %d times", id, n)
				}
			}

			// A poison message, rejected by Consume, is dead-lettered by
			// the broker into the dead-letter queue.
			poison := env.Publish(t, fwdtest.Messages("orders", 1, 0)...)[0].String()
			env.Drain(t, outbox.RelayConfig{}, outbox.AllTopics, f.Handler(), time.Minute)
			l := fwdtest.NewLedger(t)
			var got outcomes
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- rabbitmq.Consume(cctx, url, l.Inbox, l.Begin, rabbitmq.ConsumeConfig{Name: "ledger", Queue: top.Queue, MaxAttempts: 1, DeadLetterReject: true, OnOutcome: got.add},
					func(context.Context, pgx.Tx, amqp.Delivery) error { return errors.New("cannot apply") })
			}()
			waitFor(t, func() string { return fmt.Sprint(got.get()) }, func() bool { return got.count(func(o rabbitmq.Outcome) bool { return o.Dead }) == 1 })
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			var letters []amqp.Delivery
			waitFor(t, func() string { return "no dead letter in " + top.DeadLetterQueue }, func() bool {
				letters = append(letters, get(t, ch, top.DeadLetterQueue)...)
				return len(letters) > 0
			})
			if len(letters) != 1 || letters[0].MessageId != poison || letters[0].Headers["x-death"] == nil {
				t.Fatalf("dead letters %+v, want %s once, with x-death", letters, poison)
			}
			if rest := get(t, ch, top.Queue); len(rest) != 0 {
				t.Fatalf("%d messages left in the queue, want 0", len(rest))
			}
		})
	}
}

// TestDeclareTopologyConflict: a declaration that differs from what
// exists (queue type, dead-letter exchange, exchange type) is refused
// with a *TopologyConflictError that names the object and wraps the
// broker's 406 PRECONDITION_FAILED; what exists is unchanged and the
// original declaration still succeeds.
func TestDeclareTopologyConflict(t *testing.T) {
	t.Parallel()
	url := rabbitURL(t)
	top := topology(t, url, false)
	ctx := context.Background()
	if err := rabbitmq.DeclareTopology(ctx, url, top); err != nil {
		t.Fatal(err)
	}
	quorum, otherDLX, direct := top, top, top
	quorum.Quorum = true
	otherDLX.DeadLetterExchange, otherDLX.DeadLetterQueue = "", ""
	direct.ExchangeKind = "direct"
	for _, c := range []struct {
		name string
		top  rabbitmq.Topology
		kind string
		obj  string
		says string // in the broker's text
	}{
		// The dead-letter queue is declared first, and is a quorum queue too.
		{"quorum", quorum, "queue", top.DeadLetterQueue, "x-queue-type"},
		{"no dead-letter exchange", otherDLX, "queue", top.Queue, "x-dead-letter-exchange"},
		{"exchange kind", direct, "exchange", top.Exchange, "type"},
	} {
		err := rabbitmq.DeclareTopology(ctx, url, c.top)
		t.Logf("%s: %v", c.name, err)
		var tc *rabbitmq.TopologyConflictError
		var ae *amqp.Error
		switch {
		case !errors.As(err, &tc):
			t.Errorf("%s: %v, want a *TopologyConflictError", c.name, err)
		case tc.Kind != c.kind || tc.Name != c.obj:
			t.Errorf("%s: conflict on %s %q, want %s %q", c.name, tc.Kind, tc.Name, c.kind, c.obj)
		case !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || !strings.Contains(ae.Reason, "PRECONDITION_FAILED"):
			t.Errorf("%s: %v, want it to wrap the broker's 406 PRECONDITION_FAILED", c.name, err)
		case !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), c.obj) || !strings.Contains(err.Error(), "delete it"):
			t.Errorf("%s: %q, want it to name %s, say %q and what to do", c.name, err, c.obj, c.says)
		}
	}
	if err := rabbitmq.DeclareTopology(ctx, url, top); err != nil {
		t.Fatalf("the original declaration after the refusals: %v", err)
	}
}

// TestDeclareTopologyConfig: an invalid topology is refused before it
// connects.
func TestDeclareTopologyConfig(t *testing.T) {
	for _, c := range []struct {
		url   string
		top   rabbitmq.Topology
		field string
	}{
		{DefaultURL, rabbitmq.Topology{Queue: "q"}, "Topology.Exchange"},
		{DefaultURL, rabbitmq.Topology{Exchange: "x"}, "Topology.Queue"},
		{DefaultURL, rabbitmq.Topology{Exchange: "x", Queue: "q", DeadLetterQueue: "d"}, "Topology.DeadLetterQueue"},
		{"", rabbitmq.Topology{Exchange: "x", Queue: "q"}, "url"},
		{"http://x", rabbitmq.Topology{Exchange: "x", Queue: "q"}, "url"},
	} {
		err := rabbitmq.DeclareTopology(context.Background(), c.url, c.top)
		var ce *rabbitmq.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%q %+v: %v, want a *ConfigError for %s", c.url, c.top, err, c.field)
		}
	}
}
