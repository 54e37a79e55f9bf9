// Package sqltx adapts database/sql to oncommit.
//
// [From] wraps the caller's *sql.Tx so that outbox.Outbox.Publish writes the
// message inside that transaction; the message commits or rolls back with the
// business rows. From takes only a *sql.Tx, so a *sql.DB or *sql.Conn (which
// would commit the message on its own) does not compile.
//
// It works with any database/sql driver of a supported dialect: lib/pq or
// pgx's stdlib driver for PostgreSQL, modernc.org/sqlite for SQLite,
// github.com/go-sql-driver/mysql for MySQL and MariaDB.
//
// A relay on [FromDB] polls; to have it LISTEN for wake-ups on PostgreSQL
// through database/sql, open the pool with pgx's stdlib driver and use
// pgxtx.FromStdlib, which adds the listener. This package imports no
// driver.
//
// Behind PgBouncer in transaction pooling mode, open pgx's stdlib driver
// with default_query_exec_mode=exec in the URL, or lib/pq with
// binary_parameters=yes, and set NotifyOff on the Outbox and the relay;
// docs/operations.md ("PgBouncer") lists every setting.
package sqltx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/oncommit/oncommit/outboxdriver"
)

// Tx is the [outboxdriver.Tx] around a *sql.Tx. Build it with [From].
type Tx struct {
	tx *sql.Tx
}

// From returns tx as an [outboxdriver.Tx]. It does nothing else: tx stays the
// caller's to commit or roll back.
func From(tx *sql.Tx) Tx { return Tx{tx: tx} }

// CheckTx returns [outboxdriver.ErrNilTx] for a nil *sql.Tx. database/sql does not
// expose whether a transaction has finished; QueryTx reports that without
// sending anything.
func (t Tx) CheckTx() error {
	if t.tx == nil {
		return outboxdriver.ErrNilTx
	}
	return nil
}

// QueryTx runs query on the transaction. A finished transaction gives an
// error wrapping both [outboxdriver.ErrTxDone] and [sql.ErrTxDone].
func (t Tx) QueryTx(ctx context.Context, query string, args ...any) (outboxdriver.Rows, error) {
	if t.tx == nil {
		return nil, outboxdriver.ErrNilTx
	}
	rows, err := t.tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, txDone(err)
	}
	return rows, nil
}

// ExecTx runs query on the transaction. A finished transaction gives an
// error wrapping both [outboxdriver.ErrTxDone] and [sql.ErrTxDone].
func (t Tx) ExecTx(ctx context.Context, query string, args ...any) error {
	if t.tx == nil {
		return outboxdriver.ErrNilTx
	}
	_, err := t.tx.ExecContext(ctx, query, args...)
	return txDone(err)
}

// txDone adds outboxdriver.ErrTxDone to database/sql's sql.ErrTxDone.
func txDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("%w: %w", outboxdriver.ErrTxDone, err)
	}
	return err
}

// DB is the [outboxdriver.DB] around a *sql.DB, for the relay and the operations.
// Build it with [FromDB].
type DB struct {
	db *sql.DB

	// stmts holds the statements QueryPrepared prepared, by text; at most
	// maxPrepared of them, so a caller that builds texts cannot grow it
	// without bound (beyond that, statements run unprepared).
	stmts    sync.Map // string -> *sql.Stmt
	prepared atomic.Int32
}

// maxPrepared bounds the statements a DB keeps prepared.
const maxPrepared = 64

// FromDB returns db as an [outboxdriver.DB], for the relay and the
// operations. A relay on it polls (see [DB.CanListen]).
func FromDB(db *sql.DB) *DB { return &DB{db: db} }

// QueryDB runs query on the pool, outside any transaction.
func (d *DB) QueryDB(ctx context.Context, query string, args ...any) (outboxdriver.Rows, error) {
	rows, err := d.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

// QueryPrepared runs query like QueryDB, as a prepared statement kept for
// the next calls (database/sql prepares it again on each connection that
// runs it). It implements [outboxdriver.PreparedDB]; the SQLite dialect runs its
// claim and settle statements this way.
func (d *DB) QueryPrepared(ctx context.Context, query string, args ...any) (outboxdriver.Rows, error) {
	st, err := d.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return d.QueryDB(ctx, query, args...)
	}
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

// stmt returns the prepared statement for query, preparing it the first
// time, or nil when maxPrepared statements are kept already.
func (d *DB) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st, ok := d.stmts.Load(query); ok {
		return st.(*sql.Stmt), nil
	}
	if d.prepared.Add(1) > maxPrepared {
		d.prepared.Add(-1)
		return nil, nil
	}
	st, err := d.db.PrepareContext(ctx, query)
	if err != nil {
		d.prepared.Add(-1)
		return nil, err
	}
	if prev, loaded := d.stmts.LoadOrStore(query, st); loaded {
		d.prepared.Add(-1)
		st.Close()
		return prev.(*sql.Stmt), nil
	}
	return st, nil
}

// CanListen returns an error wrapping [outboxdriver.ErrUnsupported]: a
// relay on this pool polls. To LISTEN through database/sql on PostgreSQL,
// open the pool with pgx's stdlib driver and wrap it with pgxtx.FromStdlib
// instead (lib/pq cannot LISTEN through database/sql at all). Keeping LISTEN
// out of this package keeps pgx out of programs that do not use it (a
// SQLite-only program links no pgx). It implements [outboxdriver.Listener],
// so that RelayConfig.Listen ListenOn fails when the relay is built, naming
// the driver.
func (d *DB) CanListen() error {
	return fmt.Errorf("%w: sqltx.FromDB polls only (driver %T); to LISTEN through database/sql, open the pool with pgx's stdlib driver and use pgxtx.FromStdlib", outboxdriver.ErrUnsupported, d.db.Driver())
}

// ListenDB returns the error of CanListen.
func (d *DB) ListenDB(context.Context, string, func(string)) error { return d.CanListen() }

// InTx runs f inside one transaction on one connection of the pool (begun
// with the database's default isolation level), then commits, or rolls back
// when f fails. It implements [outboxdriver.TxDB]: the MySQL dialect claims this
// way (SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE, then COMMIT).
func (d *DB) InTx(ctx context.Context, f func(tx outboxdriver.DB) error) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(txDB{tx}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// txDB is a transaction as an outboxdriver.DB and an outboxdriver.ExecDB.
type txDB struct{ tx *sql.Tx }

// ExecDB runs query on the transaction and returns the rows it changed.
func (t txDB) ExecDB(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := t.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (t txDB) QueryDB(ctx context.Context, query string, args ...any) (outboxdriver.Rows, error) {
	rows, err := t.tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}
