package postgres

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// TestPurgeOneAtATime: a purge batch that finds another session's purge of
// the same table and states under way (its advisory lock held) deletes
// nothing and returns at once; a purge of other states goes ahead; a row
// some transaction has locked is skipped, not waited for; purges run
// together delete every row once between them.
func TestPurgeOneAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Admin(t)
	table, tb := migratedTable(t)
	fill := func(state string, n int) {
		t.Helper()
		if _, err := admin.Exec(`INSERT INTO `+table+` (id, topic, state, settled_at)
			SELECT gen_random_uuid(), 't', $1, now() - interval '1 hour' FROM generate_series(1, $2)`, state, n); err != nil {
			t.Fatal(err)
		}
	}
	left := func(state string) int {
		t.Helper()
		var n int
		if err := admin.QueryRow(`SELECT count(*) FROM `+table+` WHERE state = $1`, state).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	fill("delivered", 2500)
	fill("dead", 3)
	d := Dialect().(outboxdriver.RelayDialect)
	db := sqltx.FromDB(pgtest.Open(t, "pgx"))
	delivered := []outbox.State{outbox.StateDelivered}
	purge := func(states []outbox.State) (int64, time.Duration) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		began := time.Now()
		n, err := d.Purge(cctx, db, tb, states, 0)
		if err != nil {
			t.Fatal(err)
		}
		return n, time.Since(began)
	}

	// Another session's purge of delivered rows holds the lock.
	other, err := admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback()
	if _, err := other.Exec(`SELECT pg_advisory_xact_lock(hashtext('oncommit.purge'), hashtext($1))`, purgeKey(tb, []string{"delivered"})); err != nil {
		t.Fatal(err)
	}
	if n, took := purge(delivered); n != 0 || took > 2*time.Second || left("delivered") != 2500 {
		t.Errorf("purge while another holds the lock: %d in %v, %d left; want 0 at once", n, took, left("delivered"))
	}
	if n, _ := purge([]outbox.State{outbox.StateDead}); n != 3 {
		t.Errorf("purge of dead rows while delivered ones are purged elsewhere: %d, want 3", n)
	}
	// The lock released, one row locked by some transaction: skipped.
	if err := other.Rollback(); err != nil {
		t.Fatal(err)
	}
	locker, err := admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback()
	if _, err := locker.Exec(`SELECT id FROM ` + table + ` WHERE state = 'delivered' LIMIT 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	if n, took := purge(delivered); n != 2499 || took > 5*time.Second {
		t.Errorf("purge with one row locked: %d in %v, want 2499 without waiting", n, took)
	}
	if err := locker.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n, _ := purge(delivered); n != 1 {
		t.Errorf("purge of the row once unlocked: %d, want 1", n)
	}

	// Four purges at once: between them, every row once.
	fill("delivered", 5000)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total int64
	for range 4 {
		wg.Go(func() {
			n, err := d.Purge(ctx, db, tb, delivered, 0)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	if total != 5000 || left("delivered") != 0 {
		t.Errorf("four purges at once deleted %d of 5000, %d left", total, left("delivered"))
	}
}
