package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

func publish(t *testing.T, db *sql.DB, ob *outbox.Outbox, msgs ...outbox.Message) []outbox.ID {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	return dialecttest.PublishCommit(t, tx, ob, msgs...)
}

func runRelay(t *testing.T, r *outbox.Relay) func() {
	t.Helper()
	return dialecttest.StartRelay(t, r)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	dialecttest.Eventually(t, 15*time.Second, what, cond)
}

func relayCfg(t *testing.T) outbox.RelayConfig {
	return outbox.RelayConfig{RetryBase: 5 * time.Millisecond, RetryCap: 10 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
}

func state(t *testing.T, db *sql.DB, id outbox.ID) (string, int) {
	t.Helper()
	var s string
	var a int
	if err := db.QueryRow(`SELECT state, attempts FROM outbox WHERE id = ?`, id.String()).Scan(&s, &a); err != nil {
		return "gone", 0
	}
	return s, a
}

// TestRelayOutcomes: success deletes; a failure retries then succeeds; a
// message failing every attempt is dead at MaxAttempts and redrive revives
// it; Cancel and an invalid payload dead-letter at once; stats count them.
func TestRelayOutcomes(t *testing.T) {
	db, ob := open(t)
	r, err := ob.Relay(sqltx.FromDB(db), func() outbox.RelayConfig { c := relayCfg(t); c.MaxAttempts = 3; return c }())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	var healed atomic.Bool
	count := func(topic string) int { mu.Lock(); defer mu.Unlock(); return runs[topic] }
	r.Handle("ok", func(ctx context.Context, d outbox.Delivery) error {
		mu.Lock()
		runs["ok"]++
		mu.Unlock()
		return nil
	})
	r.Handle("flaky", func(ctx context.Context, d outbox.Delivery) error {
		mu.Lock()
		runs["flaky"]++
		mu.Unlock()
		if d.Attempt == 1 {
			return errors.New("first time fails")
		}
		return nil
	})
	r.Handle("broken", func(ctx context.Context, d outbox.Delivery) error {
		mu.Lock()
		runs["broken"]++
		mu.Unlock()
		if healed.Load() {
			return nil
		}
		return errors.New("always fails")
	})
	r.Handle("cancel", func(ctx context.Context, d outbox.Delivery) error {
		return outbox.DeadLetter(errors.New("no such customer"))
	})
	outbox.HandleJSON(r, "typed", func(ctx context.Context, d outbox.Delivery, v struct{ N int }) error { return nil })
	ok := publish(t, db, ob, outbox.Message{Topic: "ok", Payload: []byte(`{"a":1}`)}, outbox.Message{Topic: "ok"})
	flaky := publish(t, db, ob, outbox.Message{Topic: "flaky"})
	broken := publish(t, db, ob, outbox.Message{Topic: "broken"})
	cancelled := publish(t, db, ob, outbox.Message{Topic: "cancel"})
	bad := publish(t, db, ob, outbox.Message{Topic: "typed", Payload: []byte(`{"N":"x"}`)})
	stop := runRelay(t, r)
	waitFor(t, "ok delivered", func() bool { s, _ := state(t, db, ok[1]); return s == "gone" })
	waitFor(t, "flaky delivered", func() bool { s, _ := state(t, db, flaky[0]); return s == "gone" })
	waitFor(t, "broken dead", func() bool { s, _ := state(t, db, broken[0]); return s == "dead" })
	waitFor(t, "cancelled dead", func() bool { s, _ := state(t, db, cancelled[0]); return s == "dead" })
	waitFor(t, "invalid payload dead", func() bool { s, _ := state(t, db, bad[0]); return s == "dead" })
	if _, a := state(t, db, broken[0]); a != 3 || count("broken") != 3 {
		t.Errorf("broken: attempts %d, runs %d; want 3 and 3", a, count("broken"))
	}
	for _, id := range []outbox.ID{cancelled[0], bad[0]} {
		if _, a := state(t, db, id); a != 1 {
			t.Errorf("dead at once: attempts %d, want 1", a)
		}
	}
	if count("flaky") != 2 || count("ok") != 2 {
		t.Errorf("runs %v", runs)
	}
	stats, err := ob.Stats(context.Background(), sqltx.FromDB(db))
	if err != nil {
		t.Fatal(err)
	}
	dead := int64(0)
	for _, s := range stats {
		dead += s.Dead
	}
	if dead != 3 {
		t.Errorf("stats count %d dead, want 3: %+v", dead, stats)
	}
	healed.Store(true)
	if n, err := ob.Redrive(context.Background(), sqltx.FromDB(db), "broken"); err != nil || n != 1 {
		t.Fatalf("redrive: %d %v", n, err)
	}
	waitFor(t, "redriven delivered", func() bool { s, _ := state(t, db, broken[0]); return s == "gone" })
	stop()
	if n, err := ob.Purge(context.Background(), sqltx.FromDB(db), outbox.PurgeOptions{}); err != nil || n != 2 {
		t.Errorf("purge: %d %v, want 2 dead purged", n, err)
	}
}

// TestRelaysShareOneFile: four relays on one SQLite file (WAL, busy
// timeout) never hold the same (id, attempts) twice and deliver every
// message once.
func TestRelaysShareOneFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shared.db")
	dsn := "file:" + path + dsnOpts
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlite.Migrate(context.Background(), db, ""); err != nil {
		t.Fatal(err)
	}
	ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{})
	const n = 1000
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "t"}
	}
	publish(t, db, ob, msgs...)
	var mu sync.Mutex
	seen := map[outbox.ID]int{}
	for range 4 {
		rdb, err := sql.Open("sqlite", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		r, err := ob.Relay(sqltx.FromDB(rdb), relayCfg(t))
		if err != nil {
			t.Fatal(err)
		}
		r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
			mu.Lock()
			seen[d.ID]++
			mu.Unlock()
			return nil
		})
		runRelay(t, r)
	}
	waitFor(t, "all delivered", func() bool {
		var left int
		db.QueryRow(`SELECT count(*) FROM outbox`).Scan(&left)
		return left == 0
	})
	mu.Lock()
	defer mu.Unlock()
	for id, k := range seen {
		if k != 1 {
			t.Errorf("%s delivered %d times", id, k)
		}
	}
	if len(seen) != n {
		t.Errorf("%d delivered, want %d", len(seen), n)
	}
}

// TestStaleSettleFenced: a settle for an old claim changes nothing.
func TestStaleSettleFenced(t *testing.T) {
	db, ob := open(t)
	ids := publish(t, db, ob, outbox.Message{Topic: "t"})
	d := sqlite.Dialect().(outboxdriver.RelayDialect)
	pdb := sqltx.FromDB(db)
	p := outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 5, Lease: time.Millisecond, MaxAttempts: 5}
	if cs, _, err := d.Claim(context.Background(), pdb, ob.Table(), p); err != nil || len(cs) != 1 {
		t.Fatalf("claim: %v %v", cs, err)
	}
	time.Sleep(5 * time.Millisecond) // the lease lapses
	p.Lease = time.Minute
	cs, _, err := d.Claim(context.Background(), pdb, ob.Table(), p)
	if err != nil || len(cs) != 1 || cs[0].Attempts != 2 {
		t.Fatalf("reclaim: %v %v", cs, err)
	}
	applied, err := d.Settle(context.Background(), pdb, ob.Table(), outboxdriver.SettleParams{},
		[]outboxdriver.Settlement{{Fence: outboxdriver.Fence{ID: ids[0], Attempts: 1}, Kind: outboxdriver.SettleDone}})
	if err != nil || len(applied) != 0 {
		t.Errorf("stale settle applied %v, %v", applied, err)
	}
	if s, a := state(t, db, ids[0]); s != "processing" || a != 2 {
		t.Errorf("row %s attempts %d after a stale settle", s, a)
	}
	// The current claim's success is carried by the next claim.
	p.Done = []outboxdriver.Fence{{ID: ids[0], Attempts: 2}}
	_, done, err := d.Claim(context.Background(), pdb, ob.Table(), p)
	if err != nil || len(done) != 1 {
		t.Fatalf("claim carrying a success: %v %v", done, err)
	}
	if s, _ := state(t, db, ids[0]); s != "gone" {
		t.Errorf("carried success left the row %s", s)
	}
}

// TestLeaseMinimum: while leases are renewed, a relay on SQLite refuses a
// lease under sqlite.MinLease (three times the recommended busy timeout)
// with a ConfigError on Lease, and accepts MinLease, with which it
// delivers; with renewal off only outbox.MinLease applies.
func TestLeaseMinimum(t *testing.T) {
	db, ob := open(t)
	for _, tc := range []struct {
		lease   time.Duration
		noRenew bool
		ok      bool
	}{
		{2 * time.Second, false, false},
		{sqlite.MinLease - time.Millisecond, false, false},
		{sqlite.MinLease, false, true},
		{2 * time.Second, true, true},
		{outbox.MinLease - time.Millisecond, true, false},
	} {
		cfg := relayCfg(t)
		cfg.Lease, cfg.DisableLeaseRenewal = tc.lease, tc.noRenew
		_, err := ob.Relay(sqltx.FromDB(db), cfg)
		var ce *outbox.ConfigError
		switch {
		case tc.ok && err != nil:
			t.Errorf("Lease %v (renewal off: %v): %v, want it accepted", tc.lease, tc.noRenew, err)
		case !tc.ok && (!errors.As(err, &ce) || ce.Field != "Lease" || !errors.Is(err, outbox.ErrInvalidConfig)):
			t.Errorf("Lease %v (renewal off: %v): %v, want a ConfigError on Lease", tc.lease, tc.noRenew, err)
		}
	}
	cfg := relayCfg(t)
	cfg.Lease = sqlite.MinLease
	r, err := ob.Relay(sqltx.FromDB(db), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	r.Handle("t", func(context.Context, outbox.Delivery) error { n.Add(1); return nil })
	publish(t, db, ob, outbox.Message{Topic: "t"})
	runRelay(t, r)
	waitFor(t, "the message delivered and settled", func() bool { return n.Load() == 1 && count(t, db, "outbox") == 0 })
}
