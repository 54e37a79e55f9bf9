// Package fwdtest is the test harness the broker forwarders' tests share:
// an outbox table on the test PostgreSQL (internal/pgtest) with a relay
// that runs a batch handler, and a child process that forwards a batch
// and is killed after the broker confirmed it and before the outcome is
// written.
package fwdtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// BatchHandler is outbox.BatchHandler.
type BatchHandler = outbox.BatchHandler

// Env is one outbox table on the test PostgreSQL.
type Env struct {
	Ob     *outbox.Outbox
	Pool   *pgxpool.Pool
	Schema string
}

// childSchema names the schema a child process (see Kill) works on.
const childSchema = "OC_FWDTEST_SCHEMA"

// New creates a table in a fresh schema (dropped when t ends), or skips t
// (fails it under CI=true) when no PostgreSQL answers. ordered sets
// Config.OrderByKey.
func New(t testing.TB, ordered bool) *Env {
	t.Helper()
	schema := pgtest.Schema(t)
	return open(t, schema, ordered)
}

func open(t testing.TB, schema string, ordered bool) *Env {
	t.Helper()
	db := pgtest.Open(t, "pgx")
	table := schema + ".outbox"
	if err := postgres.Migrate(context.Background(), db, table); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: table, OrderByKey: ordered})
	if err != nil {
		t.Fatal(err)
	}
	return &Env{Ob: ob, Pool: pgtest.Pool(t), Schema: schema}
}

// Publish publishes msgs in transactions of at most 500 and returns their
// ids in order.
func (e *Env) Publish(t testing.TB, msgs ...outbox.Message) []outbox.ID {
	t.Helper()
	ctx := context.Background()
	var ids []outbox.ID
	for len(msgs) > 0 {
		k := min(len(msgs), 500)
		tx, err := e.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.Ob.PublishBatch(ctx, pgxtx.From(tx), msgs[:k])
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			ids = append(ids, r.ID)
		}
		msgs = msgs[k:]
	}
	return ids
}

// Messages returns n messages of topic, with payload {"n":i}, a header
// n=i, and keys key-(i%keys) when keys > 0.
func Messages(topic string, n, keys int) []outbox.Message {
	ms := make([]outbox.Message, n)
	for i := range ms {
		ms[i] = outbox.Message{Topic: topic, Payload: fmt.Appendf(nil, `{"n":%d}`, i), Headers: map[string]string{"n": fmt.Sprint(i)}}
		if keys > 0 {
			ms[i].Key = fmt.Sprintf("key-%d", i%keys)
		}
	}
	return ms
}

// Relay returns a relay on the table that handles topic with h (cfg's
// zero fields as the relay defaults them, the logger writing to t's
// output, polling every 20 ms).
func (e *Env) Relay(t testing.TB, cfg outbox.RelayConfig, topic string, h BatchHandler) *outbox.Relay {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = Logger(t)
	}
	r, err := e.Ob.Relay(pgxtx.FromPool(e.Pool), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.HandleBatch(topic, h); err != nil {
		t.Fatal(err)
	}
	return r
}

// Run runs r until the returned stop is called (or t ends); stop waits for
// Run to return.
func Run(t testing.TB, r *outbox.Relay) (stop func()) { return dialecttest.StartRelay(t, r) }

// Drain runs a relay (see Relay) until the table is empty, failing t
// after timeout.
func (e *Env) Drain(t testing.TB, cfg outbox.RelayConfig, topic string, h BatchHandler, timeout time.Duration) {
	t.Helper()
	stop := Run(t, e.Relay(t, cfg, topic, h))
	e.WaitEmpty(t, timeout)
	stop()
}

// Rows counts the table's rows in each state.
func (e *Env) Rows(t testing.TB) map[string]int {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(), `SELECT state::text, count(*) FROM `+pgsql.QuoteTable(e.Ob.Table())+` GROUP BY state`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		got[s] = n
	}
	return got
}

// WaitEmpty waits until the table has no row, or fails t after timeout
// with the rows left.
func (e *Env) WaitEmpty(t testing.TB, timeout time.Duration) {
	t.Helper()
	e.WaitRows(t, timeout, func(m map[string]int) bool { return len(m) == 0 })
}

// WaitRows waits until ok(Rows) holds, or fails t after timeout.
func (e *Env) WaitRows(t testing.TB, timeout time.Duration, ok func(map[string]int) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m := e.Rows(t)
		if ok(m) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v the table holds %v", timeout, m)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Logger returns a logger writing to t's output.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// IsChild skips t unless this process is a child started by Kill.
func IsChild(t testing.TB) {
	t.Helper()
	if os.Getenv(childSchema) == "" {
		t.Skip("helper process of Kill")
	}
}

// Child is the body of a child process started by Kill: it runs a relay
// (1 s leases) on the parent's table with h for topic "orders", prints a
// line per message h reported done (or failed), then blocks for good in
// the handler, so that no outcome is written before the parent kills the
// process. Call IsChild first.
func Child(t testing.TB, h BatchHandler) {
	t.Helper()
	var mu sync.Mutex
	env := open(t, os.Getenv(childSchema), false)
	Run(t, env.Relay(t, outbox.RelayConfig{Lease: time.Second}, "orders", func(ctx context.Context, ds []outbox.Delivery) []error {
		out := h(ctx, ds)
		mu.Lock()
		for i, err := range out {
			if err == nil {
				fmt.Printf("ACKED %s\n", ds[i].ID)
			} else {
				fmt.Printf("FAILED %s %v\n", ds[i].ID, err)
			}
		}
		mu.Unlock()
		select {} // killed here: after the broker confirmed, before the settle
	}))
	select {} // until killed
}

// Kill runs the test named helper of this test binary as a child process
// on e's table (see Child), waits until it printed n ACKED lines (the
// broker confirmed n messages), SIGKILLs it, and returns the acked ids. It
// fails t when the child prints a FAILED line or exits first, or after
// timeout.
func (e *Env) Kill(t testing.TB, helper string, n int, timeout time.Duration, env ...string) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$", "-test.v")
	cmd.Env = append(append(os.Environ(), childSchema+"="+e.Schema), env...)
	cmd.Stderr = t.Output()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	var acked []string
	deadline := time.After(timeout)
	for len(acked) < n {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("child exited after %d of %d ACKED lines", len(acked), n)
			}
			switch f := strings.Fields(l); {
			case len(f) == 2 && f[0] == "ACKED":
				acked = append(acked, f[1])
			case len(f) > 0 && f[0] == "FAILED":
				t.Fatalf("child: %s", l)
			}
		case <-deadline:
			t.Fatalf("child printed %d of %d ACKED lines in %v", len(acked), n, timeout)
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	return acked
}

// Recorder wraps a batch handler and records when each message was
// reported done and the failed outcomes.
type Recorder struct {
	mu     sync.Mutex
	doneAt []time.Time
	doneID map[outbox.ID]time.Time // the first time each message was done
	errs   []error
}

// Wrap returns h, recording its outcomes.
func (rc *Recorder) Wrap(h BatchHandler) BatchHandler {
	return func(ctx context.Context, ds []outbox.Delivery) []error {
		out := h(ctx, ds)
		now := time.Now()
		rc.mu.Lock()
		defer rc.mu.Unlock()
		for i, err := range out {
			if err == nil {
				rc.doneAt = append(rc.doneAt, now)
				if rc.doneID == nil {
					rc.doneID = map[outbox.ID]time.Time{}
				}
				if _, ok := rc.doneID[ds[i].ID]; !ok {
					rc.doneID[ds[i].ID] = now
				}
			} else {
				rc.errs = append(rc.errs, err)
			}
		}
		return out
	}
}

// Outcomes returns the times messages were reported done and the failed
// outcomes so far.
func (rc *Recorder) Outcomes() (doneAt []time.Time, errs []error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]time.Time(nil), rc.doneAt...), append([]error(nil), rc.errs...)
}

// Setting is a named configuration (of a client, a broker, a forwarder)
// that a fault test runs under.
type Setting[C any] struct {
	Name string
	C    C
}

// Under runs f once per setting, as parallel subtests of t, which it
// makes parallel too.
func Under[C any](t *testing.T, settings []Setting[C], f func(t *testing.T, s Setting[C])) {
	t.Parallel()
	for _, s := range settings {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			f(t, s)
		})
	}
}

// Named returns the setting called name (a child process of Kill gets the
// name in its environment), or fails t.
func Named[C any](t testing.TB, settings []Setting[C], name string) Setting[C] {
	t.Helper()
	for _, s := range settings {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no setting %q", name)
	return Setting[C]{}
}

// OutageRelay returns the configuration of the relay Outage runs: it
// retries every 100 ms to 1 s, for ever, on 5 s leases. A fault test's
// forwarder settings that depend on the relay's (a duplicate window, a
// timeout below the lease) are made for this one.
func OutageRelay() outbox.RelayConfig {
	return outbox.RelayConfig{RetryBase: 100 * time.Millisecond, RetryCap: time.Second, MaxAttempts: outbox.UnlimitedAttempts, Lease: 5 * time.Second}
}

// Fault is what Outage does to the broker.
type Fault struct {
	// Down takes the broker away (stops it, cuts or stalls the
	// connections to it); Up brings it back For later (10 s when 0).
	Down, Up func()
	For      time.Duration
	// Grace is how long after Down's return the broker's last answers
	// may still be reported done.
	Grace time.Duration
}

// Outage runs a relay (OutageRelay) with h while messages are published,
// 10 per transaction every 100 ms, from the start until 2 s after Up: 3 s
// in it calls f.Down, f.For later f.Up; then it waits until the table is
// empty and returns the ids published. It fails t when a message
// published while the broker was away was reported done before Up (no
// broker could have confirmed it: this check has no timing margin), when
// any message was reported done between Down's return plus f.Grace (the
// broker's last answers before it went away) and Up, and when no outcome
// failed (the outage was not felt).
func (e *Env) Outage(t testing.TB, h BatchHandler, f Fault) []outbox.ID {
	t.Helper()
	if f.For == 0 {
		f.For = 10 * time.Second
	}
	var rc Recorder
	stop := Run(t, e.Relay(t, OutageRelay(), "orders", rc.Wrap(h)))
	var downFrom, downTo atomic.Int64 // unix nanoseconds, 0 until set
	var ids, whileDown []outbox.ID
	published := make(chan struct{})
	batches := int((5*time.Second + f.For) / (100 * time.Millisecond))
	go func() {
		defer close(published)
		for i := range batches {
			ms := Messages("orders", 10, 0)
			for j := range ms {
				ms[j].Headers["n"] = fmt.Sprint(i*10 + j)
			}
			start := time.Now().UnixNano()
			got := e.Publish(t, ms...)
			ids = append(ids, got...)
			if from := downFrom.Load(); from != 0 && start > from && downTo.Load() == 0 {
				whileDown = append(whileDown, got...)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	time.Sleep(3 * time.Second)
	f.Down()
	downFrom.Store(time.Now().UnixNano())
	time.Sleep(f.For)
	upAt := time.Now()
	downTo.Store(upAt.UnixNano())
	f.Up()
	<-published
	e.WaitEmpty(t, 2*time.Minute)
	stop()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	early := 0
	for _, id := range whileDown {
		if at, ok := rc.doneID[id]; ok && at.Before(upAt) {
			early++
		}
	}
	if early > 0 || len(whileDown) == 0 {
		t.Errorf("%d of the %d messages published while the broker was away were reported done before it came back, want 0 of more than 0", early, len(whileDown))
	}
	during, from := 0, time.Unix(0, downFrom.Load()).Add(f.Grace)
	for _, at := range rc.doneAt {
		if at.After(from) && at.Before(upAt) {
			during++
		}
	}
	if during > 0 {
		t.Errorf("%d messages reported done while the broker was away", during)
	}
	if len(rc.errs) == 0 {
		t.Error("no publish failed: the outage was not felt")
	}
	t.Logf("%d messages (%d published while the broker was away), %d done outcomes, %d failed ones (retried)", len(ids), len(whileDown), len(rc.doneAt), len(rc.errs))
	return ids
}

// CheckKeyOrder fails t unless, for messages of Messages(topic, n, keys)
// whose header n values are ns in the broker's order, each key's
// messages come in publish order.
func CheckKeyOrder(t testing.TB, ns []string, keys int) {
	t.Helper()
	last := map[int]int{}
	for _, s := range ns {
		var n int
		if _, err := fmt.Sscan(s, &n); err != nil {
			t.Fatalf("header n %q: %v", s, err)
		}
		k := n % keys
		if p, ok := last[k]; ok && n < p {
			t.Errorf("key-%d: message %d after %d on the broker", k, n, p)
		}
		last[k] = n
	}
}

// Log is a buffer to give a logger, safe for concurrent use.
type Log struct {
	mu sync.Mutex
	b  strings.Builder
}

// Logger returns a text logger writing to l.
func (l *Log) Logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Reset forgets what was written.
func (l *Log) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Reset()
}

// CreatedAt returns the created_at of every message in e's table, by id
// (as text): what the database stored, to the microsecond.
func (e *Env) CreatedAt(t testing.TB) map[string]time.Time {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(), `SELECT id::text, created_at FROM `+pgsql.QuoteTable(e.Ob.Table()))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		out[id] = at
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
