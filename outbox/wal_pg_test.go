package outbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// walEnv is an outbox table on the wal_level=logical cluster, with a slot
// and publication of its own, and an Outbox of the WAL transport.
type walEnv struct {
	url, table string
	cfg        postgres.WALConfig
	db         *sql.DB // pgx stdlib, for checks
	ob         *outbox.Outbox
}

func newWALEnv(t *testing.T) *walEnv {
	t.Helper()
	url := pgtest.WALURL(t)
	ctx := context.Background()
	var b [5]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	e := &walEnv{url: url, table: "wal_" + sfx,
		cfg: postgres.WALConfig{ConnString: url, Slot: "s_" + sfx, Publication: "p_" + sfx}}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	e.db = db
	t.Cleanup(func() { db.Close() })
	if err := postgres.Migrate(ctx, db, e.table); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + e.table + `, ` + e.table + `_keys`) })
	if err := postgres.SetupWAL(ctx, e.cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 100 { // the server frees a closed reader's slot shortly after
			if err := postgres.DropWAL(ctx, e.cfg); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("slot %s not dropped", e.cfg.Slot)
	})
	d, err := postgres.WALDialect(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if e.ob, err = outbox.New(d, outbox.Config{Table: e.table}); err != nil {
		t.Fatal(err)
	}
	return e
}

// walDriver opens business transactions of one driver.
type walDriver struct {
	name  string
	begin func(t *testing.T, e *walEnv) walTx
}

// walTx is an open business transaction.
type walTx struct {
	tx               outbox.Tx
	exec             func(q string) error
	commit, rollback func() error
}

// publish publishes msgs in a transaction of d and commits it, or rolls
// it back.
func (d walDriver) publish(t *testing.T, e *walEnv, msgs []outbox.Message, commit bool) []outbox.Result {
	t.Helper()
	x := d.begin(t, e)
	res, err := e.ob.PublishBatch(context.Background(), x.tx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if commit {
		err = x.commit()
	} else {
		err = x.rollback()
	}
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func walDrivers() []walDriver {
	onSQL := func(driver string) func(t *testing.T, e *walEnv) walTx {
		return func(t *testing.T, e *walEnv) walTx {
			t.Helper()
			db, err := sql.Open(driver, e.url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback() })
			end := func(f func() error) func() error {
				return func() error { err := f(); db.Close(); return err }
			}
			return walTx{tx: sqltx.From(tx), exec: func(q string) error { _, err := tx.Exec(q); return err },
				commit: end(tx.Commit), rollback: end(tx.Rollback)}
		}
	}
	return []walDriver{
		{"pgx", func(t *testing.T, e *walEnv) walTx {
			t.Helper()
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, e.url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(ctx) })
			end := func(f func(context.Context) error) func() error {
				return func() error { err := f(ctx); pool.Close(); return err }
			}
			return walTx{tx: pgxtx.From(tx), exec: func(q string) error { _, err := tx.Exec(ctx, q); return err },
				commit: end(tx.Commit), rollback: end(tx.Rollback)}
		}},
		{"pgxstdlib", onSQL("pgx")},
		{"libpq", onSQL("postgres")},
	}
}

func (e *walEnv) count(t *testing.T, where string) int {
	t.Helper()
	var n int
	q := `SELECT count(*) FROM ` + e.table
	if where != "" {
		q += ` WHERE ` + where
	}
	if err := e.db.QueryRow(q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The WAL transport, on every driver: a committed publish reaches the
// handlers with its ids, payloads, keys and headers and leaves no row; a
// rolled-back one never arrives; a message needing the table (DedupKey,
// Delay) is a row and is delivered by the same relay's claims; a handler
// failure writes the message into the table, which retries it; bad input
// is refused before any SQL, as on the table.
func TestWALTransport(t *testing.T) {
	for _, d := range walDrivers() {
		t.Run(d.name, func(t *testing.T) {
			e := newWALEnv(t)
			var mu sync.Mutex
			got := map[outbox.ID]outbox.Delivery{}
			attempts := map[outbox.ID]int{}
			r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{PollInterval: 50 * time.Millisecond, RetryBase: 10 * time.Millisecond, RetryCap: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Handle("t", func(_ context.Context, dl outbox.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				attempts[dl.ID]++
				if dl.Key == "fail-once" && attempts[dl.ID] == 1 {
					return errors.New("first attempt fails")
				}
				got[dl.ID] = dl
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			res := d.publish(t, e, []outbox.Message{
				{Topic: "t", Key: "k1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"h": "v"}},
				{Topic: "t"},
				{Topic: "t", Key: "fail-once"},
			}, true)
			d.publish(t, e, []outbox.Message{{Topic: "t", Key: "rolled back"}}, false)
			tbl := d.publish(t, e, []outbox.Message{{Topic: "t", Key: "dedup", DedupKey: "d1"}, {Topic: "t", Key: "delayed", Delay: 100 * time.Millisecond}}, true)
			if n := e.count(t, ""); n != 2 {
				t.Errorf("after the publishes the table holds %d rows, want the 2 that need it", n)
			}
			// The slot kept the messages published before any relay ran.
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			go func() { ran <- r.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-ran; err != nil {
					t.Error(err)
				}
			}()
			want := append(res, tbl...)
			waitFor(t, 20*time.Second, "every message delivered", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(got) == len(want)
			})
			mu.Lock()
			for _, w := range want {
				if _, ok := got[w.ID]; !ok {
					t.Errorf("message %s not delivered", w.ID)
				}
			}
			if g := got[res[0].ID]; g.Key != "k1" || string(g.Payload) != `{"n":1}` || g.Headers["h"] != "v" || g.CreatedAt.IsZero() {
				t.Errorf("first message arrived as %+v", g)
			}
			if a := attempts[res[2].ID]; a != 2 {
				t.Errorf("the failing message ran %d times, want 2 (once from the WAL, once from the table)", a)
			}
			mu.Unlock()
			waitFor(t, 10*time.Second, "the table emptied", func() bool { return e.count(t, "") == 0 })

			// Bad input: refused before any SQL, the transaction usable.
			db, err := sql.Open("pgx", e.url)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var me *outbox.MessageError
			if _, err := e.ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: ""}); !errors.As(err, &me) {
				t.Errorf("empty topic: %v, want a MessageError", err)
			}
			if _, err := tx.Exec(`SELECT 1`); err != nil {
				t.Errorf("the transaction after a refused message: %v", err)
			}
		})
	}
}

// A handler that fails its last attempt dead-letters the message into the
// table; a message of a topic the relay has no handler for waits in the
// table, pending, for a relay that has one.
func TestWALDeadAndUnhandled(t *testing.T) {
	e := newWALEnv(t)
	r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{MaxAttempts: 1, PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Handle("t", func(context.Context, outbox.Delivery) error { return errors.New("always") }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	walDrivers()[0].publish(t, e, []outbox.Message{{Topic: "t"}, {Topic: "other"}}, true)
	waitFor(t, 20*time.Second, "the failure dead-lettered and the other topic stored", func() bool {
		return e.count(t, "topic = 't' AND state = 'dead' AND attempts = 1 AND last_error = 'always'") == 1 &&
			e.count(t, "topic = 'other' AND state = 'pending' AND attempts = 0") == 1
	})
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
}

// With DiscardDead a message that dies from the slot is not written into
// the table; KeepDelivered is refused, as no row is written for a
// delivered message.
func TestWALDiscardDeadKeepDelivered(t *testing.T) {
	e := newWALEnv(t)
	var ce *outbox.ConfigError
	if _, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{KeepDelivered: time.Hour}); !errors.As(err, &ce) || ce.Field != "KeepDelivered" {
		t.Fatalf("KeepDelivered with the WAL transport: %v, want a ConfigError", err)
	}
	r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{MaxAttempts: 1, DiscardDead: true, PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	if err := r.Handle("t", func(context.Context, outbox.Delivery) error { ran.Add(1); return errors.New("always") }); err != nil {
		t.Fatal(err)
	}
	dialecttest.StartRelay(t, r)
	walDrivers()[0].publish(t, e, []outbox.Message{{Topic: "t"}, {Topic: "t"}}, true)
	waitFor(t, 20*time.Second, "both messages handled", func() bool { return ran.Load() == 2 })
	waitFor(t, 10*time.Second, "the slot moved past them", func() bool {
		l, reading, err := r.StreamLag(context.Background())
		return err == nil && reading && l.Oldest.IsZero()
	})
	if n := e.count(t, ""); n != 0 {
		t.Fatalf("the table holds %d rows, want none (discarded)", n)
	}
}

// Run fails at once, with a typed error, when the slot is missing; a
// second relay stands by (claiming from the table) while the first reads
// the slot, and takes the slot over within seconds when the first stops:
// every message is delivered, none lost.
func TestWALOneReaderTakeover(t *testing.T) {
	e := newWALEnv(t)
	missing, err := postgres.WALDialect(postgres.WALConfig{ConnString: e.url, Slot: "no_such_slot", Publication: e.cfg.Publication})
	if err != nil {
		t.Fatal(err)
	}
	mob, err := outbox.New(missing, outbox.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	mr, err := mob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mr.Handle("t", func(context.Context, outbox.Delivery) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := mr.Run(context.Background()); !errors.Is(err, postgres.ErrSlotMissing) || !errors.Is(err, outboxdriver.ErrStreamUnusable) {
		t.Fatalf("Run with a missing slot: %v, want ErrSlotMissing", err)
	}

	var mu sync.Mutex
	seen := map[outbox.ID]string{}
	start := func(name string) (stop func(), lagged func() bool) {
		r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{PollInterval: 50 * time.Millisecond, ShutdownGrace: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Handle("t", func(_ context.Context, d outbox.Delivery) error {
			mu.Lock()
			seen[d.ID] = name
			mu.Unlock()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- r.Run(ctx) }()
		return func() {
				cancel()
				if err := <-ran; err != nil {
					t.Error(err)
				}
			}, func() bool {
				_, reading, _ := r.StreamLag(context.Background())
				return reading
			}
	}
	stopA, readingA := start("a")
	waitFor(t, 10*time.Second, "relay a reads the slot", readingA)
	stopB, readingB := start("b")
	defer stopB()
	pub := walDrivers()[0].publish
	var ids []outbox.ID
	for i := range 5 {
		for _, r := range pub(t, e, []outbox.Message{{Topic: "t", Key: fmt.Sprint(i)}}, true) {
			ids = append(ids, r.ID)
		}
	}
	waitFor(t, 10*time.Second, "the first messages delivered by a", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == len(ids)
	})
	if readingB() {
		t.Fatal("two relays read the slot at once")
	}
	stopA()
	began := time.Now()
	waitFor(t, 15*time.Second, "relay b takes the slot over", readingB)
	t.Logf("relay b took the slot over %v after a stopped", time.Since(began))
	for i := range 5 {
		for _, r := range pub(t, e, []outbox.Message{{Topic: "t", Key: fmt.Sprint("after", i)}}, true) {
			ids = append(ids, r.ID)
		}
	}
	waitFor(t, 10*time.Second, "every message delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == len(ids)
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids[5:] {
		if seen[id] != "b" {
			t.Errorf("message %s published after a stopped was delivered by %q", id, seen[id])
		}
	}
}

// waitFor polls cond every 20ms until it holds, or fails t after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Health reports the relay's reading of the slot: whether it reads it (a
// relay standing by is no error), the lag while a message is in hand, and
// a lost replication connection until the relay reads again.
func TestWALStreamHealth(t *testing.T) {
	e := newWALEnv(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	newRelay := func(block bool) *outbox.Relay {
		r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{PollInterval: 50 * time.Millisecond, ShutdownGrace: time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Handle("t", func(ctx context.Context, _ outbox.Delivery) error {
			if block {
				entered <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := newRelay(true)
	stopA := dialecttest.StartRelay(t, a)
	waitFor(t, 10*time.Second, "relay a reads the slot", func() bool { return a.Health().Stream.Reading })
	b := newRelay(false)
	dialecttest.StartRelay(t, b)
	time.Sleep(1500 * time.Millisecond) // b tried the slot at least once
	if h := b.Health().Stream; h.Reading || h.ConsecutiveErrors != 0 {
		t.Fatalf("the standby relay's stream health: %+v, want not reading and no error", h)
	}

	walDrivers()[0].publish(t, e, []outbox.Message{{Topic: "t"}}, true)
	<-entered
	if h := a.Health().Stream; !h.Reading || h.Lag.Oldest.IsZero() || h.Lag.Bytes <= 0 {
		t.Fatalf("with a message in hand: %+v, want reading, a lag in bytes and the oldest message's time", h)
	}
	close(release)
	waitFor(t, 10*time.Second, "the lag settled", func() bool { return a.Health().Stream.Lag.Oldest.IsZero() })

	// The replication connection dies: counted, then cleared once a relay
	// reads again.
	if _, err := e.db.Exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, e.cfg.Slot); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the lost connection in relay a's health", func() bool {
		h := a.Health().Stream
		return !h.Reading && h.ConsecutiveErrors == 1 && h.LastError != nil
	})
	waitFor(t, 15*time.Second, "a relay reads the slot again", func() bool {
		return a.Health().Stream.Reading || b.Health().Stream.Reading
	})
	stopA()
	if h := a.Health().Stream; h.Reading {
		t.Fatalf("a stopped relay reports %+v", h)
	}
}

// countingHook counts publish calls.
type countingHook struct{ ends atomic.Int32 }

func (*countingHook) PublishStart(ctx context.Context, _ *outbox.Message) context.Context { return ctx }
func (h *countingHook) PublishEnd(context.Context, outbox.PublishEvent)                   { h.ends.Add(1) }

// The promises of the relay and of Publish that hold on the WAL
// transport as on the table, on every driver: a publish rolled back to a
// savepoint, or in a transaction that failed, is never delivered while the
// rest of the transaction is; middleware, the observer, the publish hook
// and the catch-all see stream messages; a batch handler's topic is
// delivered from the table; a message whose handler was running when its
// relay stopped is delivered by the next one.
func TestWALConformance(t *testing.T) {
	for _, d := range walDrivers() {
		t.Run(d.name, func(t *testing.T) {
			t.Run("RolledBack", func(t *testing.T) {
				e := newWALEnv(t)
				var mu sync.Mutex
				got := map[outbox.ID]bool{}
				r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Handle("t", func(_ context.Context, dl outbox.Delivery) error {
					mu.Lock()
					got[dl.ID] = true
					mu.Unlock()
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				dialecttest.StartRelay(t, r)
				ctx := context.Background()
				x := d.begin(t, e)
				kept, err := e.ob.Publish(ctx, x.tx, outbox.Message{Topic: "t", Key: "kept"})
				if err != nil {
					t.Fatal(err)
				}
				if err := x.exec(`SAVEPOINT s`); err != nil {
					t.Fatal(err)
				}
				undone, err := e.ob.Publish(ctx, x.tx, outbox.Message{Topic: "t", Key: "rolled back to the savepoint"})
				if err != nil {
					t.Fatal(err)
				}
				if err := x.exec(`ROLLBACK TO SAVEPOINT s`); err != nil {
					t.Fatal(err)
				}
				if err := x.commit(); err != nil {
					t.Fatal(err)
				}
				y := d.begin(t, e)
				failed, err := e.ob.Publish(ctx, y.tx, outbox.Message{Topic: "t", Key: "failed transaction"})
				if err != nil {
					t.Fatal(err)
				}
				if err := y.exec(`SELECT 1/0`); err == nil {
					t.Fatal("1/0 did not fail")
				}
				_ = y.commit() // refused or rolled back: the transaction failed
				last := d.publish(t, e, []outbox.Message{{Topic: "t", Key: "last"}}, true)
				waitFor(t, 20*time.Second, "the committed messages delivered", func() bool {
					mu.Lock()
					defer mu.Unlock()
					return got[kept.ID] && got[last[0].ID]
				})
				mu.Lock()
				defer mu.Unlock()
				if got[undone.ID] || got[failed.ID] {
					t.Fatalf("delivered a message rolled back (savepoint %v, failed transaction %v)", got[undone.ID], got[failed.ID])
				}
			})

			t.Run("HooksAndHandlers", func(t *testing.T) {
				e := newWALEnv(t)
				hook := &countingHook{}
				dl, err := postgres.WALDialect(e.cfg)
				if err != nil {
					t.Fatal(err)
				}
				if e.ob, err = outbox.New(dl, outbox.Config{Table: e.table, Hook: hook}); err != nil {
					t.Fatal(err)
				}
				obs := &countingObserver{outcomes: map[outbox.Outcome]int{}}
				var wrapped, all, batched atomic.Int32
				mw := func(next outbox.Handler) outbox.Handler {
					return func(ctx context.Context, d outbox.Delivery) error { wrapped.Add(1); return next(ctx, d) }
				}
				r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{PollInterval: 50 * time.Millisecond, Observer: obs,
					Middleware: []outbox.Middleware{mw}, Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Handle(outbox.AllTopics, func(context.Context, outbox.Delivery) error { all.Add(1); return nil }); err != nil {
					t.Fatal(err)
				}
				if err := r.HandleBatch("b", func(_ context.Context, ds []outbox.Delivery) []error {
					batched.Add(int32(len(ds)))
					return make([]error, len(ds))
				}); err != nil {
					t.Fatal(err)
				}
				dialecttest.StartRelay(t, r)
				d.publish(t, e, []outbox.Message{{Topic: "x"}, {Topic: "y"}, {Topic: "b"}}, true)
				waitFor(t, 20*time.Second, "the catch-all's two and the batch handler's one", func() bool {
					return all.Load() == 2 && batched.Load() == 1
				})
				waitFor(t, 10*time.Second, "the batch topic's row settled", func() bool { return e.count(t, "") == 0 })
				obs.mu.Lock()
				defer obs.mu.Unlock()
				if hook.ends.Load() != 1 || wrapped.Load() < 2 || obs.starts < 2 || obs.ends < 2 {
					t.Fatalf("publish hook %d, middleware %d, observer %d/%d; want 1 and at least 2", hook.ends.Load(), wrapped.Load(), obs.starts, obs.ends)
				}
			})

			t.Run("StoppedWithMessageInHand", func(t *testing.T) {
				e := newWALEnv(t)
				entered := make(chan struct{}, 1)
				var mu sync.Mutex
				by := map[string]int{}
				start := func(name string, block bool) (stop func()) {
					r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{PollInterval: 50 * time.Millisecond, ShutdownGrace: 200 * time.Millisecond,
						RetryBase: 10 * time.Millisecond, RetryCap: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
					if err != nil {
						t.Fatal(err)
					}
					if err := r.Handle("t", func(ctx context.Context, _ outbox.Delivery) error {
						if block {
							entered <- struct{}{}
							<-ctx.Done()
							return ctx.Err()
						}
						mu.Lock()
						by[name]++
						mu.Unlock()
						return nil
					}); err != nil {
						t.Fatal(err)
					}
					return dialecttest.StartRelay(t, r)
				}
				stopA := start("a", true)
				waitFor(t, 10*time.Second, "relay a reads the slot", func() bool { return e.slotActive(t) })
				d.publish(t, e, []outbox.Message{{Topic: "t"}}, true)
				<-entered
				stopA()
				start("b", false)
				waitFor(t, 20*time.Second, "the message delivered by relay b", func() bool {
					mu.Lock()
					defer mu.Unlock()
					return by["b"] == 1
				})
			})
		})
	}
}

// slotActive reports whether a relay reads e's slot.
func (e *walEnv) slotActive(t *testing.T) bool {
	t.Helper()
	var active bool
	if err := e.db.QueryRow(`SELECT active FROM pg_replication_slots WHERE slot_name = $1`, e.cfg.Slot).Scan(&active); err != nil {
		t.Fatal(err)
	}
	return active
}

// When the relay's replication connection is lost, the handlers of the
// messages it read are cancelled (another relay may take the slot over and
// deliver them) and nothing is written into the table for them: the next
// reader reads them again.
func TestWALLostStream(t *testing.T) {
	e := newWALEnv(t)
	var runs, secondAttempt atomic.Int32
	cancelled := make(chan error, 1)
	entered := make(chan struct{}, 1)
	r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		if runs.Add(1) == 1 {
			entered <- struct{}{}
			<-ctx.Done()
			cancelled <- ctx.Err()
			return ctx.Err()
		}
		secondAttempt.Store(int32(d.Attempt))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	dialecttest.StartRelay(t, r)
	waitFor(t, 10*time.Second, "the relay reads the slot", func() bool { return e.slotActive(t) })
	walDrivers()[0].publish(t, e, []outbox.Message{{Topic: "t"}}, true)
	<-entered
	if _, err := e.db.Exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, e.cfg.Slot); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context was not cancelled when the stream was lost")
	}
	waitFor(t, 20*time.Second, "the message delivered again by the next reading", func() bool { return runs.Load() == 2 })
	if a := secondAttempt.Load(); a != 1 {
		t.Fatalf("the second delivery was attempt %d, want 1: read again from the slot, not retried from the table", a)
	}
	if n := e.count(t, ""); n != 0 {
		t.Fatalf("the table holds %d rows: the lost stream's message was written into it", n)
	}
}

// TestWALFanOut: a topic's copies travel the WAL transport as messages of
// their own; one subscriber's failure goes to the table, the other
// subscriber's copy is delivered once, from the WAL.
func TestWALFanOut(t *testing.T) {
	e := newWALEnv(t)
	d, err := postgres.WALDialect(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if e.ob, err = outbox.New(d, outbox.Config{Table: e.table, Subscribers: map[string][]string{"t": {"mail", "fwd"}}}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string][]outbox.Delivery{}
	r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{PollInterval: 50 * time.Millisecond, RetryBase: 10 * time.Millisecond, RetryCap: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	record := func(fail bool) outbox.Handler {
		return func(_ context.Context, dl outbox.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			seen[dl.Subscriber] = append(seen[dl.Subscriber], dl)
			if fail && dl.Attempt == 1 {
				return errors.New("first attempt fails")
			}
			return nil
		}
	}
	if err := r.Subscribe("t", "mail", record(true)); err != nil {
		t.Fatal(err)
	}
	if err := r.Subscribe("t", "fwd", record(false)); err != nil {
		t.Fatal(err)
	}
	res := walDrivers()[0].publish(t, e, []outbox.Message{{Topic: "t", Key: "k1"}, {Topic: "t", Key: "k2"}}, true)
	dialecttest.StartRelay(t, r)
	waitFor(t, 20*time.Second, "every copy delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen["mail"]) == 4 && len(seen["fwd"]) == 2
	})
	waitFor(t, 10*time.Second, "the table emptied", func() bool { return e.count(t, "") == 0 })
	mu.Lock()
	defer mu.Unlock()
	for i, dl := range seen["fwd"] {
		if dl.Attempt != 1 || dl.Topic != "t" || (dl.Key != "k1" && dl.Key != "k2") {
			t.Errorf("fwd's delivery %d: %+v", i, dl)
		}
	}
	ids := map[outbox.ID]bool{}
	for _, r := range res {
		for _, id := range r.Copies {
			ids[id] = true
		}
	}
	for sub, ds := range seen {
		for _, dl := range ds {
			if !ids[dl.ID] {
				t.Errorf("%s got id %v, not one of the published copies", sub, dl.ID)
			}
		}
	}
	time.Sleep(200 * time.Millisecond) // nothing more arrives
	if len(seen["mail"]) != 4 || len(seen["fwd"]) != 2 {
		t.Errorf("mail %d deliveries, fwd %d; want 4 and 2", len(seen["mail"]), len(seen["fwd"]))
	}
}
