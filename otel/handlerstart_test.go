package oncommitotel_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

// TestHandlerContext checks, without a database, what a handler's context
// and process span get from a message's headers, with the span sampled and
// not: the message's baggage in both cases; the message id, the attempt and
// the link to the creation span on a sampled span; no span recorded for an
// unsampled one; a new trace either way (the process span is a root).
func TestHandlerContext(t *testing.T) {
	for _, sampled := range []bool{true, false} {
		t.Run(map[bool]string{true: "sampled", false: "unsampled"}[sampled], func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			sampler := sdktrace.NeverSample()
			if sampled {
				sampler = sdktrace.AlwaysSample()
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sampler))
			tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: tp,
				MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))})
			if err != nil {
				t.Fatal(err)
			}
			// The publisher: a request span (always sampled, its own
			// provider) and a baggage member.
			pubTP := sdktrace.NewTracerProvider()
			reqCtx, req := pubTP.Tracer("test").Start(context.Background(), "request")
			member, _ := baggage.NewMember("tenant", "t-42")
			bag, _ := baggage.New(member)
			reqCtx = baggage.ContextWithBaggage(reqCtx, bag)
			m := outbox.Message{Topic: "orders"}
			tel.PublishStart(reqCtx, &m)
			req.End()
			if m.Headers["traceparent"] == "" || m.Headers["baggage"] == "" {
				t.Fatalf("headers after PublishStart: %v", m.Headers)
			}
			creation := trace.SpanContextFromContext(reqCtx)

			d := outbox.Delivery{ID: outbox.NewID(), Topic: "orders", Headers: m.Headers, Attempt: 3}
			hctx := tel.HandlerStart(context.Background(), d)
			if got := baggage.FromContext(hctx).Member("tenant").Value(); got != "t-42" {
				t.Errorf("handler's baggage tenant = %q, want t-42", got)
			}
			sc := trace.SpanContextFromContext(hctx)
			if !sc.IsValid() || sc.TraceID() == creation.TraceID() {
				t.Errorf("process span context %v: want a valid one in a trace of its own (creation trace %v)", sc, creation.TraceID())
			}
			tel.HandlerEnd(hctx, outbox.HandlerEvent{Delivery: d, Outcome: outbox.OutcomeDone, Duration: time.Millisecond})
			spans := rec.Ended()
			if !sampled {
				if len(spans) != 0 {
					t.Fatalf("unsampled: %d spans recorded", len(spans))
				}
				return
			}
			if len(spans) != 1 {
				t.Fatalf("sampled: %d spans recorded, want 1", len(spans))
			}
			s := spans[0]
			if s.Name() != "process orders" || s.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("span %q kind %v", s.Name(), s.SpanKind())
			}
			if attr(s, oncommitotel.KeyMessageID) != d.ID.String() || attr(s, oncommitotel.KeyAttempt) != "3" {
				t.Errorf("message id %q attempt %q", attr(s, oncommitotel.KeyMessageID), attr(s, oncommitotel.KeyAttempt))
			}
			if attr(s, oncommitotel.KeyDestination) != "orders" {
				t.Errorf("destination %q", attr(s, oncommitotel.KeyDestination))
			}
			// The stored traceparent is the message's create span (a child
			// of the request): 00-<trace id>-<span id>-<flags>.
			parts := strings.Split(m.Headers["traceparent"], "-")
			if l := s.Links(); len(l) != 1 || l[0].SpanContext.TraceID() != creation.TraceID() || len(parts) != 4 || l[0].SpanContext.SpanID().String() != parts[2] {
				t.Errorf("links %v, want one to the create span %s of trace %v", l, m.Headers["traceparent"], creation.TraceID())
			}
		})
	}
}

// valueProp is a propagator of the caller's that carries one header,
// x-test, as a context value.
type valueProp struct{}

type valueKey struct{}

func (valueProp) Inject(ctx context.Context, c propagation.TextMapCarrier) {
	if v, ok := ctx.Value(valueKey{}).(string); ok {
		c.Set("x-test", v)
	}
}

func (valueProp) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	if v := c.Get("x-test"); v != "" {
		return context.WithValue(ctx, valueKey{}, v)
	}
	return ctx
}

func (valueProp) Fields() []string { return []string{"x-test"} }

// TestHandlerContextCustomPropagator: with a Config.Propagator of the
// caller's, whatever it extracts from the headers reaches the handler's
// context, sampled or not.
func TestHandlerContextCustomPropagator(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: tp,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
		Propagator:    propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, valueProp{})})
	if err != nil {
		t.Fatal(err)
	}
	m := outbox.Message{Topic: "orders"}
	tel.PublishStart(context.WithValue(context.Background(), valueKey{}, "v-7"), &m)
	if m.Headers["x-test"] != "v-7" {
		t.Fatalf("headers after PublishStart: %v", m.Headers)
	}
	d := outbox.Delivery{ID: outbox.NewID(), Topic: "orders", Headers: m.Headers, Attempt: 1}
	hctx := tel.HandlerStart(context.Background(), d)
	if v, _ := hctx.Value(valueKey{}).(string); v != "v-7" {
		t.Errorf("handler's context value %q, want v-7", v)
	}
	tel.HandlerEnd(hctx, outbox.HandlerEvent{Delivery: d, Outcome: outbox.OutcomeDone})
}
