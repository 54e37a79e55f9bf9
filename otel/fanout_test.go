package oncommitotel_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

// hasAttr reports whether s carries the attribute k at all.
func hasAttr(s sdktrace.ReadOnlySpan, k string) bool {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == k {
			return true
		}
	}
	return false
}

// TestSubscriberProcessSpan checks, without a database, that the process
// span of a subscriber's copy (Delivery.Subscriber set) carries
// messaging.consumer.group.name = the subscriber and that of a plain
// message none, on each way a process span starts: by default (the
// attributes set once the span records), with Config.SamplingAttributes,
// with Config.ProcessAsChild and with a Config.Propagator of the caller's
// (the attributes given at start). A copy's sampled delivery allocates
// no more than a plain one's: the pooled attribute buffer holds its one
// more attribute.
func TestSubscriberProcessSpan(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  oncommitotel.Config
	}{
		{"default", oncommitotel.Config{}},
		{"sampling-attributes", oncommitotel.Config{SamplingAttributes: true}},
		{"process-as-child", oncommitotel.Config{ProcessAsChild: true}},
		{"own-propagator", oncommitotel.Config{Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, valueProp{})}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			cfg := c.cfg
			cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			tel, err := oncommitotel.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			headers := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
			copyD := outbox.Delivery{ID: outbox.NewID(), Subscriber: "mail", Topic: "order.placed", Key: "order-1", Headers: headers, Attempt: 2}
			plain := outbox.Delivery{ID: outbox.NewID(), Topic: "order.placed", Key: "order-1", Headers: headers, Attempt: 2}
			for _, d := range []outbox.Delivery{copyD, plain} {
				hctx := tel.HandlerStart(context.Background(), d)
				tel.HandlerEnd(hctx, outbox.HandlerEvent{Delivery: d, Outcome: outbox.OutcomeDone, Duration: time.Millisecond})
			}
			spans := rec.Ended()
			if len(spans) != 2 {
				t.Fatalf("%d spans, want 2", len(spans))
			}
			for i, s := range spans {
				if attr(s, oncommitotel.KeyMessageID) != []outbox.Delivery{copyD, plain}[i].ID.String() ||
					attr(s, oncommitotel.KeyDestination) != "order.placed" || attr(s, oncommitotel.KeyAttempt) != "2" {
					t.Errorf("span %d: attributes %v", i, s.Attributes())
				}
			}
			if got := attr(spans[0], oncommitotel.KeyConsumerGroup); got != "mail" {
				t.Errorf("the copy's process span: %s = %q, want %q (attributes %v)", oncommitotel.KeyConsumerGroup, got, "mail", spans[0].Attributes())
			}
			if hasAttr(spans[1], string(oncommitotel.KeyConsumerGroup)) {
				t.Errorf("the plain message's process span carries %s: %v", oncommitotel.KeyConsumerGroup, spans[1].Attributes())
			}
			if len(spans[0].Attributes()) != len(spans[1].Attributes())+1 {
				t.Errorf("the copy's span has %d attributes, the plain one's %d: want one more", len(spans[0].Attributes()), len(spans[1].Attributes()))
			}
			if c.name != "default" || raceEnabled {
				return
			}
			run := func(d outbox.Delivery) float64 {
				return testing.AllocsPerRun(500, func() {
					hctx := tel.HandlerStart(context.Background(), d)
					tel.HandlerEnd(hctx, outbox.HandlerEvent{Delivery: d, Outcome: outbox.OutcomeDone, Duration: time.Millisecond})
				})
			}
			if a, b := run(copyD), run(plain); a > b {
				t.Errorf("a copy's sampled delivery allocates %.1f times, a plain one's %.1f: the attribute buffer is too short", a, b)
			}
		})
	}
}

// TestSubscriberQueueGauges: a topic with two subscribers, whose copies
// end differently (mail's dead, nats's delivered), reports one series per
// subscriber in the queue gauges, each with messaging.consumer.group.name;
// a topic without subscribers reports one series without it. The copies'
// process spans, through a relay, carry their subscriber; the plain
// message's none.
func TestSubscriberQueueGauges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tm := newTelemetry(t, oncommitotel.Config{})
	const topic = "order.placed"
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: e.table, Subscribers: map[string][]string{topic: {"mail", "nats"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool := pgtest.Pool(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ob.PublishBatch(ctx, pgxtx.From(tx), []outbox.Message{{Topic: topic}, {Topic: topic}, {Topic: topic}, {Topic: "plain"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	sub := map[string]string{res[3].ID.String(): ""} // the subscriber by message id
	for _, r := range res[:3] {
		sub[r.Copies[0].String()], sub[r.Copies[1].String()] = "mail", "nats"
	}

	r, err := ob.Relay(pgxtx.FromPool(pool), outbox.RelayConfig{Observer: tm, MaxAttempts: 1, KeepDelivered: outbox.Forever, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, outbox.Delivery) error { return nil }
	for _, err := range []error{
		r.Subscribe(topic, "mail", func(context.Context, outbox.Delivery) error { return errors.New("refused") }),
		r.Subscribe(topic, "nats", ok),
		r.Handle("plain", ok),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	eventually(t, "7 process spans", func() bool { return len(tm.ended("process ")) == 7 })
	db := pgtest.Open(t, "pgx")
	eventually(t, "3 dead copies and 4 delivered messages", func() bool {
		dead, err1 := ob.Count(ctx, sqltx.FromDB(db), outbox.Filter{States: []outbox.State{outbox.StateDead}})
		delivered, err2 := ob.Count(ctx, sqltx.FromDB(db), outbox.Filter{States: []outbox.State{outbox.StateDelivered}})
		return err1 == nil && err2 == nil && dead == 3 && delivered == 4
	})

	for _, s := range tm.ended("process ") {
		id := attr(s, oncommitotel.KeyMessageID)
		want, known := sub[id]
		if !known {
			t.Errorf("a process span of message %q, never published", id)
			continue
		}
		if got := attr(s, oncommitotel.KeyConsumerGroup); got != want || (want == "") == hasAttr(s, string(oncommitotel.KeyConsumerGroup)) {
			t.Errorf("process span %q of message %s: %s = %q, want %q (attributes %v)", s.Name(), id, oncommitotel.KeyConsumerGroup, got, want, s.Attributes())
		}
	}

	qctx, qcancel := context.WithCancel(ctx)
	qdone := make(chan error, 1)
	go func() {
		qdone <- tm.ObserveQueue(qctx, ob, sqltx.FromDB(db), oncommitotel.QueueConfig{Interval: 100 * time.Millisecond})
	}()
	defer func() { qcancel(); <-qdone }()
	vals := map[string]float64{}
	eventually(t, "the queue gauges", func() bool {
		ms := tm.metrics(t)
		g, ok := ms[oncommitotel.MetricQueueMessages].Data.(metricdata.Gauge[int64])
		if !ok || len(g.DataPoints) == 0 {
			return false
		}
		for _, dp := range g.DataPoints {
			vals["messages,"+render(dp.Attributes)] = float64(dp.Value)
		}
		if g, ok := ms[oncommitotel.MetricQueueOldestAge].Data.(metricdata.Gauge[float64]); ok {
			for _, dp := range g.DataPoints {
				vals["oldest,"+render(dp.Attributes)] = dp.Value
			}
		}
		return true
	})
	const (
		mail  = "messaging.consumer.group.name=mail,messaging.destination.name=" + topic
		nats  = "messaging.consumer.group.name=nats,messaging.destination.name=" + topic
		plain = "messaging.destination.name=plain"
	)
	want := map[string]float64{}
	for _, series := range []string{mail, nats, plain} {
		for _, state := range []string{"pending", "due", "processing", "dead", "delivered"} {
			want["messages,"+series+",oncommit.state="+state] = 0
		}
		want["oldest,"+series] = 0
	}
	want["messages,"+mail+",oncommit.state=dead"] = 3
	want["messages,"+nats+",oncommit.state=delivered"] = 3
	want["messages,"+plain+",oncommit.state=delivered"] = 1
	for k, w := range want {
		if v, ok := vals[k]; !ok || v != w {
			t.Errorf("%s = %v (reported: %v), want %v", k, v, ok, w)
		}
	}
	for k := range vals {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected series %s = %v", k, vals[k])
		}
		if strings.Contains(k, "destination.name="+topic) && !strings.Contains(k, "consumer.group.name=") {
			t.Errorf("a series of %s without a subscriber: %s", topic, k)
		}
	}
	// The dead-letter counter names mail, whose copies died.
	dead := map[string]int64{}
	if c, ok := tm.metrics(t)[oncommitotel.MetricDeadLettered].Data.(metricdata.Sum[int64]); ok {
		for _, dp := range c.DataPoints {
			g, _ := dp.Attributes.Value(oncommitotel.KeyConsumerGroup)
			dead[g.AsString()] += dp.Value
		}
	}
	if len(dead) != 1 || dead["mail"] != 3 {
		t.Errorf("dead letters by consumer group: %v, want mail: 3", dead)
	}
}
