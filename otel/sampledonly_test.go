package oncommitotel_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/baggage"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

// TestSampledContextOnly checks which headers PublishStart writes, with
// Config.SampledContextOnly and without, for a create span that is sampled
// and one that is not, with and without baggage: the trace context is
// left out only for an unsampled span with the option; baggage is always
// written; a message given nothing keeps nil headers (stored as NULL).
func TestSampledContextOnly(t *testing.T) {
	for _, c := range []struct {
		name               string
		only, sampled, bag bool
		wantTraceparent    bool
	}{
		{"default/sampled", false, true, false, true},
		{"default/unsampled", false, false, false, true},
		{"only/sampled", true, true, false, true},
		{"only/unsampled", true, false, false, false},
		{"only/unsampled/baggage", true, false, true, false},
		{"only/sampled/baggage", true, true, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			sampler := sdktrace.NeverSample()
			if c.sampled {
				sampler = sdktrace.AlwaysSample()
			}
			tel, err := oncommitotel.New(oncommitotel.Config{
				TracerProvider:     sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler)),
				MeterProvider:      sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
				SampledContextOnly: c.only,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if c.bag {
				member, _ := baggage.NewMember("tenant", "t-42")
				bag, _ := baggage.New(member)
				ctx = baggage.ContextWithBaggage(ctx, bag)
			}
			m := outbox.Message{Topic: "orders"}
			tel.PublishStart(ctx, &m)
			tp, hasTP := m.Headers["traceparent"]
			if hasTP != c.wantTraceparent {
				t.Fatalf("traceparent %q present = %v, want %v (headers %v)", tp, hasTP, c.wantTraceparent, m.Headers)
			}
			if hasTP {
				flags := tp[len(tp)-2:]
				if want := map[bool]string{true: "01", false: "00"}[c.sampled]; flags != want {
					t.Errorf("traceparent %q: flags %s, want %s", tp, flags, want)
				}
			}
			if got := m.Headers["baggage"]; c.bag != (got != "") {
				t.Errorf("baggage header %q with baggage %v", got, c.bag)
			}
			if !hasTP && !c.bag && m.Headers != nil {
				t.Errorf("headers %#v, want nil (nothing to carry)", m.Headers)
			}
		})
	}
}
