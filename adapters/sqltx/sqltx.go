// Package sqltx adapts database/sql to oncommit.
//
// [From] wraps the caller's *sql.Tx so that [outboxdriver.Outbox.Publish] writes the
// message inside that transaction; the message commits or rolls back with the
// business rows. From takes only a *sql.Tx, so a *sql.DB or *sql.Conn (which
// would commit the message on its own) does not compile.
//
// It works with any database/sql driver of a supported dialect: lib/pq or
// pgx's stdlib driver for PostgreSQL, modernc.org/sqlite for SQLite,
// github.com/go-sql-driver/mysql for MySQL and MariaDB.
//
// Behind PgBouncer in transaction pooling mode, open pgx's stdlib driver
// with default_query_exec_mode=exec in the URL, or lib/pq with
// binary_parameters=yes, and set NotifyOff on the Outbox and the relay;
// docs/operations.md ("PgBouncer") lists every setting.
package sqltx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/oncommit/oncommit/internal/pglisten"
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

// FromDB returns db as an [outboxdriver.DB]. With pgx's stdlib driver it can also
// listen for notifications (on a connection it takes from db for as long as
// the relay runs); with lib/pq the relay polls only.
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

// CanListen reports whether the relay can listen through this pool: it
// needs pgx's stdlib driver (lib/pq cannot LISTEN through database/sql),
// and a pool that allows at least two open connections, because the
// listener holds one for as long as the relay runs. It implements
// [outboxdriver.Listener].
func (d *DB) CanListen() error {
	if drv, ok := d.db.Driver().(*stdlib.Driver); !ok || drv == nil {
		return fmt.Errorf("%w: LISTEN through database/sql needs pgx's stdlib driver; the driver %T cannot (use pgx's stdlib driver or pgxtx, or set RelayConfig.Listen to ListenOff)", outboxdriver.ErrUnsupported, d.db.Driver())
	}
	if n := d.db.Stats().MaxOpenConnections; n == 1 {
		return &outboxdriver.ConfigError{Field: "DB", Reason: "the *sql.DB allows 1 open connection (SetMaxOpenConns) and the relay's listener holds one for as long as it runs, leaving none for claims: allow at least 2 (plus what the application needs), or set RelayConfig.Listen to ListenOff"}
	}
	return nil
}

// ListenDB listens for notifications on a connection taken from the pool,
// which it discards afterwards. It needs pgx's stdlib driver; with any other
// driver it returns an error wrapping [outboxdriver.ErrUnsupported] and the relay
// polls only.
func (d *DB) ListenDB(ctx context.Context, listenSQL string, wake func(payload string)) error {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("%w: LISTEN through database/sql needs pgx's stdlib driver, not %T", outboxdriver.ErrUnsupported, dc)
		}
		// The connection is listening: never give it back to the pool.
		return errors.Join(pglisten.Run(ctx, sc.Conn(), listenSQL, wake), driver.ErrBadConn)
	})
	if errors.Is(err, outboxdriver.ErrUnsupported) {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

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
