package pgxtx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/oncommit/oncommit/outboxdriver"
)

// InTx runs f inside one transaction on one connection of the pool (begun
// with the database's default isolation level), then commits, or rolls back
// when f fails. It implements [outboxdriver.TxDB]: ordered delivery settles
// a run in two statements of one transaction (lock the key rows, then
// write).
func (d *DB) InTx(ctx context.Context, f func(tx outboxdriver.DB) error) error {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return err
	}
	if err := f(poolTx{tx}); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return tx.Commit(ctx)
}

// poolTx is a pool's transaction as an outboxdriver.DB.
type poolTx struct{ tx pgx.Tx }

func (t poolTx) QueryDB(ctx context.Context, query string, args ...any) (outboxdriver.Rows, error) {
	rows, err := t.tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rows}, nil
}
