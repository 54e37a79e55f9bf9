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

// BeginWith begins a transaction and runs stmt in it in one round trip
// (BEGIN and stmt as one simple-protocol query), for the inbox's record
// (outboxdriver.BeginnerWith). When stmt fails it rolls back, returns the
// connection to the pool and returns stmt's error.
func (b Beginner) BeginWith(ctx context.Context, stmt string) (pgx.Tx, error) {
	c, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	opts := b.opts
	opts.BeginQuery = beginSQL(b.opts) + "; " + stmt
	tx, err := c.Conn().BeginTx(ctx, opts)
	if err != nil {
		if c.Conn().PgConn().TxStatus() != 'I' && !c.Conn().IsClosed() {
			_, _ = c.Conn().Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
		c.Release()
		return nil, err
	}
	return &pooledTx{Tx: tx, c: c}, nil
}

// beginSQL is the statement that begins a transaction with opts, as pgx
// writes it.
func beginSQL(opts pgx.TxOptions) string {
	if opts.BeginQuery != "" {
		return opts.BeginQuery
	}
	s := "begin"
	if opts.IsoLevel != "" {
		s += " isolation level " + string(opts.IsoLevel)
	}
	if opts.AccessMode != "" {
		s += " " + string(opts.AccessMode)
	}
	if opts.DeferrableMode != "" {
		s += " " + string(opts.DeferrableMode)
	}
	return s
}

// pooledTx is a transaction on a connection acquired from the pool, which
// it returns when it ends (as pgxpool's own transactions do).
type pooledTx struct {
	pgx.Tx
	c *pgxpool.Conn
}

func (t *pooledTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.release()
	return err
}

func (t *pooledTx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	t.release()
	return err
}

func (t *pooledTx) release() {
	if t.c != nil {
		t.c.Release()
		t.c = nil
	}
}

var (
	_ outboxdriver.Beginner[pgx.Tx]     = Beginner{}
	_ outboxdriver.BeginnerWith[pgx.Tx] = Beginner{}
)
