package outboxdriver

import (
	"errors"
	"fmt"
)

// Sentinel errors, shared by the outbox package (which re-exports each
// under the same name) and the dialects and adapters that return them.
// Match them with [errors.Is]; the error returned usually wraps one of these
// together with the driver's own error, so errors.As still finds the
// driver's type (for example *pgconn.PgError).
var (
	// ErrNilTx is returned by Publish when the transaction is nil, or is an
	// adapter around a nil *sql.Tx, pgx.Tx or *pgx.Conn. Nothing is sent.
	ErrNilTx = errors.New("outbox: nil transaction")

	// ErrNotInTransaction is returned by Publish when the connection handed
	// in is in autocommit mode (a *pgx.Conn with no open transaction). A
	// message written there would commit on its own, which is the bug the
	// outbox exists to remove. Nothing is sent.
	ErrNotInTransaction = errors.New("outbox: connection is not inside a transaction")

	// ErrTxDone is returned by Publish when the transaction has already been
	// committed or rolled back (database/sql's sql.ErrTxDone, pgx's
	// pgx.ErrTxClosed). The drivers detect this locally; nothing is sent.
	ErrTxDone = errors.New("outbox: transaction has already been committed or rolled back")

	// ErrTxAborted is returned by Publish when the transaction is in the
	// failed state after an earlier error (PostgreSQL SQLSTATE 25P02). It can
	// only be rolled back. For a *pgx.Conn this is detected before sending.
	ErrTxAborted = errors.New("outbox: transaction is aborted by an earlier error; roll it back")

	// ErrReadOnlyTx is returned by Publish when the database refuses the
	// INSERT because the transaction is read-only. The database aborts the
	// transaction when it reports this.
	ErrReadOnlyTx = errors.New("outbox: transaction is read-only")

	// ErrRetryTx is wrapped by the errors Publish returns when the database
	// refused the caller's transaction because of contention with another
	// one: a deadlock (PostgreSQL 40P01, MySQL 1213), a serialization
	// failure (40001), a lock that could not be had in time (55P03, MySQL
	// 1205), or a SQLite database that stayed busy. Roll the transaction
	// back (the database may already have) and run the whole transaction
	// again; nothing of it was stored.
	ErrRetryTx = errors.New("outbox: the database refused the transaction because of contention (deadlock, serialization failure, lock timeout, busy); roll it back and run the whole transaction again")

	// ErrTableMissing is returned when the outbox table does not exist: run
	// the migrations (see the migrations package). The database aborts the
	// transaction when it reports this.
	ErrTableMissing = errors.New("outbox: outbox table does not exist; run the migrations")

	// ErrSchemaMismatch is returned when the outbox table exists but lacks
	// columns this version needs (by [Relay.Run], which checks the table
	// before it claims, or by Publish): apply the newer migrations.
	ErrSchemaMismatch = errors.New("outbox: outbox table lacks columns this version needs; apply the newer migrations")

	// ErrInvalidConfig is wrapped by every [*ConfigError], returned by the outbox package's New and Relay and by the dialects' helpers.
	ErrInvalidConfig = errors.New("outbox: invalid configuration")

	// ErrUnsupported is returned by the outbox package's New and Relay when the
	// configuration asks for a capability that the dialect or the driver
	// does not have (for example NotifyOn on SQLite, or a relay's
	// Listen: ListenOn on lib/pq, which cannot LISTEN through database/sql).
	ErrUnsupported = errors.New("outbox: not supported")
)

// ConfigError reports an invalid configuration field (of the outbox
// package's Config or RelayConfig, or a dialect helper's argument). It wraps [ErrInvalidConfig].
type ConfigError struct {
	// Field names the offending field, such as "Table".
	Field string
	// Reason says what is wrong, in lower case.
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("outbox: invalid config: %s: %s", e.Field, e.Reason)
}

// Unwrap returns [ErrInvalidConfig].
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }
