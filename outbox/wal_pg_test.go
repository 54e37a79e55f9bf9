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

// walDriver publishes in a business transaction of one driver.
type walDriver struct {
	name    string
	publish func(t *testing.T, e *walEnv, msgs []outbox.Message, commit bool) []outbox.Result
}

func walDrivers() []walDriver {
	onSQL := func(driver string) func(t *testing.T, e *walEnv, msgs []outbox.Message, commit bool) []outbox.Result {
		return func(t *testing.T, e *walEnv, msgs []outbox.Message, commit bool) []outbox.Result {
			t.Helper()
			db, err := sql.Open(driver, e.url)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			res, err := e.ob.PublishBatch(context.Background(), sqltx.From(tx), msgs)
			if err != nil {
				t.Fatal(err)
			}
			if commit {
				err = tx.Commit()
			} else {
				err = tx.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
	}
	return []walDriver{
		{"pgx", func(t *testing.T, e *walEnv, msgs []outbox.Message, commit bool) []outbox.Result {
			t.Helper()
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, e.url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			res, err := e.ob.PublishBatch(ctx, pgxtx.From(tx), msgs)
			if err != nil {
				t.Fatal(err)
			}
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			return res
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
