package fwdtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// Ledger is what a consumer's tests apply messages to: an inbox and a
// ledger table (id text) in a fresh schema, with a Beginner of pgx
// transactions on the test pool.
type Ledger struct {
	Inbox *outbox.Inbox
	Begin pgxtx.Beginner
	Table string
}

// NewLedger creates the inbox and the ledger, dropped when t ends.
func NewLedger(t testing.TB) Ledger {
	t.Helper()
	schema := pgtest.Schema(t)
	if err := postgres.MigrateInbox(context.Background(), pgtest.Admin(t), schema+".inbox"); err != nil {
		t.Fatal(err)
	}
	table := schema + ".ledger"
	if _, err := pgtest.Admin(t).Exec(`CREATE TABLE ` + table + ` (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ib, err := outbox.NewInbox(postgres.Dialect(), outbox.InboxConfig{Table: schema + ".inbox"})
	if err != nil {
		t.Fatal(err)
	}
	return Ledger{Inbox: ib, Begin: pgxtx.NewBeginner(pgtest.Pool(t), pgx.TxOptions{}), Table: table}
}

// Insert adds id to the ledger in tx: a consumer's effect.
func (l Ledger) Insert(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+l.Table+` VALUES ($1)`, id)
	return err
}

// Rows returns the ledger's ids in order, repeats included.
func (l Ledger) Rows(t testing.TB) []string {
	t.Helper()
	rows, err := pgtest.Admin(t).Query(`SELECT id FROM ` + l.Table + ` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}
