package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// TestDeleteFencedInterleaved forces the race the fenced delete of
// successes (deleteFenced: by primary key, attempts looked up in the
// array) must win: relay A's lease has lapsed and relay B's reclaim has
// updated the row but not committed when A's success arrives. A's delete,
// alone or carried by a claim, waits for B's lock, then re-reads the row:
// after B commits (attempts 2) it deletes nothing and reports the fence as
// not applied; after B rolls back (attempts still 1) it deletes the row.
func TestDeleteFencedInterleaved(t *testing.T) {
	t.Parallel()
	table, tb := migratedTable(t)
	ob, err := outbox.New(Dialect(), outbox.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t)
	db := pgxtx.FromPool(pool)
	d := Dialect().(outboxdriver.RelayDialect)
	ctx := context.Background()
	tbl := pgsql.QuoteTable(tb)
	settle := map[string]func(f outboxdriver.Fence) ([]outboxdriver.Fence, error){
		"alone": func(f outboxdriver.Fence) ([]outboxdriver.Fence, error) {
			return d.Settle(ctx, db, tb, outboxdriver.SettleParams{}, []outboxdriver.Settlement{{Fence: f, Kind: outboxdriver.SettleDone}})
		},
		"carried": func(f outboxdriver.Fence) ([]outboxdriver.Fence, error) {
			_, applied, err := d.Claim(ctx, db, tb, outboxdriver.ClaimParams{Topics: []string{"none"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5, Done: []outboxdriver.Fence{f}})
			return applied, err
		},
	}
	for _, form := range []string{"alone", "carried"} {
		for _, commit := range []bool{true, false} {
			id := publishN(t, pool, ob, 1)[0]
			cs, _, err := d.Claim(ctx, db, tb, outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5})
			if err != nil || len(cs) != 1 || cs[0].Attempts != 1 {
				t.Fatalf("claim: %v %v", cs, err)
			}
			// B's reclaim, parked after its UPDATE.
			b, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Exec(ctx, `UPDATE `+tbl+` SET attempts = attempts + 1, available_at = now() + interval '1 minute' WHERE id = $1`, id.String()); err != nil {
				t.Fatal(err)
			}
			type result struct {
				applied []outboxdriver.Fence
				err     error
			}
			var xid string
			if err := b.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
				t.Fatal(err)
			}
			res := make(chan result, 1)
			go func() {
				a, err := settle[form](outboxdriver.Fence{ID: id, Attempts: 1})
				res <- result{a, err}
			}()
			// A's delete waits for B's row lock.
			waitLockWait(t, pool, xid)
			select {
			case r := <-res:
				t.Fatalf("%s: the delete returned before B ended: %v %v", form, r.applied, r.err)
			default:
			}
			if commit {
				err = b.Commit(ctx)
			} else {
				err = b.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-res
			if r.err != nil {
				t.Fatalf("%s: %v", form, r.err)
			}
			var left int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tbl+` WHERE id = $1`, id.String()).Scan(&left); err != nil {
				t.Fatal(err)
			}
			switch {
			case commit && (len(r.applied) != 0 || left != 1):
				t.Errorf("%s, B committed: applied %v, %d rows left; want the stale delete to change nothing", form, r.applied, left)
			case !commit && (len(r.applied) != 1 || left != 0):
				t.Errorf("%s, B rolled back: applied %v, %d rows left; want the row deleted", form, r.applied, left)
			}
			if _, err := pool.Exec(ctx, `DELETE FROM `+tbl); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// waitLockWait waits until a session waits for transaction xid's lock
// (the statement the test parked behind B's row lock).
func waitLockWait(t *testing.T, pool *pgxpool.Pool, xid string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted AND transactionid::text = $1`, xid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session waited for transaction %s within 10s", xid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
