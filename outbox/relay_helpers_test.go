package outbox_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// fast is a relay configuration for tests: short polls, leases and retries,
// logging through t.Output() (shown when the test fails or with -v).
func fast(t testing.TB, cfg outbox.RelayConfig) outbox.RelayConfig {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	if cfg.RetryBase == 0 {
		cfg.RetryBase = 10 * time.Millisecond
		cfg.RetryCap = 20 * time.Millisecond
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 2 * time.Second
	}
	return cfg
}

// running is a relay started in the background.
type running struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// start runs r until stop (or the test's end).
func start(t testing.TB, r *outbox.Relay) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rr := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(ctx) }()
	t.Cleanup(func() { rr.stop(t) })
	return rr
}

// stop cancels the relay and waits for Run to return.
func (rr *running) stop(t testing.TB) {
	t.Helper()
	rr.once.Do(func() {
		rr.cancel()
		select {
		case err := <-rr.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return")
		}
	})
}

// pool returns a pgx pool for the test.
func pool(t testing.TB) *pgxpool.Pool { return pgtest.Pool(t) }

// publishN publishes n messages of topic with payload p in one transaction.
func publishN(t testing.TB, e *env, p *pgxpool.Pool, n int, msg outbox.Message) []outbox.ID {
	t.Helper()
	ctx := context.Background()
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = msg
	}
	var ids []outbox.ID
	for len(msgs) > 0 {
		k := min(len(msgs), 1000)
		res, err := e.ob.PublishBatch(ctx, pgxtx.From(tx), msgs[:k])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			ids = append(ids, r.ID)
		}
		msgs = msgs[k:]
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return ids
}

// eventually waits until cond holds, failing the test after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// recorder records deliveries.
type recorder struct {
	mu   sync.Mutex
	seen map[outbox.ID][]int // attempts seen per id
	n    int
}

func newRecorder() *recorder { return &recorder{seen: map[outbox.ID][]int{}} }

func (r *recorder) add(d outbox.Delivery) {
	r.mu.Lock()
	r.seen[d.ID] = append(r.seen[d.ID], d.Attempt)
	r.n++
	r.mu.Unlock()
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func (r *recorder) attempts(id outbox.ID) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.seen[id]...)
}

// logBuffer is a slog handler target that tests can search.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// rowState reads a message's state, attempts and last error.
func rowState(t testing.TB, e *env, id outbox.ID) (state string, attempts int, lastErr string) {
	t.Helper()
	var le *string
	err := pgtest.Admin(t).QueryRow(`SELECT state, attempts, last_error FROM `+e.table+` WHERE id = $1`, id.String()).Scan(&state, &attempts, &le)
	if err != nil {
		return "gone", 0, ""
	}
	if le != nil {
		lastErr = *le
	}
	return state, attempts, lastErr
}

// isSettleDelete reports whether q is the PostgreSQL settle statement that
// deletes successes (not a claim carrying them).
func isSettleDelete(q string) bool { return strings.HasPrefix(q, "WITH s AS (DELETE") }
