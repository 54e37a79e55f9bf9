package oncommitotel_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// BenchmarkDelivery is the observer's cost per delivery (HandlerStart and
// HandlerEnd of a message that carries a trace context, and the metrics),
// with the SDK sampling every span into a batch processor (also with
// Config.SamplingAttributes), one trace in ten, none, or no tracer
// (metrics only):
//
//	go test ./otel -run '^$' -bench Delivery -benchmem
func BenchmarkDelivery(b *testing.B) {
	for _, c := range []struct {
		name    string
		sampler sdktrace.Sampler
		atStart bool
	}{{"sampled", sdktrace.AlwaysSample(), false}, {"sampled-attrs-at-start", sdktrace.AlwaysSample(), true},
		{"ratio10", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1)), false}, {"unsampled", sdktrace.NeverSample(), false}, {"metrics", nil, false}} {
		b.Run(c.name, func(b *testing.B) {
			var tp trace.TracerProvider = noop.NewTracerProvider()
			if c.sampler != nil {
				sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}), sdktrace.WithSampler(c.sampler))
				defer sdk.Shutdown(context.Background())
				tp = sdk
			}
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: tp, MeterProvider: mp, SamplingAttributes: c.atStart})
			if err != nil {
				b.Fatal(err)
			}
			m := outbox.Message{Topic: "bench"}
			tel.PublishStart(context.Background(), &m)
			if m.Headers == nil { // no tracer: the hook added no trace context
				m.Headers = map[string]string{}
			}
			m.Headers["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			d := outbox.Delivery{ID: outbox.NewID(), Topic: "bench", Headers: m.Headers, Payload: []byte(`{}`), Attempt: 1}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				hctx := tel.HandlerStart(ctx, d)
				tel.HandlerEnd(hctx, outbox.HandlerEvent{Delivery: d, Outcome: outbox.OutcomeDone, Duration: time.Microsecond})
			}
		})
	}
}

// BenchmarkBareSpan is what the SDK costs alone for a sampled span per
// delivery, with no oncommit code: Start (kind and the four attributes of
// a process span given at Start, which the SDK copies twice: 512 B) and
// End, into the same batch processor. It is not a floor for the observer,
// which sets its attributes after Start (see docs/observability.md, What
// it costs, for the split of BenchmarkDelivery/sampled's bytes).
func BenchmarkBareSpan(b *testing.B) {
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer sdk.Shutdown(context.Background())
	tr := sdk.Tracer("bench")
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		oncommitotel.KeySystem.String(oncommitotel.System), oncommitotel.KeyDestination.String("bench"),
		oncommitotel.KeyOperationName.String("process"), oncommitotel.KeyOperationType.String("process"))}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, span := tr.Start(ctx, "process bench", opts...)
		span.End()
	}
}
