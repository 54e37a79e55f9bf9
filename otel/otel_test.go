package oncommitotel_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

// env is an outbox table in a fresh schema.
type env struct {
	table string
}

func newEnv(t *testing.T) env {
	t.Helper()
	table := pgtest.Schema(t) + ".outbox"
	if err := postgres.Migrate(context.Background(), pgtest.Admin(t), table); err != nil {
		t.Fatal(err)
	}
	return env{table: table}
}

// telemetry is a Telemetry recording into memory.
type telemetry struct {
	*oncommitotel.Telemetry
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
}

func newTelemetry(t *testing.T, cfg oncommitotel.Config) telemetry {
	t.Helper()
	tm := telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tm.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tm.spans))
	cfg.TracerProvider = tm.tp
	cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tm.reader))
	var err error
	if tm.Telemetry, err = oncommitotel.New(cfg); err != nil {
		t.Fatal(err)
	}
	return tm
}

// ended returns the ended spans whose name starts with prefix.
func (tm telemetry) ended(prefix string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tm.spans.Ended() {
		if strings.HasPrefix(s.Name(), prefix) {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value.String()
		}
	}
	return ""
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runRelay runs a relay on e's table with obs and handlers until the test
// ends.
func runRelay(t *testing.T, e env, ob *outbox.Outbox, obs outbox.RelayObserver, cfg outbox.RelayConfig, handlers map[string]outbox.Handler) {
	t.Helper()
	cfg.Observer = obs
	cfg.PollInterval = 50 * time.Millisecond
	cfg.RetryBase, cfg.RetryCap = 10*time.Millisecond, 20*time.Millisecond
	r, err := ob.Relay(pgxtx.FromPool(pgtest.Pool(t)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for topic, h := range handlers {
		if err := r.Handle(topic, h); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// published is what the publishing process reports of one message.
type published struct {
	ID      string `json:"id"`
	Topic   string `json:"topic"`
	TraceID string `json:"trace_id"`
	SpanID  string `json:"span_id"`
}

// TestPublisherProcess is the publishing process of
// TestTraceAcrossProcesses (it does nothing on its own): in a request span,
// it publishes one message and a batch of two with its own Telemetry,
// checks its own spans (the batch's send span links both create spans),
// and prints each message's id and create span.
func TestPublisherProcess(t *testing.T) {
	table := os.Getenv("ONCOMMITOTEL_PUBLISH_TABLE")
	if table == "" {
		t.Skip("run by TestTraceAcrossProcesses")
	}
	tm := newTelemetry(t, oncommitotel.Config{})
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: table, Hook: tm})
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.Open(t, "pgx")
	ctx, request := tm.tp.Tracer("test").Start(context.Background(), "request")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	one, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "single", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{{Topic: "batch"}, {Topic: "batch"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	request.End()
	creates := tm.ended("create ")
	if len(creates) != 3 {
		t.Fatalf("%d create spans, want 3", len(creates))
	}
	sends := tm.ended("send")
	if len(sends) != 1 || len(sends[0].Links()) != 2 || attr(sends[0], oncommitotel.KeyBatchCount) != "2" {
		t.Fatalf("send spans %v, want one linking the batch's two create spans", sends)
	}
	ids := []outbox.ID{one.ID, batch[0].ID, batch[1].ID}
	for i, c := range creates {
		if c.SpanKind() != trace.SpanKindProducer || c.Parent().SpanID() != request.SpanContext().SpanID() {
			t.Errorf("create span %d: kind %v, parent %v, want PRODUCER, child of the request", i, c.SpanKind(), c.Parent().SpanID())
		}
		if got := attr(c, oncommitotel.KeyMessageID); got != ids[i].String() {
			t.Errorf("create span %d: message id %q, want %q", i, got, ids[i])
		}
		if i > 0 && sends[0].Links()[i-1].SpanContext.SpanID() != c.SpanContext().SpanID() {
			t.Errorf("the send span's link %d is not the create span of message %d", i-1, i)
		}
		json.NewEncoder(os.Stdout).Encode(published{ID: ids[i].String(), Topic: attr(c, oncommitotel.KeyDestination),
			TraceID: c.SpanContext().TraceID().String(), SpanID: c.SpanContext().SpanID().String()})
	}
}

// TestTraceAcrossProcesses: messages published in a request span by
// another process reach the relay with their creation context in the
// headers (traceparent), and each delivery's CONSUMER process span links
// to its create span and starts a trace of its own; with ProcessAsChild it
// is also the create span's child.
func TestTraceAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestPublisherProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "ONCOMMITOTEL_PUBLISH_TABLE="+e.table)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("publishing process: %v\n%s\n%s", err, out, stderr.String())
	}
	var pubs []published
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var p published
		if json.Unmarshal(sc.Bytes(), &p) == nil && p.ID != "" {
			pubs = append(pubs, p)
		}
	}
	if len(pubs) != 3 {
		t.Fatalf("the publishing process reported %d messages, want 3:\n%s", len(pubs), out)
	}
	admin := pgtest.Admin(t)
	for _, p := range pubs {
		var tp string
		if err := admin.QueryRow(`SELECT headers->>'traceparent' FROM `+e.table+` WHERE id = $1`, p.ID).Scan(&tp); err != nil {
			t.Fatal(err)
		}
		if want := "00-" + p.TraceID + "-" + p.SpanID + "-01"; tp != want {
			t.Errorf("message %s: traceparent %q, want %q", p.ID, tp, want)
		}
	}

	for _, child := range []bool{false, true} {
		t.Run(fmt.Sprintf("child=%v", child), func(t *testing.T) {
			if child { // a second delivery of the same messages
				if _, err := admin.Exec(`UPDATE ` + e.table + ` SET state = 'pending', available_at = now(), settled_at = NULL`); err != nil {
					t.Fatal(err)
				}
			}
			tm := newTelemetry(t, oncommitotel.Config{ProcessAsChild: child})
			ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: e.table})
			if err != nil {
				t.Fatal(err)
			}
			ok := func(context.Context, outbox.Delivery) error { return nil }
			runRelay(t, e, ob, tm, outbox.RelayConfig{KeepDelivered: outbox.Forever},
				map[string]outbox.Handler{"single": ok, "batch": ok})
			eventually(t, "3 process spans", func() bool { return len(tm.ended("process ")) == 3 })
			byID := map[string]sdktrace.ReadOnlySpan{}
			for _, s := range tm.ended("process ") {
				byID[attr(s, oncommitotel.KeyMessageID)] = s
			}
			for _, p := range pubs {
				s := byID[p.ID]
				if s == nil {
					t.Fatalf("no process span for message %s", p.ID)
				}
				if s.SpanKind() != trace.SpanKindConsumer || s.Name() != "process "+p.Topic {
					t.Errorf("process span %q kind %v", s.Name(), s.SpanKind())
				}
				if len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID().String() != p.SpanID || s.Links()[0].SpanContext.TraceID().String() != p.TraceID {
					t.Errorf("message %s: links %v, want the create span %s/%s", p.ID, s.Links(), p.TraceID, p.SpanID)
				}
				sameTrace := s.SpanContext().TraceID().String() == p.TraceID
				isChild := s.Parent().SpanID().String() == p.SpanID
				if sameTrace != child || isChild != child {
					t.Errorf("message %s with ProcessAsChild=%v: in the request's trace %v, child of its create span %v", p.ID, child, sameTrace, isChild)
				}
				if got := attr(s, oncommitotel.KeyOutcome); got != "" {
					t.Errorf("a successful delivery's span has oncommit.outcome %q, want none", got)
				}
				for k, want := range map[attribute.Key]string{oncommitotel.KeySystem: "oncommit", oncommitotel.KeyDestination: p.Topic,
					oncommitotel.KeyOperationType: "process", oncommitotel.KeyAttempt: map[bool]string{false: "1", true: "2"}[child]} {
					if got := attr(s, k); got != want {
						t.Errorf("process span attribute %s = %q, want %q", k, got, want)
					}
				}
			}
		})
	}
}

// metrics collects tm's metrics by name.
func (tm telemetry) metrics(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tm.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// sums returns a counter's values by the attribute set's rendering.
func sums(t *testing.T, m metricdata.Metrics) map[string]int64 {
	t.Helper()
	s, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is a %T, want an int64 sum", m.Name, m.Data)
	}
	out := map[string]int64{}
	for _, dp := range s.DataPoints {
		out[render(dp.Attributes)] += dp.Value
	}
	return out
}

// render renders an attribute set without messaging.system (checked apart).
func render(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		if kv.Key != oncommitotel.KeySystem {
			parts = append(parts, string(kv.Key)+"="+kv.Value.String())
		}
	}
	return strings.Join(parts, ",")
}

// TestMetricsAndErrorSpans: the semantic conventions' metrics (names,
// units, attributes by name) and oncommit's own, after deliveries that
// succeed, fail then dead-letter at their last attempt, and cancel; the
// failed deliveries' spans carry error.type and an error status.
func TestMetricsAndErrorSpans(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tm := newTelemetry(t, oncommitotel.Config{ClaimSpans: true, SettleSpans: true})
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: e.table, Hook: tm})
	if err != nil {
		t.Fatal(err)
	}
	p := pgtest.Pool(t)
	ctx := context.Background()
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.PublishBatch(ctx, pgxtx.From(tx), []outbox.Message{{Topic: "ok"}, {Topic: "ok"}, {Topic: "fail"}, {Topic: "cancel"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Publish(ctx, pgxtx.From(tx), outbox.Message{Topic: strings.Repeat("x", 1000)}); err == nil {
		t.Fatal("a topic of 1000 bytes was accepted")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	runRelay(t, e, ob, tm, outbox.RelayConfig{MaxAttempts: 2}, map[string]outbox.Handler{
		"ok":     func(context.Context, outbox.Delivery) error { return nil },
		"fail":   func(context.Context, outbox.Delivery) error { return boom },
		"cancel": func(context.Context, outbox.Delivery) error { return outbox.DeadLetter(boom) },
	})
	eventually(t, "5 process spans", func() bool { return len(tm.ended("process ")) == 5 })
	eventually(t, "the outbox settled", func() bool {
		var n int
		pgtest.Admin(t).QueryRow(`SELECT count(*) FROM ` + e.table + ` WHERE state <> 'dead'`).Scan(&n)
		return n == 0
	})
	time.Sleep(200 * time.Millisecond) // the last settle's event follows its write

	for _, s := range tm.ended("process ") {
		topic := attr(s, oncommitotel.KeyDestination)
		failed := topic != "ok"
		if failed != (s.Status().Code == codes.Error) || failed != (attr(s, oncommitotel.KeyErrorType) != "") {
			t.Errorf("process span of %s: status %v, error.type %q", topic, s.Status(), attr(s, oncommitotel.KeyErrorType))
		}
		if topic == "cancel" && (attr(s, oncommitotel.KeyErrorType) != "dead_letter" || attr(s, oncommitotel.KeyOutcome) != "dead") {
			t.Errorf("cancelled delivery: error.type %q, outcome %q, want dead_letter and dead", attr(s, oncommitotel.KeyErrorType), attr(s, oncommitotel.KeyOutcome))
		}
	}
	if len(tm.ended("claim")) == 0 || len(tm.ended("settle")) == 0 {
		t.Error("ClaimSpans and SettleSpans on, but no claim or settle span")
	}
	refused := tm.ended("create " + strings.Repeat("x", 1000))
	if len(refused) != 1 || refused[0].Status().Code != codes.Error || attr(refused[0], oncommitotel.KeyErrorType) != "*outbox.MessageError" {
		t.Errorf("the refused message's create span: %v", refused)
	}

	ms := tm.metrics(t)
	units := map[string]string{
		"messaging.client.sent.messages": "{message}", "messaging.client.consumed.messages": "{message}",
		"messaging.process.duration": "s", "messaging.client.operation.duration": "s",
		"oncommit.messages.dead_lettered": "{message}", "oncommit.messages.retried": "{message}",
	}
	for name, unit := range units {
		m, ok := ms[name]
		if !ok {
			t.Errorf("no metric %s", name)
			continue
		}
		if m.Unit != unit {
			t.Errorf("%s: unit %q, want %q", name, m.Unit, unit)
		}
	}
	// Every data point carries messaging.system, and none an id.
	for name, m := range ms {
		var sets []attribute.Set
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range d.DataPoints {
				sets = append(sets, dp.Attributes)
			}
		case metricdata.Histogram[float64]:
			for _, dp := range d.DataPoints {
				sets = append(sets, dp.Attributes)
			}
		}
		for _, s := range sets {
			if v, _ := s.Value(oncommitotel.KeySystem); v.AsString() != "oncommit" {
				t.Errorf("%s: a data point without messaging.system=oncommit: %s", name, render(s))
			}
			if s.HasValue(oncommitotel.KeyMessageID) {
				t.Errorf("%s: a data point with a message id", name)
			}
		}
	}
	sent := sums(t, ms["messaging.client.sent.messages"])
	wantSent := map[string]int64{
		"messaging.destination.name=ok,messaging.operation.name=create":                                                                2,
		"messaging.destination.name=fail,messaging.operation.name=create":                                                              1,
		"messaging.destination.name=cancel,messaging.operation.name=create":                                                            1,
		"error.type=*outbox.MessageError,messaging.destination.name=" + strings.Repeat("x", 1000) + ",messaging.operation.name=create": 1,
	}
	if fmt.Sprint(sent) != fmt.Sprint(wantSent) {
		t.Errorf("sent messages %v, want %v", sent, wantSent)
	}
	consumed := sums(t, ms["messaging.client.consumed.messages"])
	if consumed["messaging.destination.name=ok,messaging.operation.name=process"] != 2 || consumed["messaging.destination.name=fail,messaging.operation.name=process"] != 2 {
		t.Errorf("consumed messages %v, want ok: 2, fail: 2", consumed)
	}
	dead := sums(t, ms["oncommit.messages.dead_lettered"])
	wantDead := map[string]int64{
		"messaging.destination.name=cancel,messaging.operation.name=process,oncommit.dead_letter.reason=cancelled":  1,
		"messaging.destination.name=fail,messaging.operation.name=process,oncommit.dead_letter.reason=last_attempt": 1,
	}
	if fmt.Sprint(dead) != fmt.Sprint(wantDead) {
		t.Errorf("dead-lettered %v, want %v", dead, wantDead)
	}
	if r := sums(t, ms["oncommit.messages.retried"]); r["messaging.destination.name=fail,messaging.operation.name=process"] != 1 || len(r) != 1 {
		t.Errorf("retried %v, want fail: 1", r)
	}
	hist, _ := ms["messaging.process.duration"].Data.(metricdata.Histogram[float64])
	var failedPoint bool
	for _, dp := range hist.DataPoints {
		et, _ := dp.Attributes.Value(oncommitotel.KeyErrorType)
		if v, _ := dp.Attributes.Value(oncommitotel.KeyDestination); v.AsString() == "fail" && et.AsString() == "*errors.errorString" {
			failedPoint = true
		}
		if !dp.Attributes.HasValue(oncommitotel.KeyDestination) || !dp.Attributes.HasValue(oncommitotel.KeyOutcome) {
			t.Errorf("process duration without topic or outcome: %s", render(dp.Attributes))
		}
	}
	if !failedPoint {
		t.Error("no process duration of the failing topic with its error.type")
	}
	ops, _ := ms["messaging.client.operation.duration"].Data.(metricdata.Histogram[float64])
	seen := map[string]bool{}
	for _, dp := range ops.DataPoints {
		v, _ := dp.Attributes.Value(oncommitotel.KeyOperationName)
		seen[v.AsString()] = true
	}
	if !seen["claim"] {
		t.Errorf("operation durations for %v, want claim (and settle when written on their own)", seen)
	}
}

// TestQueueGauges: against a seeded table, one of three replicas measures
// (the advisory lock elects it), and its gauges hold the pending, due,
// processing, dead counts and the oldest due age per topic; when it stops,
// another takes over.
func TestQueueGauges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	admin := pgtest.Admin(t)
	seed := `INSERT INTO ` + e.table + ` (id, topic, state, available_at) VALUES
		(gen_random_uuid(), 'a', 'pending', now() - interval '90 seconds'),
		(gen_random_uuid(), 'a', 'pending', now() - interval '10 seconds'),
		(gen_random_uuid(), 'a', 'pending', now() + interval '1 hour'),
		(gen_random_uuid(), 'a', 'processing', now() + interval '1 minute'),
		(gen_random_uuid(), 'a', 'dead', now() - interval '1 day'),
		(gen_random_uuid(), 'b', 'dead', now() - interval '1 day')`
	if _, err := admin.Exec(seed); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	key := rand.Int64()
	type replica struct {
		tm     telemetry
		cancel context.CancelFunc
		done   chan error
	}
	var reps []*replica
	for range 3 {
		rp := &replica{tm: newTelemetry(t, oncommitotel.Config{}), done: make(chan error, 1)}
		var ctx context.Context
		ctx, rp.cancel = context.WithCancel(context.Background())
		db := pgtest.Open(t, "pgx")
		go func() {
			rp.done <- rp.tm.ObserveQueue(ctx, ob, sqltx.FromDB(db), oncommitotel.QueueConfig{Interval: 200 * time.Millisecond, Elector: oncommitotel.PostgresLock(db, key)})
		}()
		reps = append(reps, rp)
		t.Cleanup(func() { rp.cancel(); <-rp.done })
	}
	// reporting returns the replicas whose gauges report, and the last
	// one's values.
	reporting := func(among []*replica) (int, map[string]float64) {
		n, vals := 0, map[string]float64{}
		for _, rp := range among {
			ms := rp.tm.metrics(t)
			g, ok := ms["oncommit.queue.messages"].Data.(metricdata.Gauge[int64])
			if !ok || len(g.DataPoints) == 0 {
				continue
			}
			n++
			for _, dp := range g.DataPoints {
				vals[render(dp.Attributes)] = float64(dp.Value)
			}
			if ms["oncommit.queue.oldest_due.age"].Unit != "s" || ms["oncommit.queue.messages"].Unit != "{message}" {
				t.Errorf("gauge units %q and %q", ms["oncommit.queue.oldest_due.age"].Unit, ms["oncommit.queue.messages"].Unit)
			}
			for _, dp := range ms["oncommit.queue.oldest_due.age"].Data.(metricdata.Gauge[float64]).DataPoints {
				vals[render(dp.Attributes)] = dp.Value
			}
		}
		return n, vals
	}
	eventually(t, "a replica reporting", func() bool { n, _ := reporting(reps); return n > 0 })
	time.Sleep(600 * time.Millisecond) // three more intervals: still one
	n, vals := reporting(reps)
	if n != 1 {
		t.Fatalf("%d replicas report the gauges, want 1", n)
	}
	want := map[string]float64{
		"messaging.destination.name=a,oncommit.state=pending":    3,
		"messaging.destination.name=a,oncommit.state=due":        2,
		"messaging.destination.name=b,oncommit.state=due":        0,
		"messaging.destination.name=a,oncommit.state=processing": 1,
		"messaging.destination.name=a,oncommit.state=dead":       1,
		"messaging.destination.name=a,oncommit.state=delivered":  0,
		"messaging.destination.name=b,oncommit.state=pending":    0,
		"messaging.destination.name=b,oncommit.state=processing": 0,
		"messaging.destination.name=b,oncommit.state=dead":       1,
		"messaging.destination.name=b,oncommit.state=delivered":  0,
		"messaging.destination.name=b":                           0,
	}
	for k, w := range want {
		if vals[k] != w {
			t.Errorf("%s = %v, want %v", k, vals[k], w)
		}
	}
	if age := vals["messaging.destination.name=a"]; age < 90 || age > 120 {
		t.Errorf("oldest due age of a = %vs, want about 90s", age)
	}
	// The leader stops: another replica takes over.
	var others []*replica
	for _, rp := range reps {
		if n, _ := reporting([]*replica{rp}); n == 1 {
			rp.cancel()
			if err := <-rp.done; err != nil {
				t.Errorf("ObserveQueue: %v", err)
			}
			rp.done <- nil // for the cleanup
		} else {
			others = append(others, rp)
		}
	}
	eventually(t, "another replica reporting", func() bool { n, _ := reporting(others); return n == 1 })
}
