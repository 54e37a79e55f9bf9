package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oncommit/oncommit/outboxdriver"
)

// Limits of an inbox record, checked before any SQL is sent.
const (
	// MaxInboxConsumerBytes bounds a consumer's name.
	MaxInboxConsumerBytes = 128
	// MaxInboxIDBytes bounds a message id (an outbox id is 36 bytes;
	// ids of other producers may be longer).
	MaxInboxIDBytes = 255
)

// DefaultInboxRetention is how long an Inbox keeps an id when
// InboxConfig.Retention is zero: seven days, Kafka's default log
// retention, longer than the redelivery horizon of the brokers we forward
// to with their defaults (docs/guide.md, "The receiving side").
const DefaultInboxRetention = 7 * 24 * time.Hour

// DefaultInboxPurgeBatch is how many ids one purge statement deletes when
// InboxConfig.PurgeBatch is zero.
const DefaultInboxPurgeBatch = 1000

// ErrInvalidRecord is wrapped by every [*RecordError].
var ErrInvalidRecord = errors.New("outbox: invalid inbox record")

// RecordError reports a consumer name or message id that the inbox
// refused before sending any SQL; the caller's transaction is untouched.
// It wraps [ErrInvalidRecord].
type RecordError struct {
	// Field is "Consumer" or "ID".
	Field string
	// Reason says what is wrong, in lower case.
	Reason string
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("outbox: invalid inbox record: %s: %s", e.Field, e.Reason)
}

// Unwrap returns [ErrInvalidRecord].
func (e *RecordError) Unwrap() error { return ErrInvalidRecord }

// InboxConfig configures an [Inbox].
type InboxConfig struct {
	// Table is the inbox table, as Config.Table for the outbox. Defaults
	// to DefaultInboxTable ("inbox"). Create it with the dialect's
	// MigrateInbox.
	Table string

	// Retention is how long an id is kept: Purge deletes older ones. It
	// must exceed the longest time after which the broker (or the relay)
	// can deliver the same message again, or a late redelivery would be
	// applied a second time. Defaults to DefaultInboxRetention.
	Retention time.Duration

	// PurgeBatch bounds the rows one purge statement deletes. Defaults to
	// DefaultInboxPurgeBatch.
	PurgeBatch int
}

// Inbox is the receiving side's half of effects once per message: in the
// consumer's own transaction, Record stores (consumer, message id) and
// tells whether the id is new, so the consumer's effect and the record
// commit or roll back together, and a redelivery changes nothing.
//
// Record sends one statement. Two consumers (different names) see the same
// id as new once each. A transaction that records an id another open
// transaction has recorded waits for that one to end: it then sees a
// repeat if the other committed, a new id if it rolled back. On
// PostgreSQL under REPEATABLE READ or SERIALIZABLE the waiting one fails
// instead, with an error wrapping [ErrRetryTx] (run the whole transaction
// again: it then sees a repeat); on SQLite a second writer waits for the
// write lock up to the busy timeout, then fails with [ErrRetryTx]. Under
// READ COMMITTED (PostgreSQL's default) the waiting transaction is not
// aborted. On MySQL and MariaDB neither is one waiter; when several wait
// for a transaction that rolls back, one records the id and InnoDB may end
// another with a deadlock ([ErrRetryTx]: its transaction is rolled back).
//
// An Inbox is safe for concurrent use.
type Inbox struct {
	d     outboxdriver.InboxDialect
	table Table
	cfg   InboxConfig
	sql   string // the record statement
}

// NewInbox returns an Inbox on d's database. d must keep an inbox (every
// dialect of this module does).
func NewInbox(d Dialect, cfg InboxConfig) (*Inbox, error) {
	if d == nil {
		return nil, &ConfigError{Field: "Dialect", Reason: "must not be nil"}
	}
	id, ok := d.(outboxdriver.InboxDialect)
	if !ok {
		return nil, fmt.Errorf("%w: dialect %s keeps no inbox", ErrUnsupported, d.Name())
	}
	if cfg.Table == "" {
		cfg.Table = outboxdriver.DefaultInboxTable
	}
	t, err := ParseTable(cfg.Table)
	if err != nil {
		return nil, err
	}
	if cfg.Retention < 0 {
		return nil, &ConfigError{Field: "Retention", Reason: "must not be negative"}
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultInboxRetention
	}
	if cfg.PurgeBatch < 0 {
		return nil, &ConfigError{Field: "PurgeBatch", Reason: "must not be negative"}
	}
	if cfg.PurgeBatch == 0 {
		cfg.PurgeBatch = DefaultInboxPurgeBatch
	}
	return &Inbox{d: id, table: t, cfg: cfg, sql: id.InboxRecordSQL(t)}, nil
}

// Table returns the inbox table.
func (ib *Inbox) Table() Table { return ib.table }

// RecordSQL returns the statement Record sends, with the consumer and the
// id as its two arguments; it changes one row for a new id and none for a
// repeat. For tests that pin the SQL (outboxtest.ExpectRecord).
func (ib *Inbox) RecordSQL() string { return ib.sql }

// Record stores (consumer, id) in tx and reports whether it was new: true
// the first time, false for a repeat, when the caller must skip the effect
// (and may commit or roll back: nothing was written). Apply the effect in
// the same tx and commit: the record and the effect are kept or lost
// together.
//
// An empty, over-long or non-UTF-8 consumer or id, or one holding a NUL
// byte, is refused with a [*RecordError] before any SQL is sent: tx stays
// usable. A tx whose adapter cannot count changed rows (not
// [outboxdriver.ExecCountTx]) is refused with [ErrUnsupported]. Database
// errors are classified as Publish's are ([ErrTxAborted], [ErrRetryTx],
// [ErrTableMissing], ...).
func (ib *Inbox) Record(ctx context.Context, tx Tx, consumer, id string) (bool, error) {
	if err := checkPair(consumer, id); err != nil {
		return false, err
	}
	if tx == nil {
		return false, wrapOp(ctx, "inbox record", ErrNilTx)
	}
	if err := tx.CheckTx(); err != nil {
		return false, wrapOp(ctx, "inbox record", err)
	}
	ct, ok := tx.(outboxdriver.ExecCountTx)
	if !ok {
		return false, fmt.Errorf("%w: inbox record: the transaction's adapter (%T) cannot count changed rows (outboxdriver.ExecCountTx)", ErrUnsupported, tx)
	}
	n, err := ct.ExecCountTx(ctx, ib.sql, consumer, id)
	if err != nil {
		return false, wrapOp(ctx, "inbox record", ib.d.Classify(err))
	}
	return n > 0, nil
}

// ValidRecord reports whether Record accepts consumer and id (and so
// sends its statement): whether neither is empty, over-long, invalid
// UTF-8 or holding a NUL byte.
func ValidRecord(consumer, id string) bool {
	return checkPair(consumer, id) == nil
}

// checkPair checks a consumer and an id (see checkRecord).
func checkPair(consumer, id string) error {
	if err := checkRecord("Consumer", consumer, MaxInboxConsumerBytes); err != nil {
		return err
	}
	return checkRecord("ID", id, MaxInboxIDBytes)
}

// checkRecord refuses an empty, over-long or non-UTF-8 value, or one with
// a NUL byte (PostgreSQL's text refuses it).
func checkRecord(field, v string, max int) error {
	switch {
	case v == "":
		return &RecordError{Field: field, Reason: "must not be empty"}
	case len(v) > max:
		return &RecordError{Field: field, Reason: fmt.Sprintf("is %d bytes, more than %d", len(v), max)}
	case !utf8.ValidString(v):
		return &RecordError{Field: field, Reason: "is not valid UTF-8"}
	case strings.IndexByte(v, 0) >= 0:
		return &RecordError{Field: field, Reason: "holds a NUL byte"}
	}
	return nil
}

// Receive runs effect once per (consumer, id): in a transaction of its own
// begun with b, it records the id; for a new one it calls effect with the
// transaction and commits; for a repeat it rolls back without calling
// effect and returns false. When effect fails, or the commit does, nothing
// is kept (the id stays new) and the error is returned: the caller leaves
// the message unacknowledged, and its redelivery runs effect again.
func Receive[T any](ctx context.Context, ib *Inbox, b outboxdriver.Beginner[T], consumer, id string, effect func(ctx context.Context, tx T) error) (applied bool, err error) {
	if err := checkPair(consumer, id); err != nil {
		return false, err
	}
	tx, fresh, err := begin(ctx, ib, b, consumer, id)
	if err != nil || !fresh {
		return false, err
	}
	done := false
	defer func() {
		if !done {
			_ = b.Rollback(context.WithoutCancel(ctx), tx)
		}
	}()
	if err := effect(ctx, tx); err != nil {
		return false, err
	}
	done = true
	if err := b.Commit(ctx, tx); err != nil {
		return false, wrapOp(ctx, "inbox receive", ib.d.Classify(err))
	}
	return true, nil
}

// begin begins Receive's transaction and records the id in it: in the
// round trip of BEGIN where the Beginner and the dialect can
// (BeginnerWith, InboxBeginDialect: pgx on PostgreSQL), else with Record.
// It returns a transaction only for a new id; for a repeat, and on error,
// the transaction has ended.
func begin[T any](ctx context.Context, ib *Inbox, b outboxdriver.Beginner[T], consumer, id string) (tx T, fresh bool, err error) {
	bw, okb := b.(outboxdriver.BeginnerWith[T])
	lit, okd := ib.d.(outboxdriver.InboxBeginDialect)
	if okb && okd {
		tx, err = bw.BeginWith(ctx, lit.InboxRecordLiteral(ib.table, consumer, id))
		switch {
		case err == nil:
			return tx, true, nil
		case lit.IsInboxRepeat(err):
			return tx, false, nil
		default:
			return tx, false, wrapOp(ctx, "inbox receive", ib.d.Classify(err))
		}
	}
	if tx, err = b.Begin(ctx); err != nil {
		return tx, false, wrapOp(ctx, "inbox receive", ib.d.Classify(err))
	}
	if fresh, err = ib.Record(ctx, b.Tx(tx), consumer, id); err != nil || !fresh {
		_ = b.Rollback(context.WithoutCancel(ctx), tx)
		return tx, false, err
	}
	return tx, true, nil
}

// InboxHandler returns a relay [Handler] that applies a message's local
// effect once per message id, even when the relay delivers it again (a
// crash after the effect committed, a lapsed lease): each delivery runs
// [Receive] with the message's id under consumer's name, and a repeat is a
// success without calling effect. effect's error is the handler's (retried
// with backoff, or dead-lettered as usual).
func InboxHandler[T any](ib *Inbox, b outboxdriver.Beginner[T], consumer string, effect func(ctx context.Context, tx T, d Delivery) error) Handler {
	return func(ctx context.Context, d Delivery) error {
		_, err := Receive(ctx, ib, b, consumer, d.ID.String(), func(ctx context.Context, tx T) error {
			return effect(ctx, tx, d)
		})
		return err
	}
}

// Purge deletes the ids received more than the retention ago, in
// statements of at most InboxConfig.PurgeBatch rows each (each its own
// short transaction, so a large purge holds no long lock), and returns how
// many it deleted. db must report changed rows ([outboxdriver.ExecDB]): the
// adapters' DBs do. Run it periodically (the janitor of a relay does not).
func (ib *Inbox) Purge(ctx context.Context, db DB) (int64, error) {
	return ib.purge(ctx, db, ib.cfg.Retention)
}

func (ib *Inbox) purge(ctx context.Context, db DB, age time.Duration) (int64, error) {
	ex, ok := db.(outboxdriver.ExecDB)
	if !ok {
		return 0, fmt.Errorf("%w: inbox purge: the DB (%T) cannot count changed rows (outboxdriver.ExecDB)", ErrUnsupported, db)
	}
	q := ib.d.InboxPurgeSQL(ib.table)
	args := ib.d.InboxPurgeArgs(age, ib.cfg.PurgeBatch)
	var total int64
	for {
		n, err := ex.ExecDB(ctx, q, args...)
		total += n
		if err != nil {
			return total, wrapOp(ctx, "inbox purge", ib.d.Classify(err))
		}
		if n < int64(ib.cfg.PurgeBatch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, wrapOp(ctx, "inbox purge", err)
		}
	}
}

// InboxStats describes the ids one consumer has recorded.
type InboxStats struct {
	Consumer string
	// Count is the number of ids kept.
	Count int64
	// Oldest is when the oldest kept id was recorded, on the database
	// clock: a purge that keeps up holds it near now minus the retention.
	Oldest time.Time
}

// Stats returns, per consumer, the ids the inbox keeps, by consumer name.
// It counts every row: run it as an operation, not per message.
func (ib *Inbox) Stats(ctx context.Context, db DB) ([]InboxStats, error) {
	rows, err := db.QueryDB(ctx, ib.d.InboxStatsSQL(ib.table))
	if err != nil {
		return nil, wrapOp(ctx, "inbox stats", ib.d.Classify(err))
	}
	defer rows.Close()
	var out []InboxStats
	for rows.Next() {
		var s InboxStats
		var oldest int64
		if err := rows.Scan(&s.Consumer, &s.Count, &oldest); err != nil {
			return nil, wrapOp(ctx, "inbox stats", err)
		}
		s.Oldest = time.UnixMicro(oldest)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, wrapOp(ctx, "inbox stats", ib.d.Classify(err))
	}
	return out, nil
}
