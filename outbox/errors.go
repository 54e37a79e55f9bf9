package outbox

import (
	"errors"
	"fmt"
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

	// ErrTableMissing is returned when the outbox table does not exist: run
	// the migrations (see the migrations package). The database aborts the
	// transaction when it reports this.
	ErrTableMissing = errors.New("outbox: outbox table does not exist; run the migrations")

	// ErrInvalidMessage is wrapped by every [*MessageError]. Publish returns
	// it before sending anything, so the caller's transaction stays usable.
	ErrInvalidMessage = errors.New("outbox: invalid message")

	// ErrInvalidConfig is wrapped by every [*ConfigError], returned by [New].
	ErrInvalidConfig = errors.New("outbox: invalid configuration")

	// ErrUnsupported is returned by [New] when the configuration asks for a
	// capability the dialect does not have (for example NotifyOn on SQLite).
	ErrUnsupported = errors.New("outbox: not supported by this dialect")
)

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
