package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// pgInbox migrates an inbox and a ledger table in a fresh schema.
func pgInbox(t *testing.T) (ib *outbox.Inbox, ledger string) {
	t.Helper()
	schema := pgtest.Schema(t)
	if err := postgres.MigrateInbox(context.Background(), pgtest.Admin(t), schema+".inbox"); err != nil {
		t.Fatal(err)
	}
	// Twice: the migration is recorded and not applied again.
	if err := postgres.MigrateInbox(context.Background(), pgtest.Admin(t), schema+".inbox"); err != nil {
		t.Fatal(err)
	}
	ledger = schema + ".ledger"
	if _, err := pgtest.Admin(t).Exec(`CREATE TABLE ` + ledger + ` (message_id text NOT NULL, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ib, err := outbox.NewInbox(postgres.Dialect(), outbox.InboxConfig{Table: schema + ".inbox"})
	if err != nil {
		t.Fatal(err)
	}
	return ib, ledger
}

// TestInboxRepeatableRead: under REPEATABLE READ the second of two
// transactions recording the same id fails with ErrRetryTx once the first
// commits (PostgreSQL's serialization failure, as the Inbox's doc says),
// and run again it sees a repeat.
func TestInboxRepeatableRead(t *testing.T) {
	ib, _ := pgInbox(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	rr := pgx.TxOptions{IsoLevel: pgx.RepeatableRead}
	first, err := pool.BeginTx(ctx, rr)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	second, err := pool.BeginTx(ctx, rr)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Rollback(ctx)
	// The second takes its snapshot before the first commits.
	if _, err := second.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	if fresh, err := ib.Record(ctx, pgxtx.From(first), "billing", "m-1"); err != nil || !fresh {
		t.Fatalf("first: %v, %v", fresh, err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := ib.Record(ctx, pgxtx.From(second), "billing", "m-1")
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, outbox.ErrRetryTx) {
		t.Fatalf("second under REPEATABLE READ: %v, want ErrRetryTx", err)
	}
	_ = second.Rollback(ctx)
	applied, err := outbox.Receive(ctx, ib, pgxtx.NewBeginner(pool, rr), "billing", "m-1", func(context.Context, pgx.Tx) error { return nil })
	if err != nil || applied {
		t.Fatalf("run again: applied %v, err %v; want a repeat", applied, err)
	}
}

// TestInboxBeginners: Receive through each adapter's Beginner applies a
// ledger entry once per id, in the driver's own transaction type.
func TestInboxBeginners(t *testing.T) {
	ctx := context.Background()
	t.Run("sqltx", func(t *testing.T) {
		ib, ledger := pgInbox(t)
		db := pgtest.Open(t, "postgres")
		b := sqltx.NewBeginner(db, nil)
		for range 3 {
			if _, err := outbox.Receive(ctx, ib, b, "ledger", "m-1", func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO `+ledger+` VALUES ('m-1', 10)`)
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		assertLedger(t, ledger, 1)
	})
	t.Run("pgxtx", func(t *testing.T) {
		ib, ledger := pgInbox(t)
		b := pgxtx.NewBeginner(pgtest.Pool(t), pgx.TxOptions{})
		for range 3 {
			if _, err := outbox.Receive(ctx, ib, b, "ledger", "m-1", func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ('m-1', 10)`)
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		assertLedger(t, ledger, 1)
	})
}

func assertLedger(t *testing.T, ledger string, want int) {
	t.Helper()
	var n int
	if err := pgtest.Admin(t).QueryRow(`SELECT count(*) FROM ` + ledger).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("ledger has %d entries, want %d", n, want)
	}
}

// TestInboxBeginWith: through pgxtx.NewBeginner the record travels with
// BEGIN (one round trip fewer). The same promises hold: new, repeat,
// ids that need quoting stored byte for byte (and seen as repeats by the
// parameterised Record), a failed effect keeps nothing, a concurrent
// duplicate waits and then sees a repeat, and every connection goes back
// to the pool, a repeat's too.
func TestInboxBeginWith(t *testing.T) {
	ib, ledger := pgInbox(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	b := pgxtx.NewBeginner(pool, pgx.TxOptions{})
	effect := func(id string) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, 1)`, id)
			return err
		}
	}
	ids := []string{"m-1", `a'b\c`, `\'); DROP TABLE x; --`, "é\u0301 ", `\\'\'`}
	for round := range 2 {
		for _, id := range ids {
			applied, err := outbox.Receive(ctx, ib, b, "c", id, effect(id))
			if err != nil || applied != (round == 0) {
				t.Fatalf("round %d, %q: applied %v, err %v", round, id, applied, err)
			}
		}
	}
	for _, id := range ids {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fresh, err := ib.Record(ctx, pgxtx.From(tx), "c", id)
		_ = tx.Rollback(ctx)
		if err != nil || fresh {
			t.Fatalf("Record(%q) after Receive: fresh %v, err %v; the literal stored other bytes", id, fresh, err)
		}
	}
	assertLedger(t, ledger, len(ids))
	boom := errors.New("boom")
	if _, err := outbox.Receive(ctx, ib, b, "c", "m-2", func(context.Context, pgx.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("failing effect: %v", err)
	}
	if applied, err := outbox.Receive(ctx, ib, b, "c", "m-2", effect("m-2")); err != nil || !applied {
		t.Fatalf("after a failed effect: %v %v", applied, err)
	}

	// A concurrent duplicate: the second waits for the first, then sees
	// a repeat (first committed) or applies (first rolled back).
	for _, commit := range []bool{true, false} {
		id := fmt.Sprintf("race-%v", commit)
		first, err := b.BeginWith(ctx, postgres.Dialect().(outboxdriver.InboxBeginDialect).InboxRecordLiteral(ib.Table(), "c", id))
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		var applied bool
		go func() {
			var err error
			applied, err = outbox.Receive(ctx, ib, b, "c", id, effect(id))
			got <- err
		}()
		select {
		case err := <-got:
			t.Fatalf("the second did not wait: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		end := first.Rollback
		if commit {
			end = first.Commit
		}
		if err := end(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil || applied == commit {
			t.Fatalf("first committed %v: second applied %v, err %v", commit, applied, err)
		}
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
}
