package oncommitotel

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TestTraceparentMatchesPropagator: the fast read of a version 00
// traceparent gives the W3C propagator's span context, valid or not, and
// leaves other versions to the propagator.
func TestTraceparentMatchesPropagator(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	cases := []map[string]string{
		{"traceparent": tp},
		{"traceparent": tp, "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"},
		{"traceparent": tp, "tracestate": "not a tracestate"},
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"},
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03"},
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-04"},
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g"},
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra"},
		{"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"},
		{"traceparent": "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"},
		{"traceparent": "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01"},
	}
	for _, h := range cases {
		want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(h)))
		got, ok := traceparent(h)
		if !ok {
			t.Errorf("%q: not read, want version 00 read", h)
			continue
		}
		if !got.Equal(want) {
			t.Errorf("%q: got %v, want %v (the propagator's)", h, got, want)
		}
	}
	for _, h := range []map[string]string{{}, {"traceparent": ""}, {"traceparent": "0"}, {"traceparent": "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}} {
		if _, ok := traceparent(h); ok {
			t.Errorf("%q: read, want it left to the propagator", h)
		}
	}
}
