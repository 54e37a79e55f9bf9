package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outbox"
)

// runErr runs r until it returns on its own or within seconds; it fails the
// test when Run has to be cancelled.
func runErr(t *testing.T, r *outbox.Relay, within time.Duration) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- r.Run(ctx) }()
	select {
	case err := <-done:
		return time.Since(began), err
	case <-time.After(within):
		cancel()
		<-done
		t.Fatalf("Run did not return within %v", within)
		return 0, nil
	}
}

// TestRunSchemaChecks: Run fails at once on a missing table, on a table
// that lacks the relay's columns, and on a table whose last migrations
// have not run (no attempts_base), on every PostgreSQL driver; the error
// says "outbox:" once.
func TestRunSchemaChecks(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	if _, err := pgtest.Admin(t).Exec(`CREATE TABLE ` + schema + `.old (id uuid PRIMARY KEY, topic text)`); err != nil {
		t.Fatal(err)
	}
	migs, err := migrations.Load(migrations.Postgres(), schema+".unmigrated")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range migs {
		if m.Name == "attempts_base" {
			break
		}
		if _, err := pgtest.Admin(t).Exec(m.Up); err != nil {
			t.Fatal(err)
		}
	}
	dbs := map[string]outbox.DB{
		"pgx":        pgxtx.FromPool(pool(t)),
		"pgx-stdlib": pgxtx.FromStdlib(pgtest.Open(t, "pgx")),
		"lib/pq":     sqltx.FromDB(pgtest.Open(t, "postgres")),
	}
	for name, db := range dbs {
		for table, want := range map[string]error{"missing": outbox.ErrTableMissing, "old": outbox.ErrSchemaMismatch, "unmigrated": outbox.ErrSchemaMismatch} {
			ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: schema + "." + table})
			if err != nil {
				t.Fatal(err)
			}
			r, err := ob.Relay(db, fast(t, outbox.RelayConfig{}))
			if err != nil {
				t.Fatal(err)
			}
			r.Handle("t", func(context.Context, outbox.Delivery) error { return nil })
			took, err := runErr(t, r, 5*time.Second)
			if !errors.Is(err, want) {
				t.Errorf("%s, table %s: Run = %v, want %v", name, table, err, want)
				continue
			}
			if took > 3*time.Second { // fast: a retrying relay runs until runErr's 5 s
				t.Errorf("%s, table %s: Run took %v to fail, want under 3s", name, table, took)
			}
			if n := strings.Count(err.Error(), "outbox:"); n != 1 {
				t.Errorf("%s: %q says outbox: %d times", name, err, n)
			}
			if h := r.Health(); h.Running || !errors.Is(h.Err(), outbox.ErrRelayNotRunning) {
				t.Errorf("%s: after Run returned, Health = %+v", name, h)
			}
		}
	}
}

// TestListenNeedsCapableDriver: Listen ListenOn fails at construction with
// lib/pq (it cannot LISTEN through database/sql) and names the driver;
// NotifyAuto polls only; a *sql.DB limited to one connection is refused
// when the listener would hold it.
func TestListenNeedsCapableDriver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	pq := sqltx.FromDB(pgtest.Open(t, "postgres"))
	_, err := e.ob.Relay(pq, outbox.RelayConfig{Listen: outbox.ListenOn})
	if !errors.Is(err, outbox.ErrUnsupported) || !strings.Contains(err.Error(), "pq") || strings.Contains(err.Error(), "dialect") {
		t.Errorf("NotifyOn on lib/pq: %v, want ErrUnsupported naming the driver", err)
	}
	r, err := e.ob.Relay(pq, fast(t, outbox.RelayConfig{}))
	if err != nil {
		t.Fatalf("NotifyAuto on lib/pq: %v", err)
	}
	rec := newRecorder()
	r.Handle("t", func(_ context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	start(t, r)
	publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
	eventually(t, 10*time.Second, "delivered by polling", func() bool { return rec.count() == 1 })
	if h := r.Health(); h.Listener != outbox.ListenerOff || h.Err() != nil {
		t.Errorf("lib/pq relay health %+v, want polling only and healthy", h)
	}

	one := pgtest.Open(t, "pgx")
	one.SetMaxOpenConns(1)
	if _, err := e.ob.Relay(pgxtx.FromStdlib(one), outbox.RelayConfig{}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("listening on a one-connection *sql.DB: %v, want a ConfigError", err)
	}
	if _, err := e.ob.Relay(pgxtx.FromStdlib(one), outbox.RelayConfig{Listen: outbox.ListenOff}); err != nil {
		t.Errorf("polling on a one-connection *sql.DB: %v", err)
	}
}

// TestHealth: Health follows a relay from before Run to after it returns,
// through a failing database.
func TestHealth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	var broken atomic.Bool
	db := &faultDB{inner: pgxtx.FromPool(pool(t)), fail: func(q string) error {
		if broken.Load() && strings.Contains(q, "FOR UPDATE SKIP LOCKED") {
			return errors.New("injected claim failure")
		}
		return nil
	}}
	r, err := e.ob.Relay(db, fast(t, outbox.RelayConfig{PollInterval: 10 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	r.Handle("t", func(context.Context, outbox.Delivery) error { return nil })
	if err := r.Health().Err(); !errors.Is(err, outbox.ErrRelayNotRunning) {
		t.Errorf("before Run: %v", err)
	}
	run := start(t, r)
	eventually(t, 5*time.Second, "first claim", func() bool { return !r.Health().LastClaim.IsZero() })
	if err := r.Health().Err(); err != nil {
		t.Errorf("running: %v", err)
	}
	broken.Store(true)
	eventually(t, 10*time.Second, "failing", func() bool { return errors.Is(r.Health().Err(), outbox.ErrRelayFailing) })
	h := r.Health()
	if h.ConsecutiveErrors < 3 || !strings.Contains(h.Err().Error(), "injected claim failure") {
		t.Errorf("failing health %+v: %v", h, h.Err())
	}
	broken.Store(false)
	eventually(t, 15*time.Second, "healthy again", func() bool { return r.Health().Err() == nil })
	run.stop(t)
	if err := r.Health().Err(); !errors.Is(err, outbox.ErrRelayNotRunning) {
		t.Errorf("after Run: %v", err)
	}
}

// TestListenerCutRepeatedly: the listener's connection is terminated 8
// times, 3 s apart. A connection that reached LISTEN counts as a recovery,
// so each time the listener is back at once (within 3 s on a loaded host)
// and wake-ups resume
// (the poll interval is a minute: only a notification delivers in time).
// Before the fix the reconnect backoff grew with every cut (0.1, 0.2, 0.4
// ... s) and the later cuts left the relay deaf for seconds.
func TestListenerCutRepeatedly(t *testing.T) {
	if testing.Short() {
		t.Skip("24 s")
	}
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	r := newRelay(t, e, outbox.RelayConfig{PollInterval: time.Minute})
	rec := newRecorder()
	r.Handle("t", func(_ context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	start(t, r)
	p := pool(t)
	eventually(t, 10*time.Second, "listening", func() bool { return r.Health().Listener == outbox.ListenerListening })
	const cuts = 8
	for i := 1; i <= cuts; i++ {
		cut := time.Now()
		if _, err := pgtest.Admin(t).Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'oncommit-listener' AND query LIKE '%` + e.schema + `%'`); err != nil {
			t.Fatal(err)
		}
		for r.Health().ListenerConnects < i+1 {
			// 3 s: room for a loaded host, and still short of what a
			// backoff that grew with the cuts would wait by the sixth
			// (0.1 s doubling: 3.2 s).
			if time.Since(cut) > 3*time.Second {
				t.Fatalf("cut %d: listener not back within 3s (health %+v)", i, r.Health())
			}
			time.Sleep(5 * time.Millisecond)
		}
		published := time.Now()
		publishN(t, e, p, 1, outbox.Message{Topic: "t"})
		for rec.count() < i {
			if time.Since(published) > 5*time.Second {
				t.Fatalf("cut %d: no wake-up after the reconnect", i)
			}
			time.Sleep(time.Millisecond)
		}
		t.Logf("cut %d: listening again after %v, delivered %v after the publish began", i, published.Sub(cut).Round(time.Millisecond), time.Since(published).Round(time.Millisecond))
		time.Sleep(time.Until(cut.Add(3 * time.Second)))
	}
}

// TestWakeupsRespectClaimBackoff: while claims fail, notifications (here
// a thousand a second) do not make the relay claim more often than its
// backoff allows.
func TestWakeupsRespectClaimBackoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	db := listeningFaultDB{&faultDB{inner: pgxtx.FromPool(pool(t)),
		fail: func(q string) error {
			if strings.Contains(q, "FOR UPDATE SKIP LOCKED") {
				return errors.New("injected claim failure")
			}
			return nil
		},
		listen: func(ctx context.Context, _ string, wake func(string)) error {
			for ctx.Err() == nil {
				wake("")
				time.Sleep(time.Millisecond)
			}
			return nil
		}}}
	r, err := e.ob.Relay(db, fast(t, outbox.RelayConfig{PollInterval: 10 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	r.Handle("t", func(context.Context, outbox.Delivery) error { return nil })
	run := start(t, r)
	time.Sleep(time.Second)
	run.stop(t)
	// 100 ms doubling with half jitter: 3 to 5 claims in a second.
	if n := db.claims.Load(); n > 8 {
		t.Errorf("%d claims in 1s while failing and woken 1000 times a second, want the backoff's few", n)
	}
}

// TestWarnsAboutUnhandledTopics: due messages of a topic no handler of the
// relay takes, waiting over a minute, are logged once, five seconds after
// Run starts.
func TestWarnsAboutUnhandledTopics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	p := pool(t)
	publishN(t, e, p, 2, outbox.Message{Topic: "orphan"})
	publishN(t, e, p, 1, outbox.Message{Topic: "fresh"})
	if _, err := pgtest.Admin(t).Exec(`UPDATE ` + e.table + ` SET available_at = now() - interval '2 minutes' WHERE topic = 'orphan'`); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	r := newRelay(t, e, outbox.RelayConfig{Logger: logs.logger()})
	r.Handle("t", func(context.Context, outbox.Delivery) error { return nil })
	start(t, r)
	started := time.Now()
	eventually(t, 15*time.Second, "warning", func() bool { return strings.Contains(logs.String(), "no handler for") })
	if d := time.Since(started); d < 4*time.Second {
		t.Errorf("warned %v after Run started, want the first look about 5s after", d)
	}
	time.Sleep(200 * time.Millisecond)
	out := logs.String()
	if !strings.Contains(out, "topic=orphan") || strings.Contains(out, "topic=fresh") {
		t.Errorf("want a warning about orphan only (fresh has waited under a minute):\n%s", out)
	}
	if n := strings.Count(out, "no handler for"); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
}
