package oncommitotel_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"

	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

// TestCountsAsSums checks, without a database, how a reader sees the
// sent and consumed counts: monotonic cumulative int64 sums with the
// conventions' name and unit, a description, one data point per attribute
// set, the counts of two Telemetries on one MeterProvider added up, and
// still cumulative at a second collection.
func TestCountsAsSums(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := oncommitotel.Config{TracerProvider: noop.NewTracerProvider(), MeterProvider: mp}
	tel1, err := oncommitotel.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tel2, err := oncommitotel.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deliver := func(tel *oncommitotel.Telemetry, topic string, n int) {
		for range n {
			d := outbox.Delivery{ID: outbox.NewID(), Topic: topic, Attempt: 1}
			hctx := tel.HandlerStart(ctx, d)
			tel.HandlerEnd(hctx, outbox.HandlerEvent{Delivery: d, Outcome: outbox.OutcomeDone})
		}
	}
	publish := func(tel *oncommitotel.Telemetry, topic string) {
		m := outbox.Message{Topic: topic}
		pctx := tel.PublishStart(ctx, &m)
		tel.PublishEnd(ctx, outbox.PublishEvent{Messages: []outbox.Message{m}, Contexts: []context.Context{pctx},
			Results: []outbox.Result{{ID: outbox.NewID()}}})
	}
	collect := func() map[string]metricdata.Metrics { return telemetry{reader: reader}.metrics(t) }
	check := func(ms map[string]metricdata.Metrics, name string, want map[string]int64) {
		t.Helper()
		m, ok := ms[name]
		if !ok {
			t.Fatalf("no %s", name)
		}
		if m.Unit != "{message}" || m.Description == "" {
			t.Errorf("%s: unit %q, description %q", name, m.Unit, m.Description)
		}
		s, ok := m.Data.(metricdata.Sum[int64])
		if !ok {
			t.Fatalf("%s is a %T, want an int64 sum", name, m.Data)
		}
		if !s.IsMonotonic || s.Temporality != metricdata.CumulativeTemporality {
			t.Errorf("%s: monotonic %v, temporality %v, want a monotonic cumulative sum", name, s.IsMonotonic, s.Temporality)
		}
		got := map[string]int64{}
		for _, dp := range s.DataPoints {
			key := setKey(dp.Attributes)
			if _, dup := got[key]; dup {
				t.Errorf("%s: two data points of %s", name, key)
			}
			got[key] = dp.Value
		}
		if len(got) != len(want) {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s{%s} = %d, want %d (all: %v)", name, k, got[k], v, got)
			}
		}
	}
	process := func(topic string) string {
		return attrs(oncommitotel.KeyDestination.String(topic), oncommitotel.KeyOperationName.String("process"))
	}
	create := func(topic string) string {
		return attrs(oncommitotel.KeyDestination.String(topic), oncommitotel.KeyOperationName.String("create"))
	}

	deliver(tel1, "a", 3)
	deliver(tel2, "a", 2)
	deliver(tel2, "b", 1)
	publish(tel1, "a")
	ms := collect()
	check(ms, oncommitotel.MetricConsumed, map[string]int64{process("a"): 5, process("b"): 1})
	check(ms, oncommitotel.MetricSent, map[string]int64{create("a"): 1})

	deliver(tel1, "b", 1)
	publish(tel2, "a")
	publish(tel2, "b")
	ms = collect()
	check(ms, oncommitotel.MetricConsumed, map[string]int64{process("a"): 5, process("b"): 2})
	check(ms, oncommitotel.MetricSent, map[string]int64{create("a"): 2, create("b"): 1})
}

// attrs is the key TestCountsAsSums gives the data point of kvs and
// messaging.system.
func attrs(kvs ...attribute.KeyValue) string {
	return setKey(attribute.NewSet(append(kvs, oncommitotel.KeySystem.String(oncommitotel.System))...))
}

// setKey renders an attribute set as key=value pairs, sorted by key.
func setKey(set attribute.Set) string {
	var key string
	for _, kv := range set.ToSlice() {
		key += string(kv.Key) + "=" + kv.Value.String() + ","
	}
	return key
}
