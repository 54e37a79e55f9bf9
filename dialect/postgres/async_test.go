package postgres

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// TestAsyncCommitStatements runs each claim and settle statement inside an
// explicit transaction and reads synchronous_commit before it ends: off
// after a statement of RelayConfig.AsyncCommit, the server's on after the
// same statement without it. So the asynchronous forms set the setting for
// their own transaction (which, sent alone, is the statement), and the
// others leave it alone.
func TestAsyncCommitStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Admin(t)
	table, tb := migratedTable(t)
	if _, err := admin.Exec(`INSERT INTO ` + table + ` (id, topic) SELECT gen_random_uuid(), 't' FROM generate_series(1, 5)`); err != nil {
		t.Fatal(err)
	}
	d := Dialect().(*dialect)
	ct, st := d.texts.claim.Get(tb), d.texts.settle.Get(tb)
	lt := d.claimTexts(tb, 2) // the limit, 2 as in claimArgs, written in the text
	if !strings.Contains(lt.claim[0], "LIMIT 2\n") {
		t.Fatalf("claimTexts(2) has no LIMIT 2:\n%s", lt.claim[0])
	}
	claimArgs := []any{"t", 2, 30.0, 25, 0.0}
	doneArgs := []any{"t", 2, 30.0, 25, "{}", "{}", 0.0}
	empty := []any{"{}", "{}"}
	type stmt struct {
		name string
		sync string
		asy  string
		args []any
	}
	stmts := []stmt{
		{"claim", ct.claim[0], ct.claimAsync[0], claimArgs},
		{"claim several topics", ct.claim[1], ct.claimAsync[1], []any{"{t,u}", 2, 30.0, 25, 0.0}},
		{"claim every topic", ct.claim[2], ct.claimAsync[2], []any{"", 2, 30.0, 25, 0.0}},
		{"claim and delete", ct.claimDelete[0], ct.claimDeleteAsync[0], doneArgs},
		{"claim and keep", ct.claimKeep[0], ct.claimKeepAsync[0], doneArgs},
		{"claim, limit in the text", lt.claim[0], lt.claimAsync[0], claimArgs},
		{"claim several topics, limit in the text", lt.claim[1], lt.claimAsync[1], []any{"{t,u}", 2, 30.0, 25, 0.0}},
		{"claim and delete, limit in the text", lt.claimDelete[0], lt.claimDeleteAsync[0], doneArgs},
		{"claim and keep, limit in the text", lt.claimKeep[0], lt.claimKeepAsync[0], doneArgs},
		{"settle done", st[0].deleteDone, st[1].deleteDone, empty},
		{"settle delivered", st[0].markDelivered, st[1].markDelivered, empty},
		{"settle retry", st[0].retry, st[1].retry, []any{"{}", "{}", "{}", "{}", "{}"}},
		{"settle dead", st[0].markDead, st[1].markDead, []any{"{}", "{}", "{}"}},
		{"settle discard dead", st[0].deleteDead, st[1].deleteDead, empty},
	}
	// The asynchronous forms add a one-time filter and nothing else: the
	// scans of each plan are those of the synchronous form.
	scans := func(q string, args []any) []string {
		t.Helper()
		rows, err := admin.QueryContext(ctx, `EXPLAIN (COSTS OFF) `+q, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(line, "Scan") {
				out = append(out, strings.TrimLeft(line, " ->"))
			}
		}
		slices.Sort(out) // the one-time filter's InitPlan may print first
		return out
	}
	for _, s := range stmts {
		if a, b := scans(s.sync, s.args), scans(s.asy, s.args); !slices.Equal(a, b) {
			t.Errorf("%s: scans %q without AsyncCommit, %q with it", s.name, a, b)
		}
	}
	for _, s := range stmts {
		for _, async := range []bool{false, true} {
			q, want := s.sync, "on"
			if async {
				q, want = s.asy, "off"
			}
			if q == "" || (async && q == s.sync) {
				t.Fatalf("%s: no asynchronous form", s.name)
			}
			tx, err := admin.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := tx.QueryContext(ctx, q, s.args...)
			if err != nil {
				t.Fatalf("%s (async %v): %v", s.name, async, err)
			}
			for rows.Next() {
			}
			if err := errors.Join(rows.Err(), rows.Close()); err != nil {
				t.Fatalf("%s (async %v): %v", s.name, async, err)
			}
			var got string
			if err := tx.QueryRowContext(ctx, `SHOW synchronous_commit`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s (async %v): synchronous_commit %q in its transaction, want %q", s.name, async, got, want)
			}
		}
	}
}

// TestAsyncCommitRelay drains messages with a relay of
// RelayConfig.AsyncCommit (claims carrying successes, settles of retries)
// and checks that every message was delivered, that the one failed once
// was retried, and that no connection of the relay's pool was left with
// synchronous_commit off. Relay refuses the option with ordered delivery
// (and, TestAsyncCommitUnsupported in package outbox, on a dialect without
// it).
func TestAsyncCommitRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Admin(t)
	table, _ := migratedTable(t)
	ob, err := outbox.New(Dialect(), outbox.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	fail := publishN(t, pgtest.Pool(t), ob, n)[7]

	relayPool, err := pgxpool.New(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer relayPool.Close()
	r, err := ob.Relay(pgxtx.FromPool(relayPool), outbox.RelayConfig{AsyncCommit: true, PollInterval: 20 * time.Millisecond, RetryBase: time.Millisecond, RetryCap: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var delivered, failed atomic.Int64
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Handle("t", func(_ context.Context, d outbox.Delivery) error {
		if d.ID == fail && d.Attempt == 1 {
			failed.Add(1)
			return errors.New("first attempt fails")
		}
		if delivered.Add(1) == n {
			cancel()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(rctx); err != nil {
		t.Fatal(err)
	}
	if delivered.Load() != n || failed.Load() != 1 {
		t.Fatalf("delivered %d of %d, failed %d (want 1)", delivered.Load(), n, failed.Load())
	}
	var left int
	if err := admin.QueryRow(`SELECT count(*) FROM ` + table).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d rows left after the drain", left)
	}
	conns := relayPool.AcquireAllIdle(ctx)
	if len(conns) == 0 {
		t.Fatal("no idle connection in the relay's pool")
	}
	for _, c := range conns {
		var got string
		if err := c.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		c.Release()
		if got != "on" {
			t.Errorf("a relay connection has synchronous_commit %q after the drain, want on", got)
		}
	}

	ordered, err := outbox.New(Dialect(), outbox.Config{Table: table, OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	var ce *outbox.ConfigError
	if _, err := ordered.Relay(pgxtx.FromPool(relayPool), outbox.RelayConfig{AsyncCommit: true}); !errors.As(err, &ce) || ce.Field != "AsyncCommit" {
		t.Errorf("Relay with AsyncCommit and OrderByKey: %v, want a ConfigError on AsyncCommit", err)
	}
}

// migratedTable migrates an outbox table in a fresh schema and returns its
// name, parsed.
func migratedTable(t *testing.T) (string, outbox.Table) {
	t.Helper()
	table := pgtest.Schema(t) + ".outbox"
	if err := Migrate(context.Background(), pgtest.Admin(t), table); err != nil {
		t.Fatal(err)
	}
	tb, err := outbox.ParseTable(table)
	if err != nil {
		t.Fatal(err)
	}
	return table, tb
}

// publishN publishes n messages of topic t through ob, in committed
// transactions of at most 100, and returns their ids in order.
func publishN(t *testing.T, pool *pgxpool.Pool, ob *outbox.Outbox, n int) []outbox.ID {
	t.Helper()
	ctx := context.Background()
	var ids []outbox.ID
	for len(ids) < n {
		msgs := make([]outbox.Message, min(100, n-len(ids)))
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "t", Payload: []byte(`{}`)}
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := ob.PublishBatch(ctx, pgxtx.From(tx), msgs)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			ids = append(ids, r.ID)
		}
	}
	return ids
}
