package main

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
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

var obsCases = flag.String("obs-cases", "", "obs: run only these cases (comma-separated, off first; default all: off,on,on-10%,on-10%-so,metrics,sdk-floor,headers)")

// discardSpans is a span exporter that drops what it is given: the cost
// measured is the instrumentation's and the SDK's, not an exporter's I/O.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// sdkFloor is the least a relay observer can do to give each delivery a
// sampled span of the OpenTelemetry SDK: start a span when the handler
// starts and end it when it returns, with no attributes, links, header
// reads or metrics. The obs scenario's "sdk-floor" case drains with it, to
// show what the SDK's own span costs a drain on the host, apart from any
// instrumentation's code.
type sdkFloor struct{ tracer trace.Tracer }

func (f sdkFloor) HandlerStart(ctx context.Context, _ outbox.Delivery) context.Context {
	ctx, _ = f.tracer.Start(ctx, "process bench", trace.WithSpanKind(trace.SpanKindConsumer))
	return ctx
}
func (sdkFloor) HandlerEnd(ctx context.Context, _ outbox.HandlerEvent) {
	trace.SpanFromContext(ctx).End()
}
func (sdkFloor) ClaimEnd(context.Context, outbox.ClaimEvent)           {}
func (sdkFloor) SettleEnd(context.Context, outbox.SettleEvent)         {}
func (sdkFloor) DeadLettered(context.Context, outbox.DeadLetterEvent)  {}
func (sdkFloor) LeaseLost(context.Context, outbox.LeaseLostEvent)      {}
func (sdkFloor) ListenerChanged(context.Context, outbox.ListenerState) {}

// obsBench (-only obs) drains -n messages with one relay, observability
// off (no hook, no observer) against on: messages published with
// oncommitotel's hook (so they carry a traceparent), the relay with its
// observer (a process span per delivery through a batch span processor,
// and the metrics into an SDK meter), with every span sampled ("on"), one
// trace in ten sampled ("on-10%": ParentBased(TraceIDRatioBased(0.1))), or
// no tracer ("metrics": metrics only); "on-10%-so" is on-10% with
// Config.SampledContextOnly (messages whose create span was not sampled
// carry no trace context). "sdk-floor" publishes without the
// hook and observes with sdkFloor (a bare sampled SDK span per delivery,
// through the same batch span processor, nothing else): the SDK's own
// share of "on". "headers" publishes with the hook (messages carry a
// traceparent) and drains without an observer: what carrying and decoding
// the trace context costs. -obs-cases picks cases (off is the reference
// and must be among them). Each of -rounds rounds runs every
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
	tenth := sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1))
	for name, sampler := range map[string]sdktrace.Sampler{
		"on": sdktrace.AlwaysSample(), "on-10%": tenth, "on-10%-so": tenth, "metrics": nil,
	} {
		var tp trace.TracerProvider = noop.NewTracerProvider()
		if sampler != nil {
			sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}), sdktrace.WithSampler(sampler))
			defer sdk.Shutdown(ctx)
			tp = sdk
		}
		tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: tp, MeterProvider: mp, SampledContextOnly: name == "on-10%-so"})
		check(err)
		tels[name] = tel
	}

	floorTP := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer floorTP.Shutdown(ctx)
	floor := sdkFloor{floorTP.Tracer("bench")}

	names := []string{"off", "on", "on-10%", "on-10%-so", "metrics", "sdk-floor", "headers"}
	if *obsCases != "" {
		picked := strings.Split(*obsCases, ",")
		for _, c := range picked {
			if !slices.Contains(names, c) {
				check(fmt.Errorf("-obs-cases: unknown case %q (cases: %s)", c, strings.Join(names, ",")))
			}
		}
		if !slices.Contains(picked, "off") {
			check(fmt.Errorf("-obs-cases: off, the reference, must be among the cases"))
		}
		names = picked
	}
	secs, cpus, srvs, allocs := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	gcs, gcCPUs, bytes := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for round := 1; round <= *rounds; round++ {
		k := (round - 1) % len(names)
		order := append(slices.Clone(names[k:]), names[:k]...)
		for _, name := range order {
			ob := table(ctx, pool, "obs")
			var observer []outbox.RelayObserver
			pub := ob
			if name == "headers" {
				var err error
				pub, err = outbox.New(postgres.Dialect(), outbox.Config{Table: ob.Table().String(), Hook: tels["on"]})
				check(err)
			} else if tel := tels[name]; tel != nil {
				var err error
				pub, err = outbox.New(postgres.Dialect(), outbox.Config{Table: ob.Table().String(), Hook: tel})
				check(err)
				observer = append(observer, tel)
			} else if name == "sdk-floor" {
				observer = append(observer, floor)
			}
			fill(ctx, pool, pub, *n, "bench")
			run := relays(ctx, ob, 1, *n, observer...)
			stopProfiles := drainProfiles(fmt.Sprintf(".%s.r%d", name, round))
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			gc0 := gcCPU()
			cpu0, srv0 := processCPU(), serverCPU()
			t0 := time.Now()
			run()
			s := time.Since(t0).Seconds()
			cpu, srv := processCPU()-cpu0, serverCPU()-srv0
			gcc := gcCPU() - gc0
			runtime.ReadMemStats(&m1)
			stopProfiles()
			if left := remaining(ctx, pool, ob); left != 0 {
				check(fmt.Errorf("obs %s left %d rows", name, left))
			}
			perCPU, perAlloc := float64(cpu.Nanoseconds())/1e3/float64(*n), float64(m1.Mallocs-m0.Mallocs)/float64(*n)
			perSrv := float64(srv.Nanoseconds()) / 1e3 / float64(*n)
			secs[name] = append(secs[name], s)
			cpus[name] = append(cpus[name], perCPU)
			srvs[name] = append(srvs[name], perSrv)
			allocs[name] = append(allocs[name], perAlloc)
			perBytes, perGC := float64(m1.TotalAlloc-m0.TotalAlloc)/float64(*n), gcc.Seconds()*1e6/float64(*n)
			gcs[name], gcCPUs[name], bytes[name] = append(gcs[name], float64(m1.NumGC-m0.NumGC)), append(gcCPUs[name], perGC), append(bytes[name], perBytes)
			fmt.Printf("round %d %-9s %6.2fs  %8.0f msg/s  client CPU %5.1f µs/msg (GC %4.1f, %3d collections)  server CPU %5.1f µs/msg  %5.1f allocs, %5.0f B/msg\n",
				round, name, s, float64(*n)/s, perCPU, perGC, m1.NumGC-m0.NumGC, perSrv, perAlloc, perBytes)
		}
	}
	for _, name := range names {
		fmt.Printf("median %-9s %8.0f msg/s (%.0f-%.0f)  client CPU %5.1f µs/msg (GC %4.1f, %3.0f collections)  server CPU %5.1f µs/msg  %5.1f allocs, %5.0f B/msg\n", name,
			float64(*n)/median(secs[name]), float64(*n)/slices.Max(secs[name]), float64(*n)/slices.Min(secs[name]),
			median(cpus[name]), median(gcCPUs[name]), median(gcs[name]), median(srvs[name]), median(allocs[name]), median(bytes[name]))
	}
	for _, name := range names {
		if name == "off" {
			continue
		}
		fmt.Printf("%s/off: throughput %.2fx (medians), %.2fx paired (by round: %s), client CPU %.2fx, allocations added %.1f per message\n", name,
			median(secs["off"])/median(secs[name]), median(pairedObs(secs["off"], secs[name])), roundList(pairedObs(secs["off"], secs[name])),
			median(cpus[name])/median(cpus["off"]), median(allocs[name])-median(allocs["off"]))
	}
}

// gcCPU is the CPU time the Go runtime has spent on garbage collection
// (runtime/metrics' /cpu/classes/gc/total:cpu-seconds, an estimate the
// runtime keeps up to date at each collection).
func gcCPU() time.Duration {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return time.Duration(s[0].Value.Float64() * float64(time.Second))
}

// pairedObs is each round's throughput ratio of a case to off (the two
// drains of a round ran seconds apart): off's seconds over the case's.
func pairedObs(off, c []float64) []float64 {
	r := make([]float64, len(c))
	for i := range c {
		r[i] = off[i] / c[i]
	}
	return r
}

// roundList prints ratios as "0.91 0.88 ...".
func roundList(xs []float64) string {
	var b strings.Builder
	for i, x := range xs {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.2f", x)
	}
	return b.String()
}
