package sqltx

import (
	"context"
	"database/sql"

	"github.com/oncommit/oncommit/outboxdriver"
)

// ExecCountTx runs query on the transaction and returns the rows it
// changed. It implements [outboxdriver.ExecCountTx], which the inbox uses.
func (t Tx) ExecCountTx(ctx context.Context, query string, args ...any) (int64, error) {
	if t.tx == nil {
		return 0, outboxdriver.ErrNilTx
	}
	res, err := t.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, txDone(err)
	}
	return res.RowsAffected()
}

// ExecDB runs query on the pool, outside any transaction, and returns the
// rows it changed. It implements [outboxdriver.ExecDB] (the inbox's purge
// uses it).
func (d *DB) ExecDB(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := d.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Beginner begins database/sql transactions for the inbox helpers
// (outbox.Receive, outbox.InboxHandler). Build it with [NewBeginner].
type Beginner struct {
	db   *sql.DB
	opts *sql.TxOptions
}

// NewBeginner returns a [Beginner] of transactions on db with opts (nil
// for the database's defaults).
func NewBeginner(db *sql.DB, opts *sql.TxOptions) Beginner { return Beginner{db: db, opts: opts} }

// Begin begins a transaction on the pool.
func (b Beginner) Begin(ctx context.Context) (*sql.Tx, error) { return b.db.BeginTx(ctx, b.opts) }

// Tx returns tx as an [outboxdriver.Tx] ([From]).
func (Beginner) Tx(tx *sql.Tx) outboxdriver.Tx { return From(tx) }

// Commit commits tx.
func (Beginner) Commit(_ context.Context, tx *sql.Tx) error { return tx.Commit() }

// Rollback rolls tx back.
func (Beginner) Rollback(_ context.Context, tx *sql.Tx) error { return tx.Rollback() }

var _ outboxdriver.Beginner[*sql.Tx] = Beginner{}
