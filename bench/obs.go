package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/oncommit/oncommit/dialect/postgres"
	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

// discardSpans is a span exporter that drops what it is given: the cost
// measured is the instrumentation's and the SDK's, not an exporter's I/O.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// obsBench (-only obs) drains -n messages with one relay, observability
// off (no hook, no observer) against on: messages published with
// oncommitotel's hook (so they carry a traceparent), the relay with its
// observer (a process span per delivery through a batch span processor,
// and the metrics into an SDK meter), with every span sampled ("on"), one
// trace in ten sampled ("on-10%": ParentBased(TraceIDRatioBased(0.1))), or
// no tracer ("metrics": metrics only). Each of -rounds rounds runs every
// case, starting with a different one each round; it prints the medians
// and each case's ratio to off. -cpuprofile and -memprofile profile each
// timed drain, as with -only drain.
//
//	go run ./bench -only obs -rounds 5 -counters=false
func obsBench(ctx context.Context, pool *pgxpool.Pool) {
	fmt.Printf("\n== obs: drain %d messages with one relay, OpenTelemetry tracing and metrics off vs on, %d rounds (alternating order)\n", *n, *rounds)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(ctx)
	tels := map[string]*oncommitotel.Telemetry{}
	for name, sampler := range map[string]sdktrace.Sampler{
		"on": sdktrace.AlwaysSample(), "on-10%": sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1)), "metrics": nil,
	} {
		var tp trace.TracerProvider = noop.NewTracerProvider()
		if sampler != nil {
			sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}), sdktrace.WithSampler(sampler))
			defer sdk.Shutdown(ctx)
			tp = sdk
		}
		tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: tp, MeterProvider: mp})
		check(err)
		tels[name] = tel
	}

	names := []string{"off", "on", "on-10%", "metrics"}
	secs, cpus, allocs := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for round := 1; round <= *rounds; round++ {
		k := (round - 1) % len(names)
		order := append(slices.Clone(names[k:]), names[:k]...)
		for _, name := range order {
			ob := table(ctx, pool, "obs")
			var observer []outbox.RelayObserver
			pub := ob
			if tel := tels[name]; tel != nil {
				var err error
				pub, err = outbox.New(postgres.Dialect(), outbox.Config{Table: ob.Table().String(), Hook: tel})
				check(err)
				observer = append(observer, tel)
			}
			fill(ctx, pool, pub, *n, "bench")
			run := relays(ctx, ob, 1, *n, observer...)
			stopProfiles := drainProfiles(fmt.Sprintf(".%s.r%d", name, round))
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			cpu0 := processCPU()
			t0 := time.Now()
			run()
			s := time.Since(t0).Seconds()
			cpu := processCPU() - cpu0
			runtime.ReadMemStats(&m1)
			stopProfiles()
			if left := remaining(ctx, pool, ob); left != 0 {
				check(fmt.Errorf("obs %s left %d rows", name, left))
			}
			perCPU, perAlloc := float64(cpu.Nanoseconds())/1e3/float64(*n), float64(m1.Mallocs-m0.Mallocs)/float64(*n)
			secs[name] = append(secs[name], s)
			cpus[name] = append(cpus[name], perCPU)
			allocs[name] = append(allocs[name], perAlloc)
			fmt.Printf("round %d %-7s %6.2fs  %8.0f msg/s  client CPU %5.1f µs/msg  %5.1f allocs/msg\n", round, name, s, float64(*n)/s, perCPU, perAlloc)
		}
	}
	for _, name := range names {
		fmt.Printf("median %-7s %8.0f msg/s (%.0f-%.0f)  client CPU %5.1f µs/msg  %5.1f allocs/msg\n", name,
			float64(*n)/median(secs[name]), float64(*n)/slices.Max(secs[name]), float64(*n)/slices.Min(secs[name]),
			median(cpus[name]), median(allocs[name]))
	}
	for _, name := range names[1:] {
		fmt.Printf("%s/off: throughput %.2fx (medians), client CPU %.2fx, allocations added %.1f per message\n", name,
			median(secs["off"])/median(secs[name]), median(cpus[name])/median(cpus["off"]), median(allocs[name])-median(allocs["off"]))
	}
}
