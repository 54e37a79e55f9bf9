package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// TestClaimWindow: a claim with a window (ClaimParams.Recent) leaves the
// rows due before it, a claim without one takes them, and OldestDue
// reports the oldest due row, for one topic, several and every topic.
func TestClaimWindow(t *testing.T) {
	t.Parallel()
	for _, form := range []struct {
		name string
		p    outboxdriver.ClaimParams
	}{
		{"one topic", outboxdriver.ClaimParams{Topics: []string{"t"}}},
		{"several", outboxdriver.ClaimParams{Topics: []string{"t", "u"}}},
		{"every topic", outboxdriver.ClaimParams{AllTopics: true}},
	} {
		t.Run(form.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{})
			admin := pgtest.Admin(t)
			// An old row (due 10 minutes ago), a new one, and one not due.
			if _, err := admin.Exec(`INSERT INTO ` + e.table + ` (id, topic, available_at) VALUES
				(gen_random_uuid(), 't', now() - interval '10 minutes'),
				(gen_random_uuid(), 't', now()),
				(gen_random_uuid(), 't', now() + interval '1 hour')`); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			d := postgres.Dialect().(outboxdriver.RelayDialect)
			wc := d.(outboxdriver.WindowedClaimer)
			db := pgxtx.FromPool(pool(t))
			due, err := wc.OldestDue(ctx, db, e.ob.Table(), form.p)
			if err != nil || !due.Found || due.Age < 9*time.Minute || due.Age > 11*time.Minute || due.Took <= 0 || due.Took > time.Second {
				t.Fatalf("OldestDue: %+v, %v; want found, about 10m, and the time it took", due, err)
			}
			p := form.p
			p.Limit, p.Lease, p.MaxAttempts = 10, time.Minute, 5
			p.Recent = 5 * time.Second
			cs, _, err := d.Claim(ctx, db, e.ob.Table(), p)
			if err != nil || len(cs) != 1 {
				t.Fatalf("claim in a window of 5s: %d claimed, %v; want the new row only", len(cs), err)
			}
			p.Recent = 0
			if cs, _, err = d.Claim(ctx, db, e.ob.Table(), p); err != nil || len(cs) != 1 {
				t.Fatalf("claim without a window: %d claimed, %v; want the old row", len(cs), err)
			}
			if due, err := wc.OldestDue(ctx, db, e.ob.Table(), form.p); err != nil || due.Found {
				t.Fatalf("OldestDue with nothing due: %+v, %v", due, err)
			}
		})
	}
}

// TestClaimWindowUnderHeldHorizon: while a REPEATABLE READ transaction
// holds the MVCC horizon, the index entries of delivered (deleted)
// messages stay; a claim without a window reads every one of them, a
// claim in a window reads a bounded number of buffers.
func TestClaimWindowUnderHeldHorizon(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	admin := pgtest.Admin(t)
	ctx := context.Background()
	held, err := admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback()
	if _, err := held.Exec(`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := held.QueryRow(`SELECT count(*) FROM ` + e.orders).Scan(&n); err != nil {
		t.Fatal(err)
	}
	// 20,000 messages published, claimed and deleted, due 20s to 1s ago.
	for _, q := range []string{
		`INSERT INTO ` + e.table + ` (id, topic, available_at) SELECT gen_random_uuid(), 't', now() - interval '1 second' - make_interval(secs => g / 1000.0) FROM generate_series(1, 20000) g`,
		`UPDATE ` + e.table + ` SET state = 'processing', available_at = available_at - interval '1 hour'`,
		`DELETE FROM ` + e.table,
		`VACUUM ` + e.table,
	} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	buffers := func(recent float64) int {
		t.Helper()
		var plan string
		if err := admin.QueryRow(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+pgsql.ClaimSQL(e.ob.Table(), 1), "t", 100, 30.0, 10, recent).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		var p []struct {
			Plan struct {
				Hit  int `json:"Shared Hit Blocks"`
				Read int `json:"Shared Read Blocks"`
			}
		}
		if err := json.Unmarshal([]byte(plan), &p); err != nil || len(p) != 1 {
			t.Fatalf("%v: %s", err, plan)
		}
		return p[0].Plan.Hit + p[0].Plan.Read
	}
	whole, window := buffers(0), buffers(0.5)
	t.Logf("buffers read by a claim over 20,000 dead entries: %d without a window, %d in a window of 0.5s", whole, window)
	if whole < 500 {
		t.Errorf("a claim without a window read %d buffers: the horizon did not hold the dead entries (the test proves nothing)", whole)
	}
	if window > 50 {
		t.Errorf("a claim in a window read %d buffers, want at most 50", window)
	}
}

// TestWindowLateCommit: a publish whose transaction began long before it
// committed (its available_at is before the claims' window) is still
// delivered, found by the relay's probe, with a handler of one topic, of
// two topics, and a catch-all.
func TestWindowLateCommit(t *testing.T) {
	t.Parallel()
	for _, topics := range [][]string{{"t"}, {"t", "u"}, {outbox.AllTopics}} {
		t.Run(fmt.Sprint(topics), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{})
			p := pool(t)
			r, err := e.ob.Relay(pgxtx.FromPool(p), fast(t, outbox.RelayConfig{}))
			if err != nil {
				t.Fatal(err)
			}
			outbox.AlwaysWindows(r)
			rec := newRecorder()
			for _, topic := range topics {
				if err := r.Handle(topic, func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil }); err != nil {
					t.Fatal(err)
				}
			}
			start(t, r)
			ctx := context.Background()
			late, err := p.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer late.Rollback(ctx)
			if _, err := late.Exec(ctx, `SELECT now()`); err != nil { // the transaction's timestamp
				t.Fatal(err)
			}
			// Messages published and delivered for 2s move the window past
			// the late transaction's timestamp.
			for i := range 20 {
				publishN(t, e, p, 1, outbox.Message{Topic: "t"})
				eventually(t, 10*time.Second, "a message delivered", func() bool { return rec.count() == i+1 })
				time.Sleep(100 * time.Millisecond)
			}
			res, err := e.ob.Publish(ctx, pgxtx.From(late), outbox.Message{Topic: "t"})
			if err != nil {
				t.Fatal(err)
			}
			if err := late.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "the late message delivered", func() bool { return len(rec.attempts(res.ID)) == 1 })
			if outbox.WindowProbes(r) == 0 {
				t.Error("the late message was delivered without the probe finding it before the window: the claims took it without a window")
			}
		})
	}
}
