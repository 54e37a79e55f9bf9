package oncommitotel_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// BenchmarkDelivery is the observer's cost per delivery (HandlerStart and
// HandlerEnd of a message that carries a trace context), with the SDK
// sampling every span into a batch processor and recording the metrics:
//
//	go test ./otel -run '^$' -bench Delivery -benchmem
func BenchmarkDelivery(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}))
	defer tp.Shutdown(context.Background())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
	m := outbox.Message{Topic: "bench"}
	tel.PublishStart(context.Background(), &m)
	d := outbox.Delivery{ID: outbox.NewID(), Topic: "bench", Headers: m.Headers, Payload: []byte(`{}`), Attempt: 1}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		hctx := tel.HandlerStart(ctx, d)
		tel.HandlerEnd(hctx, outbox.HandlerEvent{Delivery: d, Outcome: outbox.OutcomeDone, Duration: time.Microsecond})
	}
}
