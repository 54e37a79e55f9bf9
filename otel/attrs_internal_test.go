package oncommitotel

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/oncommit/oncommit/outbox"
)

// keepSpan is a recording span of a type other than the SDK's that keeps
// the slices SetAttributes is given, as the API allows.
type keepSpan struct {
	noop.Span
	kept [][]attribute.KeyValue
}

func (*keepSpan) IsRecording() bool { return true }

func (s *keepSpan) SetAttributes(kv ...attribute.KeyValue) { s.kept = append(s.kept, kv) }

// TestCopiesAttributes: the SDK's recording span is known to copy what
// SetAttributes gives it, and any other span type is not; a span that is
// not known to copy keeps, from each delivery, a slice no later delivery
// touches.
func TestCopiesAttributes(t *testing.T) {
	tel, err := New(Config{TracerProvider: noop.NewTracerProvider(),
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))})
	if err != nil {
		t.Fatal(err)
	}
	_, sdkSpan := sdktrace.NewTracerProvider().Tracer("t").Start(context.Background(), "s")
	if !tel.copiesAttributes(sdkSpan) {
		t.Errorf("the SDK's span (%T) is not recognised as copying its attributes", sdkSpan)
	}
	ks := &keepSpan{}
	if tel.copiesAttributes(ks) {
		t.Fatalf("%T is taken for a span that copies its attributes", ks)
	}
	ps := tel.processStart("orders")
	d1 := outbox.Delivery{ID: outbox.NewID(), Topic: "orders", Attempt: 1}
	d2 := outbox.Delivery{ID: outbox.NewID(), Topic: "orders", Attempt: 2}
	tel.setProcessAttrs(ks, ps, &d1)
	tel.setProcessAttrs(ks, ps, &d2)
	for i, d := range []outbox.Delivery{d1, d2} {
		got := attribute.NewSet(ks.kept[i]...)
		if v, _ := got.Value(KeyMessageID); v.AsString() != d.ID.String() {
			t.Errorf("delivery %d: kept message id %q, want %s", i+1, v.AsString(), d.ID)
		}
		if v, _ := got.Value(KeyAttempt); v.AsInt64() != int64(d.Attempt) {
			t.Errorf("delivery %d: kept attempt %d, want %d", i+1, v.AsInt64(), d.Attempt)
		}
		if v, _ := got.Value(KeyDestination); v.AsString() != "orders" || got.Len() != 6 {
			t.Errorf("delivery %d: kept %v", i+1, ks.kept[i])
		}
	}
}
