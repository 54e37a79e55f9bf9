package outboxdriver

import "context"

// Tx is a transaction that the caller owns and outbox.Outbox.Publish enlists in.
//
// Build one with an adapter: sqltx.From(*sql.Tx) for database/sql, or
// pgxtx.From(pgx.Tx) and pgxtx.FromConn(*pgx.Conn) for pgx. The method names
// are chosen so that no pool or connection type of any driver satisfies Tx:
// *sql.DB, *sql.Conn, *pgxpool.Pool and *pgx.Conn cannot be passed where a
// Tx is required, because a message written through a pool would commit on
// its own.
//
// Publish calls CheckTx once and then ExecTx or QueryTx once (QueryTx when
// it needs the stored ids back, that is when a message has a DedupKey). On
// a dialect that implements [StoredLister] (MySQL), a Publish with a
// DedupKey calls ExecTx for the INSERT and then QueryTx for the stored ids.
// It never begins, commits or rolls back.
type Tx interface {
	// CheckTx reports, without sending anything to the database, whether
	// the transaction can take a statement. It returns nil when it cannot
	// tell; it returns ErrNilTx, ErrNotInTransaction, ErrTxDone or
	// ErrTxAborted when it knows.
	CheckTx() error

	// QueryTx runs one statement on the transaction and returns its rows.
	// Errors are returned as the driver gave them: Publish maps them
	// (through the dialect) to ErrTxDone, ErrTxAborted and the others.
	QueryTx(ctx context.Context, query string, args ...any) (Rows, error)

	// ExecTx runs one statement on the transaction, discarding any rows.
	// Errors are returned as the driver gave them, as for QueryTx.
	ExecTx(ctx context.Context, query string, args ...any) error
}

// Rows is the result of [Tx.QueryTx], the shape shared by database/sql and
// pgx rows.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}
