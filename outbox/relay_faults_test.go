package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	_ "github.com/oncommit/oncommit/dialect/postgres" // fills in pgsql
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
	"go.uber.org/goleak"
)

// faultDB wraps a DB and fails the statements fail picks.
type faultDB struct {
	inner  outbox.DB
	fail   func(query string) error
	listen func(ctx context.Context, sql string, wake func(payload string)) error // nil: no listener
	claims atomic.Int32
}

func (f *faultDB) QueryDB(ctx context.Context, q string, args ...any) (outboxdriver.Rows, error) {
	if strings.Contains(q, "FOR UPDATE SKIP LOCKED") {
		f.claims.Add(1)
	}
	if f.fail != nil {
		if err := f.fail(q); err != nil {
			return nil, err
		}
	}
	return f.inner.QueryDB(ctx, q, args...)
}

// listeningFaultDB is a faultDB that is also a Listener.
type listeningFaultDB struct{ *faultDB }

func (f listeningFaultDB) CanListen() error { return nil }

func (f listeningFaultDB) ListenDB(ctx context.Context, sql string, wake func(payload string)) error {
	return f.listen(ctx, sql, wake)
}

// TestSurvivesClaimErrors: failing claims are logged and retried with
// backoff (no busy loop); delivery resumes when the database heals.
func TestSurvivesClaimErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	var broken atomic.Bool
	broken.Store(true)
	db := &faultDB{inner: pgxtx.FromPool(pool(t)), fail: func(q string) error {
		if broken.Load() && strings.Contains(q, "FOR UPDATE SKIP LOCKED") {
			return errors.New("injected claim failure")
		}
		return nil
	}}
	var logs logBuffer
	r, err := e.ob.Relay(db, fast(t, outbox.RelayConfig{PollInterval: 10 * time.Millisecond, Logger: logs.logger(), Listen: outbox.ListenOff}))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	publishN(t, e, pool(t), 3, outbox.Message{Topic: "t"})
	start(t, r)
	time.Sleep(time.Second)
	// With a 10 ms poll a busy loop would claim ~100 times in a second;
	// the backoff (100 ms doubling) allows about 4.
	if n := db.claims.Load(); n > 10 || n < 2 {
		t.Errorf("%d claim attempts in 1s while failing, want a few (backoff)", n)
	}
	if !strings.Contains(logs.String(), "claim failed") {
		t.Error("claim failure not logged")
	}
	broken.Store(false)
	eventually(t, 30*time.Second, "delivered after healing", func() bool { return rec.count() == 3 })
}

// TestSettleFailureLoggedNotFatal: a failing settle is logged, the relay
// keeps going, and writes the outcome again after a backoff, so the
// message is not delivered again (it was, after its lease, before the
// settler retried).
func TestSettleFailureLoggedNotFatal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	var failSettles atomic.Int32
	failSettles.Store(1)
	db := &faultDB{inner: pgxtx.FromPool(pool(t)), fail: func(q string) error {
		if isSettleDelete(q) && failSettles.Add(-1) >= 0 {
			return errors.New("injected settle failure")
		}
		return nil
	}}
	var logs logBuffer
	// A long poll: the success is written by the settler's own statement
	// (no claim comes along to carry it), and that statement fails.
	r, err := e.ob.Relay(db, fast(t, outbox.RelayConfig{Lease: time.Second, PollInterval: 700 * time.Millisecond, Logger: logs.logger()}))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	ids := publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
	start(t, r)
	eventually(t, 10*time.Second, "settled", func() bool { return count(t, e.table, "") == 0 })
	time.Sleep(1500 * time.Millisecond) // past the lease
	if a := rec.attempts(ids[0]); len(a) != 1 {
		t.Errorf("attempts %v, want [1]: the failed settle is written again, not redelivered", a)
	}
	if !strings.Contains(logs.String(), "settle failed") {
		t.Error("settle failure not logged")
	}
}

// TestPollsWhenListenerDown: a listener that keeps failing is retried with
// backoff, and polling still delivers.
func TestPollsWhenListenerDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	var listens atomic.Int32
	db := listeningFaultDB{&faultDB{inner: pgxtx.FromPool(pool(t)), listen: func(ctx context.Context, sql string, wake func(payload string)) error {
		listens.Add(1)
		return errors.New("injected listener failure")
	}}}
	var logs logBuffer
	r, err := e.ob.Relay(db, fast(t, outbox.RelayConfig{PollInterval: 100 * time.Millisecond, Logger: logs.logger()}))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	publishN(t, e, pool(t), 5, outbox.Message{Topic: "t"})
	start(t, r)
	eventually(t, 10*time.Second, "delivered by polling", func() bool { return rec.count() == 5 })
	time.Sleep(time.Second)
	if n := listens.Load(); n > 6 {
		t.Errorf("%d listener attempts in about a second, want backoff", n)
	}
	if !strings.Contains(logs.String(), "listener lost") {
		t.Error("listener failure not logged")
	}
}

// TestNoGoroutineLeaks: after Run returns, nothing the relay started is
// left running, over many rapid start/stop cycles with work in flight.
func TestNoGoroutineLeaks(t *testing.T) {
	e := newEnv(t, outbox.Config{})
	p := pool(t)
	db := pgxtx.FromPool(p)
	publishN(t, e, p, 200, outbox.Message{Topic: "t"})
	// Connections of the pool are shared with the test: take a snapshot
	// after the pool is warm.
	opts := goleak.IgnoreCurrent()
	for i := range 200 {
		r, err := e.ob.Relay(db, fast(t, outbox.RelayConfig{Lease: 2 * time.Second, ShutdownGrace: time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
			time.Sleep(time.Millisecond)
			return nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		time.Sleep(time.Duration(i%5) * time.Millisecond)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	p.Reset() // the listener and pool connections end with the pool's
	// Connections whose statement was cancelled are closed by pgx in the
	// background, after a cancel request that waits for the server: on a
	// loaded server that outlasts goleak's own retries (about half a
	// second). Those goroutines end; a leaked one stays.
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err = goleak.Find(opts, goleak.IgnoreAnyFunction("github.com/jackc/puddle/v2.(*Pool).Acquire.func1"),
			goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Error(err)
	}
}

// TestLeaseLostCancelsHandler: when a renewal finds that another claim took
// the message (the relay could not renew for a while and the lease lapsed),
// the handler's context is cancelled and its late outcome is fenced off.
// The same relay holds both claims of the message at once, which its
// bookkeeping must keep apart.
func TestLeaseLostCancelsHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	var renewBlocked atomic.Bool
	renewBlocked.Store(true)
	db := &faultDB{inner: pgxtx.FromPool(pool(t)), fail: func(q string) error {
		if renewBlocked.Load() && strings.HasPrefix(q, "UPDATE") && strings.Contains(q, "SET available_at = now() + make_interval") {
			return errors.New("injected renewal failure")
		}
		return nil
	}}
	tr := dialecttest.NewTrace()
	obs := &obsRecorder{}
	r, err := e.ob.Relay(db, fast(t, outbox.RelayConfig{Lease: time.Second, Tracer: tr, Observer: obs, Listen: outbox.ListenOff}))
	if err != nil {
		t.Fatal(err)
	}
	cancelled := make(chan struct{})
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		rec.add(d)
		if d.Attempt > 1 {
			return nil
		}
		<-ctx.Done()
		close(cancelled)
		return ctx.Err()
	})
	ids := publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
	start(t, r)
	eventually(t, 10*time.Second, "attempt 2 delivered after the lease lapsed", func() bool { return count(t, e.table, "") == 0 })
	renewBlocked.Store(false)
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the first handler was not cancelled after its lease was lost")
	}
	first := outboxdriver.Fence{ID: ids[0], Attempts: 1}
	eventually(t, 5*time.Second, "the first outcome written", func() bool { w, _ := tr.SettleOf(first); return w })
	if _, applied := tr.SettleOf(first); applied {
		t.Error("the late outcome applied")
	}
	if a := rec.attempts(ids[0]); len(a) != 2 {
		t.Errorf("attempts %v, want [1 2]", a)
	}
	// The observer heard of the lost lease and of the fenced-off outcome.
	eventually(t, 5*time.Second, "the fenced-off settle observed", func() bool { return obs.fencedOff() == 1 })
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.lost) != 1 || obs.lost[0].ID != ids[0] || obs.lost[0].Topic != "t" || obs.lost[0].Attempt != 1 {
		t.Errorf("lease lost events %+v, want one for %s, topic t, attempt 1", obs.lost, ids[0])
	}
}

// slowClaimDB delays each claim statement by delay, or until its context
// ends, before sending it.
type slowClaimDB struct {
	outbox.DB
	delay   time.Duration
	claimed chan struct{} // receives a value as each claim begins, if there is room
}

func (s slowClaimDB) QueryDB(ctx context.Context, q string, args ...any) (outboxdriver.Rows, error) {
	if strings.Contains(q, "FOR UPDATE SKIP LOCKED") {
		select {
		case s.claimed <- struct{}{}:
		default:
		}
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.DB.QueryDB(ctx, q, args...)
}

// TestShutdownLetsClaimFinish: a claim in flight when Run's context ends
// completes and its messages are handled and settled before Run returns
// (instead of the claim being cancelled mid-statement); a claim that cannot
// finish within a second is cancelled, so Run still returns promptly.
func TestShutdownLetsClaimFinish(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		delay  time.Duration
		handed int
	}{{"finishes", 300 * time.Millisecond, 5}, {"frozen", time.Minute, 0}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{})
			publishN(t, e, pool(t), 5, outbox.Message{Topic: "t"})
			began := make(chan struct{}, 1)
			r, err := e.ob.Relay(slowClaimDB{pgxtx.FromPool(pool(t)), c.delay, began}, fast(t, outbox.RelayConfig{PollInterval: time.Minute, Listen: outbox.ListenOff, ShutdownGrace: 5 * time.Second}))
			if err != nil {
				t.Fatal(err)
			}
			rec := newRecorder()
			r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			<-began // the first claim is on its way
			time.Sleep(50 * time.Millisecond)
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10s of its context ending")
			}
			if got := rec.count(); got != c.handed {
				t.Errorf("%d messages handled, want %d", got, c.handed)
			}
			if left := count(t, e.table, ""); left != 5-c.handed {
				t.Errorf("%d rows left, want %d: the claimed messages' outcomes were not written", left, 5-c.handed)
			}
		})
	}
}

// renewDB passes every statement to a PostgreSQL pool, and calls renew
// before each lease renewal of table t is sent; an error from it is the
// renewal's.
type renewDB struct {
	outbox.DB
	renewSQL string
	renew    func() error
}

func newRenewDB(t *testing.T, e *env, renew func() error) *renewDB {
	return &renewDB{DB: pgxtx.FromPool(pool(t)), renewSQL: pgsql.RenewSQL(e.ob.Table()), renew: renew}
}

func (d *renewDB) QueryDB(ctx context.Context, q string, args ...any) (outboxdriver.Rows, error) {
	if q == d.renewSQL {
		if err := d.renew(); err != nil {
			return nil, err
		}
	}
	return d.DB.QueryDB(ctx, q, args...)
}

// renewalRun publishes one message of topic t per key, in one transaction
// (so that one claim takes them all), and runs a relay on db (lease lease,
// logging to a buffer, with an observer) whose handler returns once
// release(d.Key) is closed, or records that its context was cancelled.
// Once every message is settled it stops the relay and fails t if a
// handler was cancelled, a message delivered twice, or a lost lease logged
// or observed; it returns the relay's log.
func renewalRun(t *testing.T, e *env, db outbox.DB, lease time.Duration, keys []string, release func(key string) <-chan struct{}) string {
	t.Helper()
	var logs logBuffer
	obs := &obsRecorder{}
	r, err := e.ob.Relay(db, fast(t, outbox.RelayConfig{Lease: lease, Observer: obs, Logger: logs.logger(), Listen: outbox.ListenOff}))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	var cancelled atomic.Int32
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		rec.add(d)
		select {
		case <-release(d.Key):
			return nil
		case <-ctx.Done():
			cancelled.Add(1)
			return ctx.Err()
		}
	})
	msgs := make([]outbox.Message, len(keys))
	for i, k := range keys {
		msgs[i] = outbox.Message{Topic: "t", Key: k}
	}
	tx, err := pool(t).Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.ob.PublishBatch(context.Background(), pgxtx.From(tx), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	rr := start(t, r)
	eventually(t, 20*time.Second, "the messages settled", func() bool { return count(t, e.table, "") == 0 })
	rr.stop(t)
	if n := cancelled.Load(); n != 0 {
		t.Errorf("%d handlers' contexts cancelled, want none", n)
	}
	for _, m := range res {
		if a := rec.attempts(m.ID); len(a) != 1 {
			t.Errorf("message %s: attempts %v, want [1]", m.ID, a)
		}
	}
	if strings.Contains(logs.String(), "lease lost") {
		t.Errorf("a lease lost was logged:\n%s", logs.String())
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.lost) != 0 {
		t.Errorf("lease lost events %+v, want none", obs.lost)
	}
	return logs.String()
}

// TestRenewalRacingSettleNotLost: a renewal lists the running handlers of
// two messages, a and b; a's handler returns and its outcome is written
// before the renewal's statement runs, which then finds a gone. That is no
// lost lease: nothing is cancelled, warned about or observed as lost.
// (b's handler returns at the next renewal, by which time the relay has
// handled the first renewal's answer.)
func TestRenewalRacingSettleNotLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	admin := pgtest.Admin(t)
	renewing, next := make(chan struct{}), make(chan struct{})
	var renewals atomic.Int32
	db := newRenewDB(t, e, func() error {
		switch renewals.Add(1) {
		case 1:
			close(renewing) // a's handler returns,
			// and its outcome is written before the renewal is sent.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				var n int
				if err := admin.QueryRow(`SELECT count(*) FROM ` + e.table).Scan(&n); err != nil || n == 1 || time.Now().After(deadline) {
					if err != nil || n != 1 {
						t.Errorf("waiting for a's outcome to be written: %d rows left, %v", n, err)
					}
					return nil
				}
			}
		case 2:
			close(next)
		}
		return nil
	})
	// A lease of 3s: ticks every 500 ms, a first renewal after 1 s, b's
	// lease kept while the renewal waits for a's outcome.
	renewalRun(t, e, db, 3*time.Second, []string{"a", "b"}, func(key string) <-chan struct{} {
		if key == "a" {
			return renewing
		}
		return next
	})
}

// TestRenewalRetriedAfterDeadlock: a renewal the database refuses because
// of contention (a deadlock, 40P01) is sent again at once: no renewal
// failure is logged (only the refusal, at Debug), the handler keeps its
// lease and is not cancelled, and the message is delivered once. The
// handler returns at the second renewal statement.
func TestRenewalRetriedAfterDeadlock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	var renewals atomic.Int32
	renewed := make(chan struct{})
	db := newRenewDB(t, e, func() error {
		switch renewals.Add(1) {
		case 1:
			return &pgconn.PgError{Severity: "ERROR", Code: "40P01", Message: "deadlock detected (injected)"}
		case 2:
			close(renewed)
		}
		return nil
	})
	// A lease of 3s: ticks every 500 ms, a first renewal after 1 s.
	logs := renewalRun(t, e, db, 3*time.Second, []string{"a"}, func(string) <-chan struct{} { return renewed })
	if strings.Contains(logs, "lease renewal failed") {
		t.Errorf("the refused renewal was not sent again at once:\n%s", logs)
	}
	if !strings.Contains(logs, "deadlock detected (injected)") {
		t.Error("the refused renewal was not logged (at Debug)")
	}
}
