package pgxtx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/outboxdriver"
)

// ExecCountTx runs query on the transaction and returns the rows it
// changed. It implements [outboxdriver.ExecCountTx], which the inbox uses.
func (t Tx) ExecCountTx(ctx context.Context, query string, args ...any) (int64, error) {
	if t.tx == nil {
		return 0, outboxdriver.ErrNilTx
	}
	return countOn(ctx, t.tx, query, args)
}

// ExecCountTx runs query on the connection and returns the rows it
// changed ([outboxdriver.ExecCountTx]).
func (c Conn) ExecCountTx(ctx context.Context, query string, args ...any) (int64, error) {
	if err := c.CheckTx(); err != nil {
		return 0, err
	}
	return countOn(ctx, c.conn, query, args)
}

func countOn(ctx context.Context, q querier, sql string, args []any) (int64, error) {
	tag, err := q.Exec(ctx, sql, args...)
	if err != nil {
		return 0, txClosed(err)
	}
	return tag.RowsAffected(), nil
}

// ExecDB runs query on the pool, outside any transaction, and returns the
// rows it changed ([outboxdriver.ExecDB]; the inbox's purge uses it).
func (d *DB) ExecDB(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := d.pool.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// Beginner begins pgx transactions on a pool for the inbox helpers
// (outbox.Receive, outbox.InboxHandler). Build it with [NewBeginner].
type Beginner struct {
	pool *pgxpool.Pool
	opts pgx.TxOptions
}

// NewBeginner returns a [Beginner] of transactions on pool with opts (the
// zero value for the server's defaults).
func NewBeginner(pool *pgxpool.Pool, opts pgx.TxOptions) Beginner {
	return Beginner{pool: pool, opts: opts}
}

// Begin begins a transaction on the pool.
func (b Beginner) Begin(ctx context.Context) (pgx.Tx, error) { return b.pool.BeginTx(ctx, b.opts) }

// Tx returns tx as an [outboxdriver.Tx] ([From]).
func (Beginner) Tx(tx pgx.Tx) outboxdriver.Tx { return From(tx) }

// Commit commits tx.
func (Beginner) Commit(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }

// Rollback rolls tx back.
func (Beginner) Rollback(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) }

var _ outboxdriver.Beginner[pgx.Tx] = Beginner{}
