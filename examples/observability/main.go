// Command observability is a small service on PostgreSQL that publishes
// orders in traced requests and delivers them with a relay, instrumented
// with OpenTelemetry (package oncommitotel): spans from the request that
// published a message to the handler that processed it, the messaging
// metrics and the queue gauges, exported for Prometheus on /metrics, with
// the relay's health on /ready.
//
//	go run ./examples/observability                 # until Ctrl-C
//	go run ./examples/observability -demo 5s        # a short demo, then exit
//
// It prints where to scrape. Flags: -db (default $DATABASE_URL, else the
// local test server), -addr, -table. docs/observability.md explains every
// signal.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "observability:", err)
		os.Exit(1)
	}
}

// OrderPlaced is the demo's message.
type OrderPlaced struct {
	OrderID string `json:"order_id"`
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("observability", flag.ContinueOnError)
	dbURL := fs.String("db", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL URL")
	addr := fs.String("addr", "127.0.0.1:9464", "address to serve /metrics and /ready on")
	table := fs.String("table", "oncommit_observability_demo", "outbox table (created when missing)")
	demo := fs.Duration("demo", 0, "publish for this long, print the metrics, and exit (0: run until interrupted)")
	if err := fs.Parse(args); err != nil {
		return err
	}

	db, err := sql.Open("pgx", *dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := postgres.Migrate(ctx, db, *table); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}

	// Metrics: the OpenTelemetry SDK, read by the Prometheus exporter into
	// a registry of our own, served on /metrics.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer meters.Shutdown(context.WithoutCancel(ctx))
	// Traces: printed one line per span (use an OTLP exporter in a real
	// service).
	tracers := sdktrace.NewTracerProvider(sdktrace.WithSyncer(&lineExporter{out: out}))
	defer tracers.Shutdown(context.WithoutCancel(ctx))

	tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: tracers, MeterProvider: meters})
	if err != nil {
		return err
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: *table, Hook: tel})
	if err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelWarn}))
	relay, err := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{
		Observer: tel, Logger: quiet, PollInterval: 200 * time.Millisecond,
		MaxAttempts: 3, RetryBase: 100 * time.Millisecond, RetryCap: time.Second,
	})
	if err != nil {
		return err
	}
	err = outbox.HandleJSON(relay, "order.placed", func(ctx context.Context, d outbox.Delivery, o OrderPlaced) error {
		time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond) // the "work"
		switch {
		case strings.HasSuffix(o.OrderID, "7"):
			return outbox.DeadLetter(errors.New("order 7s are refused")) // dead-lettered at once
		case rand.IntN(4) == 0 && d.Attempt == 1:
			return errors.New("mail server busy") // retried
		}
		return nil
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		h := relay.Health()
		if err := h.Err(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"last_claim": h.LastClaim, "listener": h.Listener.String(), "in_flight": h.InFlight})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "scrape %s/metrics (relay health: %s/ready)\n", base, base)

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(runCtx) }()
	// One replica measures the queue gauges: the advisory lock elects it.
	queueDone := make(chan error, 1)
	go func() {
		queueDone <- tel.ObserveQueue(runCtx, ob, sqltx.FromDB(db), oncommitotel.QueueConfig{
			Interval: time.Second, Elector: oncommitotel.PostgresLock(db, 0x6f6e636f),
		})
	}()

	pubCtx := ctx
	if *demo > 0 {
		var cancel context.CancelFunc
		pubCtx, cancel = context.WithTimeout(ctx, *demo)
		defer cancel()
	}
	tracer := tracers.Tracer("example/observability")
	for n := 1; pubCtx.Err() == nil; n++ {
		if err := placeOrder(pubCtx, tracer, db, ob, fmt.Sprint(n)); err != nil && pubCtx.Err() == nil {
			return err
		}
		select {
		case <-pubCtx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	if ctx.Err() == nil { // the demo is over: let the relay catch up, then show the metrics
		time.Sleep(1500 * time.Millisecond)
		if err := printMetrics(out, base+"/metrics"); err != nil {
			return err
		}
	}
	stopRun()
	return errors.Join(<-relayDone, <-queueDone)
}

// placeOrder is a request handler: in its span, one transaction stores the
// order's message (a real service writes its order row in it too).
func placeOrder(ctx context.Context, tracer trace.Tracer, db *sql.DB, ob *outbox.Outbox, id string) error {
	ctx, span := tracer.Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	payload, _ := json.Marshal(OrderPlaced{OrderID: id})
	if _, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.placed", Key: id, Payload: payload}); err != nil {
		return err
	}
	return tx.Commit()
}

// printMetrics prints the oncommit and messaging lines of the scrape.
func printMetrics(out io.Writer, url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "metrics after the demo:")
	for line := range strings.SplitSeq(string(body), "\n") {
		if (strings.HasPrefix(line, "messaging_") || strings.HasPrefix(line, "oncommit_")) && !strings.Contains(line, "_bucket{") {
			fmt.Fprintln(out, " ", line)
		}
	}
	return nil
}

// lineExporter prints a line per process span: its trace, and the create
// span it links to (the request that published the message).
type lineExporter struct{ out io.Writer }

func (e *lineExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	for _, s := range spans {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		link := "none"
		if l := s.Links(); len(l) > 0 {
			link = l[0].SpanContext.TraceID().String() + "/" + l[0].SpanContext.SpanID().String()
		}
		fmt.Fprintf(e.out, "span %q status=%s trace=%s links-to=%s\n", s.Name(), s.Status().Code, s.SpanContext().TraceID(), link)
	}
	return nil
}

func (*lineExporter) Shutdown(context.Context) error { return nil }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
