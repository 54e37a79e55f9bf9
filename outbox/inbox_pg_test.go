package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
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
