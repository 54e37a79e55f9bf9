package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Match them with [errors.Is]; the error returned usually wraps
// one of these together with the driver's own error, so errors.As still finds
// the driver's type (for example *pgconn.PgError).
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

	// ErrInvalidMessage is wrapped by every [*MessageError]. Publish returns
	// it before sending anything, so the caller's transaction stays usable.
	ErrInvalidMessage = errors.New("outbox: invalid message")

	// ErrInvalidConfig is wrapped by every [*ConfigError], returned by [New].
	ErrInvalidConfig = errors.New("outbox: invalid configuration")

	// ErrUnsupported is returned by [New] and [Outbox.Relay] when the
	// configuration asks for a capability that the dialect or the driver
	// does not have (for example NotifyOn on SQLite, or a relay's
	// Listen: NotifyOn on lib/pq, which cannot LISTEN through database/sql).
	ErrUnsupported = errors.New("outbox: not supported")
)

// prefix starts the text of every error the outbox returns, once.
const prefix = "outbox: "

// opError is an error of one operation ("publish", "claim"...): its text
// is "outbox: op: ", the context's error when the context ended, and the
// text of err without err's own "outbox: ", so the prefix is said once
// however the errors nest.
type opError struct {
	op     string
	ctxErr error // context.DeadlineExceeded or context.Canceled, or nil
	err    error
}

func (e *opError) Error() string {
	s := prefix + e.op + ": "
	if e.ctxErr != nil {
		s += e.ctxErr.Error() + ": "
	}
	return s + strings.TrimPrefix(e.err.Error(), prefix)
}

func (e *opError) Unwrap() []error {
	if e.ctxErr == nil {
		return []error{e.err}
	}
	return []error{e.ctxErr, e.err}
}

// wrapOp returns err as an error of operation op. When ctx has ended and
// err does not say so, the error also wraps ctx's error, so callers can
// test errors.Is(err, context.DeadlineExceeded).
func wrapOp(ctx context.Context, op string, err error) error {
	e := &opError{op: op, err: err}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		e.ctxErr = cerr
	}
	return e
}

// MessageError reports a message that Publish refused before sending any SQL.
// It wraps [ErrInvalidMessage].
type MessageError struct {
	// Index is the position of the message in the batch (0 for Publish), or
	// -1 when the batch as a whole is refused (too many messages).
	Index int
	// Field names the offending field of [Message], such as "Topic".
	Field string
	// Reason says what is wrong, in lower case.
	Reason string
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("outbox: invalid message %d: %s: %s", e.Index, e.Field, e.Reason)
}

// Unwrap returns [ErrInvalidMessage].
func (e *MessageError) Unwrap() error { return ErrInvalidMessage }

// ConfigError reports an invalid field of [Config]. It wraps [ErrInvalidConfig].
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
