// Package pgxtx adapts pgx v5 to oncommit.
//
// [From] wraps a pgx.Tx (from pgx.Conn.Begin, pgxpool.Pool.Begin or
// pgxpool.Conn.Begin) so that outbox.Outbox.Publish writes the message inside
// that transaction. [FromConn] wraps a *pgx.Conn on which the caller has
// opened a transaction with SQL (BEGIN); it checks the connection's
// transaction status before every Publish and refuses a connection in
// autocommit or in a failed transaction. A *pgxpool.Pool has no
// transaction and is accepted by neither.
//
// For the relay, [FromPool] wraps a *pgxpool.Pool, and [FromStdlib] a
// *sql.DB opened with pgx's stdlib driver; both LISTEN for wake-ups.
//
// Behind PgBouncer in transaction pooling mode, set the pool's
// ConnConfig.DefaultQueryExecMode to pgx.QueryExecModeExec (pgx's default
// statement cache fails there), and NotifyOff on the Outbox and the relay;
// docs/operations.md ("PgBouncer") lists every setting.
package pgxtx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/internal/pglisten"
	"github.com/oncommit/oncommit/outboxdriver"
)

// Tx is the [outboxdriver.Tx] around a pgx.Tx. Build it with [From].
type Tx struct {
	tx pgx.Tx
}

// From returns tx as an [outboxdriver.Tx]. It does nothing else: tx stays the
// caller's to commit or roll back.
func From(tx pgx.Tx) Tx { return Tx{tx: tx} }

// CheckTx returns [outboxdriver.ErrNilTx] for a nil pgx.Tx. A committed or
// rolled-back pgx.Tx is reported by QueryTx, which pgx refuses locally.
func (t Tx) CheckTx() error {
	if t.tx == nil {
		return outboxdriver.ErrNilTx
	}
	return nil
}

// QueryTx runs query on the transaction.
func (t Tx) QueryTx(ctx context.Context, query string, args ...any) (outboxdriver.Rows, error) {
	if t.tx == nil {
		return nil, outboxdriver.ErrNilTx
	}
	return queryOn(ctx, t.tx, query, args)
}

// ExecTx runs query on the transaction.
func (t Tx) ExecTx(ctx context.Context, query string, args ...any) error {
	if t.tx == nil {
		return outboxdriver.ErrNilTx
	}
	return execOn(ctx, t.tx, query, args)
}

// Conn is the [outboxdriver.Tx] around a *pgx.Conn with an open transaction.
// Build it with [FromConn].
type Conn struct {
	conn *pgx.Conn
}

// FromConn returns conn as an [outboxdriver.Tx]. Publish accepts it only while the
// connection is inside a transaction that has not failed.
func FromConn(conn *pgx.Conn) Conn { return Conn{conn: conn} }

// CheckTx reads the transaction status the server last reported, without
// sending anything: [outboxdriver.ErrNotInTransaction] in autocommit,
// [outboxdriver.ErrTxAborted] in a failed transaction, [outboxdriver.ErrTxDone] on a
// closed connection.
func (c Conn) CheckTx() error {
	if c.conn == nil {
		return outboxdriver.ErrNilTx
	}
	if c.conn.IsClosed() {
		return fmt.Errorf("%w: connection is closed", outboxdriver.ErrTxDone)
	}
	switch c.conn.PgConn().TxStatus() {
	case 'T':
		return nil
	case 'E':
		return outboxdriver.ErrTxAborted
	default:
		return outboxdriver.ErrNotInTransaction
	}
}

// QueryTx runs query on the connection.
func (c Conn) QueryTx(ctx context.Context, query string, args ...any) (outboxdriver.Rows, error) {
	if err := c.CheckTx(); err != nil {
		return nil, err
	}
	return queryOn(ctx, c.conn, query, args)
}

// ExecTx runs query on the connection.
func (c Conn) ExecTx(ctx context.Context, query string, args ...any) error {
	if err := c.CheckTx(); err != nil {
		return err
	}
	return execOn(ctx, c.conn, query, args)
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func execOn(ctx context.Context, q querier, sql string, args []any) error {
	_, err := q.Exec(ctx, sql, args...)
	return txClosed(err)
}

// txClosed adds outboxdriver.ErrTxDone to pgx's pgx.ErrTxClosed.
func txClosed(err error) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("%w: %w", outboxdriver.ErrTxDone, err)
	}
	return err
}

func queryOn(ctx context.Context, q querier, sql string, args []any) (outboxdriver.Rows, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, txClosed(err)
	}
	return pgxRows{rows}, nil
}

// pgxRows gives pgx.Rows the Close() error of [outboxdriver.Rows].
type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
}

// DB is the [outboxdriver.DB] around a *pgxpool.Pool, for the relay and the
// operations. Build it with [FromPool].
type DB struct {
	pool *pgxpool.Pool
}

// FromPool returns pool as an [outboxdriver.DB]. The relay listens for notifications
// on a dedicated connection it opens with the pool's configuration and the
// application_name "oncommit-listener" (not one of the pool's connections).
func FromPool(pool *pgxpool.Pool) *DB { return &DB{pool: pool} }

// QueryDB runs query on the pool, outside any transaction.
func (d *DB) QueryDB(ctx context.Context, query string, args ...any) (outboxdriver.Rows, error) {
	rows, err := d.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rows}, nil
}

// CanListen returns nil: pgx can always listen, on a connection of its own
// (the pool's size does not matter). It implements [outboxdriver.Listener].
func (d *DB) CanListen() error { return nil }

// ListenDB opens a dedicated connection and listens on it until ctx ends or
// the connection fails.
func (d *DB) ListenDB(ctx context.Context, listenSQL string, wake func(payload string)) error {
	cfg := d.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = "oncommit-listener"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return pglisten.Run(ctx, conn, listenSQL, wake)
}
