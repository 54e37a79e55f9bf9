// Package pgxtx adapts pgx v5 to oncommit.
//
// [From] wraps a pgx.Tx (from pgx.Conn.Begin, pgxpool.Pool.Begin or
// pgxpool.Conn.Begin) so that [outbox.Outbox.Publish] writes the message inside
// that transaction. [FromConn] wraps a *pgx.Conn on which the caller has
// opened a transaction with SQL (BEGIN); it checks the connection's
// transaction status before every Publish and refuses a connection in
// autocommit or in a failed transaction. A *pgxpool.Pool has no
// transaction and is accepted by neither.
package pgxtx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/oncommit/oncommit/outbox"
)

// Tx is the [outbox.Tx] around a pgx.Tx. Build it with [From].
type Tx struct {
	tx pgx.Tx
}

// From returns tx as an [outbox.Tx]. It does nothing else: tx stays the
// caller's to commit or roll back.
func From(tx pgx.Tx) Tx { return Tx{tx: tx} }

// CheckTx returns [outbox.ErrNilTx] for a nil pgx.Tx. A committed or
// rolled-back pgx.Tx is reported by QueryTx, which pgx refuses locally.
func (t Tx) CheckTx() error {
	if t.tx == nil {
		return outbox.ErrNilTx
	}
	return nil
}

// QueryTx runs query on the transaction.
func (t Tx) QueryTx(ctx context.Context, query string, args ...any) (outbox.Rows, error) {
	if t.tx == nil {
		return nil, outbox.ErrNilTx
	}
	return queryOn(ctx, t.tx, query, args)
}

// Conn is the [outbox.Tx] around a *pgx.Conn with an open transaction.
// Build it with [FromConn].
type Conn struct {
	conn *pgx.Conn
}

// FromConn returns conn as an [outbox.Tx]. Publish accepts it only while the
// connection is inside a transaction that has not failed.
func FromConn(conn *pgx.Conn) Conn { return Conn{conn: conn} }

// CheckTx reads the transaction status the server last reported, without
// sending anything: [outbox.ErrNotInTransaction] in autocommit,
// [outbox.ErrTxAborted] in a failed transaction, [outbox.ErrTxDone] on a
// closed connection.
func (c Conn) CheckTx() error {
	if c.conn == nil {
		return outbox.ErrNilTx
	}
	if c.conn.IsClosed() {
		return fmt.Errorf("%w: connection is closed", outbox.ErrTxDone)
	}
	switch c.conn.PgConn().TxStatus() {
	case 'T':
		return nil
	case 'E':
		return outbox.ErrTxAborted
	default:
		return outbox.ErrNotInTransaction
	}
}

// QueryTx runs query on the connection.
func (c Conn) QueryTx(ctx context.Context, query string, args ...any) (outbox.Rows, error) {
	if err := c.CheckTx(); err != nil {
		return nil, err
	}
	return queryOn(ctx, c.conn, query, args)
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func queryOn(ctx context.Context, q querier, sql string, args []any) (outbox.Rows, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		if errors.Is(err, pgx.ErrTxClosed) {
			return nil, fmt.Errorf("%w: %w", outbox.ErrTxDone, err)
		}
		return nil, err
	}
	return pgxRows{rows}, nil
}

// pgxRows gives pgx.Rows the Close() error of [outbox.Rows].
type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
}
