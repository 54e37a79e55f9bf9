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
// off (no hook, no observer) against on (messages published with
// oncommitotel's hook, so they carry a traceparent; the relay with its
// observer: a process span per delivery, every sampled, through a batch
// span processor, and the metrics into an SDK meter), in -rounds rounds
// alternating which goes first, and prints the medians and on/off ratios.
//
//	go run ./bench -only obs -rounds 5 -counters=false
func obsBench(ctx context.Context, pool *pgxpool.Pool) {
	fmt.Printf("\n== obs: drain %d messages with one relay, OpenTelemetry tracing and metrics off vs on, %d rounds (alternating order)\n", *n, *rounds)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}))
	defer tp.Shutdown(ctx)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(ctx)
	tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: tp, MeterProvider: mp})
	check(err)

	names := []string{"off", "on"}
	secs, cpus, allocs := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for round := 1; round <= *rounds; round++ {
		order := names
		if round%2 == 0 {
			order = []string{"on", "off"}
		}
		for _, name := range order {
			ob := table(ctx, pool, "obs")
			var observer []outbox.RelayObserver
			pub := ob
			if name == "on" {
				pub, err = outbox.New(postgres.Dialect(), outbox.Config{Table: ob.Table().String(), Hook: tel})
				check(err)
				observer = append(observer, tel)
			}
			fill(ctx, pool, pub, *n, "bench")
			run := relays(ctx, ob, 1, *n, observer...)
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			cpu0 := processCPU()
			t0 := time.Now()
			run()
			s := time.Since(t0).Seconds()
			cpu := processCPU() - cpu0
			runtime.ReadMemStats(&m1)
			if left := remaining(ctx, pool, ob); left != 0 {
				check(fmt.Errorf("obs %s left %d rows", name, left))
			}
			perCPU, perAlloc := float64(cpu.Nanoseconds())/1e3/float64(*n), float64(m1.Mallocs-m0.Mallocs)/float64(*n)
			secs[name] = append(secs[name], s)
			cpus[name] = append(cpus[name], perCPU)
			allocs[name] = append(allocs[name], perAlloc)
			fmt.Printf("round %d %-3s %6.2fs  %8.0f msg/s  client CPU %5.1f µs/msg  %5.1f allocs/msg\n", round, name, s, float64(*n)/s, perCPU, perAlloc)
		}
	}
	for _, name := range names {
		fmt.Printf("median %-3s %8.0f msg/s (%.0f-%.0f)  client CPU %5.1f µs/msg  %5.1f allocs/msg\n", name,
			float64(*n)/median(secs[name]), float64(*n)/slices.Max(secs[name]), float64(*n)/slices.Min(secs[name]),
			median(cpus[name]), median(allocs[name]))
	}
	fmt.Printf("on/off throughput = %.2fx (medians), client CPU on/off = %.2fx, allocations added = %.1f per message\n",
		median(secs["off"])/median(secs["on"]), median(cpus["on"])/median(cpus["off"]), median(allocs["on"])-median(allocs["off"]))
}
