package oncommitotel_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

// processAttrs are the attributes every process span of topic "orders"
// carries, whenever they were set.
var processAttrs = map[attribute.Key]string{
	oncommitotel.KeySystem:        oncommitotel.System,
	oncommitotel.KeyDestination:   "orders",
	oncommitotel.KeyOperationName: "process",
	oncommitotel.KeyOperationType: "process",
}

// deliveries runs n deliveries of topic "orders" through tel, from
// goroutines at once, the i-th with attempt i+1, and returns their ids.
func deliveries(tel *oncommitotel.Telemetry, n int) []outbox.ID {
	ids := make([]outbox.ID, n)
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = outbox.NewID()
		wg.Go(func() {
			d := outbox.Delivery{ID: ids[i], Topic: "orders", Attempt: i + 1,
				Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
			hctx := tel.HandlerStart(context.Background(), d)
			tel.HandlerEnd(hctx, outbox.HandlerEvent{Delivery: d, Outcome: outbox.OutcomeDone, Duration: time.Millisecond})
		})
	}
	wg.Wait()
	return ids
}

// TestAttrBufReuse: the process spans' attributes go to the SDK through a
// pooled buffer, which the next delivery overwrites; every exported span
// must still carry its own message id and attempt (it would not if the
// SDK kept the slice it was given), and a sampled delivery must not
// allocate the buffer (it would if the SDK's span type were no longer
// recognised, see copiesAttributes).
func TestAttrBufReuse(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	ids := deliveries(tel, n)
	spans := rec.Ended()
	if len(spans) != n {
		t.Fatalf("%d spans ended, want %d", len(spans), n)
	}
	attempt := map[string]string{}
	for i, id := range ids {
		attempt[id.String()] = strconv.Itoa(i + 1)
	}
	for _, s := range spans {
		id := attr(s, oncommitotel.KeyMessageID)
		if want, ok := attempt[id]; !ok || attr(s, oncommitotel.KeyAttempt) != want {
			t.Fatalf("span with message id %q has attempt %q, want %q", id, attr(s, oncommitotel.KeyAttempt), want)
		}
		delete(attempt, id)
		for k, v := range processAttrs {
			if got := attr(s, k); got != v {
				t.Errorf("span %s: %s = %q, want %q", id, k, got, v)
			}
		}
		if len(s.Attributes()) != 6 || len(s.Links()) != 1 {
			t.Errorf("span %s: %d attributes, %d links: %v", id, len(s.Attributes()), len(s.Links()), s.Attributes())
		}
	}

	// Allocations of a sampled delivery into a batch processor: the SDK's
	// span, its context and its snapshot, the span's attributes, the link
	// and its copy in the snapshot, the message id's string. One more
	// means the buffer is allocated again.
	batched := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}))
	defer batched.Shutdown(context.Background())
	tel, err = oncommitotel.New(oncommitotel.Config{TracerProvider: batched, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	d := outbox.Delivery{ID: outbox.NewID(), Topic: "orders", Attempt: 1,
		Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	allocs := testing.AllocsPerRun(1000, func() {
		hctx := tel.HandlerStart(context.Background(), d)
		tel.HandlerEnd(hctx, outbox.HandlerEvent{Delivery: d, Outcome: outbox.OutcomeDone, Duration: time.Millisecond})
	})
	if allocs > 7 && !raceEnabled {
		t.Errorf("a sampled delivery allocates %.1f times, want at most 7 (the attribute buffer is allocated)", allocs)
	}
}

// startSampler records the attributes each span had when its sampling was
// decided.
type startSampler struct {
	mu   sync.Mutex
	seen [][]attribute.KeyValue
}

func (s *startSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	s.mu.Lock()
	s.seen = append(s.seen, append([]attribute.KeyValue(nil), p.Attributes...))
	s.mu.Unlock()
	return sdktrace.AlwaysSample().ShouldSample(p)
}

func (*startSampler) Description() string { return "startSampler" }

// TestSamplingAttributes: by default a process span's sampler sees no
// attributes; with Config.SamplingAttributes it sees the topic's four
// messaging attributes; the exported spans are the same either way.
func TestSamplingAttributes(t *testing.T) {
	for _, given := range []bool{false, true} {
		t.Run(strconv.FormatBool(given), func(t *testing.T) {
			sampler := &startSampler{}
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sampler))
			tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: tp, SamplingAttributes: given,
				MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))})
			if err != nil {
				t.Fatal(err)
			}
			deliveries(tel, 3)
			if len(sampler.seen) != 3 {
				t.Fatalf("sampler asked %d times, want 3", len(sampler.seen))
			}
			for _, kv := range sampler.seen {
				want := 0
				if given {
					want = len(processAttrs)
				}
				if len(kv) != want {
					t.Fatalf("sampler saw %v, want %d attributes", kv, want)
				}
				for _, a := range kv {
					if processAttrs[a.Key] != a.Value.String() {
						t.Errorf("sampler saw %s = %q", a.Key, a.Value.String())
					}
				}
			}
			for _, s := range rec.Ended() {
				if len(s.Attributes()) != 6 || attr(s, oncommitotel.KeyMessageID) == "" || attr(s, oncommitotel.KeyAttempt) == "" || len(s.Links()) != 1 {
					t.Errorf("span attributes %v, links %v", s.Attributes(), s.Links())
				}
				for k, v := range processAttrs {
					if got := attr(s, k); got != v {
						t.Errorf("%s = %q, want %q", k, got, v)
					}
				}
			}
		})
	}
}
