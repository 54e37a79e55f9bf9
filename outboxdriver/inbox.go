package outboxdriver

import (
	"context"
	"time"
)

// InboxDialect is implemented by a [Dialect] that keeps an inbox: the
// message ids each consumer has applied, recorded in the consumer's own
// transaction (see the outbox package's Inbox). Every dialect of this
// module implements it.
type InboxDialect interface {
	Dialect

	// InboxRecordSQL returns the one statement that records (consumer,
	// id), its arguments in that order, in table t: it stores the pair,
	// or leaves the table as it was when the pair is already there, without
	// an error. It changes one row for a new pair and none for a repeat
	// (the count [ExecCountTx] returns). A concurrent transaction that
	// recorded the same pair and has not ended makes it wait for that one.
	InboxRecordSQL(t Table) string

	// InboxPurgeSQL returns the statement that deletes at most limit rows
	// of t received more than age ago, the oldest first: arguments age
	// (a [time.Duration]) and limit, through InboxPurgeArgs. It reports the
	// rows it deleted as its changed rows ([ExecDB]).
	InboxPurgeSQL(t Table) string
	InboxPurgeArgs(age time.Duration, limit int) []any

	// InboxStatsSQL returns the statement that returns, per consumer of
	// t in consumer order, one row: consumer, the number of ids, and the
	// oldest received time in microseconds since the Unix epoch.
	InboxStatsSQL(t Table) string
}

// ExecCountTx is implemented by a [Tx] that can report how many rows a
// statement changed. The adapters' transactions (sqltx.Tx, pgxtx.Tx,
// pgxtx.Conn) implement it; the inbox needs it to tell a new id from a
// repeat in one statement on every database.
type ExecCountTx interface {
	// ExecCountTx runs one statement on the transaction and returns the
	// number of rows it changed. Errors are returned as the driver gave
	// them, as for ExecTx.
	ExecCountTx(ctx context.Context, query string, args ...any) (int64, error)
}

// Beginner begins and ends transactions of the driver's own type T (a
// *sql.Tx, a pgx.Tx), for the inbox helpers that run a consumer's effect
// in a transaction of their own (the outbox package's Receive and
// InboxHandler). sqltx.NewBeginner and pgxtx.NewBeginner return one.
type Beginner[T any] interface {
	// Begin begins a transaction.
	Begin(ctx context.Context) (T, error)
	// Tx returns tx as a [Tx], for the inbox's statement.
	Tx(tx T) Tx
	// Commit commits tx.
	Commit(ctx context.Context, tx T) error
	// Rollback rolls tx back; it is called at most once, and not after
	// Commit.
	Rollback(ctx context.Context, tx T) error
}

// InboxBeginDialect is implemented by an [InboxDialect] whose record can
// travel with the statement that begins the transaction, in one round
// trip (PostgreSQL's simple query protocol takes several statements): the
// outbox package's Receive then begins with [BeginnerWith.BeginWith].
type InboxBeginDialect interface {
	// InboxRecordLiteral returns an INSERT of (consumer, id) into t with
	// both as literals and no duplicate clause: a repeat fails with the
	// error IsInboxRepeat recognises. consumer and id are valid UTF-8
	// without NUL bytes.
	InboxRecordLiteral(t Table, consumer, id string) string
	// IsInboxRepeat reports whether err is that statement's duplicate-key
	// error.
	IsInboxRepeat(err error) bool
}

// BeginnerWith is implemented by a [Beginner] that can send a statement in
// the round trip that begins the transaction (pgxtx.Beginner).
type BeginnerWith[T any] interface {
	// BeginWith begins a transaction and runs stmt in it. When stmt fails
	// it rolls the transaction back and returns stmt's error.
	BeginWith(ctx context.Context, stmt string) (T, error)
}
