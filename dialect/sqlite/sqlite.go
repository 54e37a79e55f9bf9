// Package sqlite is the SQLite dialect of oncommit: all of its SQL text.
//
// SQLite is the embedded default: single-node services, tests, edge devices
// and the quick start, with no server. Publish stores a message with one
// INSERT ... ON CONFLICT DO NOTHING ... RETURNING on the caller's
// transaction, like on PostgreSQL; available_at comes from the database
// clock (unixepoch('subsec'), in integer milliseconds). SQLite has no
// notifications, so relays find messages by polling.
//
// Use it through database/sql and adapters/sqltx with a pure-Go driver such
// as modernc.org/sqlite (no cgo). Open the database with immediate
// transactions, a busy timeout and WAL mode:
//
//	sql.Open("sqlite", "file:app.db?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
//
// _txlock=immediate makes every read-write transaction begin with BEGIN
// IMMEDIATE, which takes the write lock at once, waiting up to the busy
// timeout for it. Without it a transaction that reads before it publishes
// fails with SQLITE_BUSY at once, without waiting, whenever another
// connection wrote since the read ([ErrBusy] says so); read-only
// transactions (sql.TxOptions{ReadOnly: true}) still begin deferred. The
// busy timeout comes first (the driver applies it before the other pragmas:
// switching a new file to WAL takes a lock that connections opening at the
// same time must wait for).
//
// SQLite allows one writer at a time, and its write lock has no queue: under
// sustained writes a connection can wait out the whole busy timeout. The
// relay's statements then run again until the relay's CommandTimeout ends;
// a renewal that waits past the lease loses it, so RelayConfig.Lease must be
// at least [MinLease] (15s, three times the recommended 5s busy timeout;
// the relay refuses less), and at least three times the busy timeout when
// that is longer (the default lease, 30s, is six times 5s). Ids are stored
// as the canonical UUID text of the message id, which sorts by time and
// reads back as [outboxdriver.ID.String] prints it. Qualified table names ("schema.name") are
// not supported: use an unqualified name.
package sqlite

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// maxParams is SQLite's default limit of bind parameters in one statement
// (SQLITE_MAX_VARIABLE_NUMBER since 3.32).
const maxParams = 32766

// DefaultPollInterval is the relay's default poll interval on SQLite: with
// no notifications, a relay finds new messages only by polling.
const DefaultPollInterval = 100 * time.Millisecond

// MinLease is the shortest RelayConfig.Lease a relay on SQLite accepts
// while it renews leases: three times the recommended busy timeout (5s).
// The relay sends a running handler's first renewal by the time half of
// its lease has passed; a renewal that waits out the whole busy timeout
// for the write lock still lands a sixth of the lease before the lease
// lapses. With a longer busy timeout, keep the lease at least three times
// it: the relay cannot see the busy timeout, which is the connection's.
const MinLease = 15 * time.Second

// now is the database clock as stored: integer milliseconds since the epoch.
const now = `CAST(unixepoch('subsec') * 1000 AS INTEGER)`

// Dialect returns the SQLite dialect.
func Dialect() outboxdriver.Dialect {
	return &dialect{insert: &sqlbuild.Insert{
		// Anonymous "?" placeholders (the builder lists arguments in text
		// order): the driver looks up each numbered or named parameter's
		// name in a list that grows with the statement, which makes binding
		// a batch of n rows cost n² steps; anonymous ones have no name.
		Placeholder: func(b *strings.Builder, _ int) { b.WriteByte('?') },
		Now:         now,
		Delay: func(b *strings.Builder, p func()) {
			b.WriteString(now + " + ")
			p()
		},
		NotBefore: func(b *strings.Builder, p func()) {
			b.WriteString("max(" + now + ", ")
			p()
			b.WriteByte(')')
		},
		DelayArg:     func(r *outboxdriver.Row) any { return r.Delay.Milliseconds() },
		NotBeforeArg: func(r *outboxdriver.Row) any { return r.NotBefore.UnixMilli() },
		OnConflict:   ` ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING`,
		Returning:    ` RETURNING id`,
		// Ordered rows are stored 'blocked'; migration 0004's trigger
		// numbers them (see ordered.go).
		OrderedBlocked: true,
	}, texts: newTexts()}
}

type dialect struct {
	insert *sqlbuild.Insert
	texts  relayTexts
}

func (*dialect) Name() string { return "sqlite" }

func (*dialect) Capabilities() outboxdriver.Capabilities {
	return outboxdriver.Capabilities{MaxParams: maxParams, ParamsPerRow: 7, PollInterval: DefaultPollInterval, AllTopics: true, Ordered: true, MinLease: MinLease}
}

// quoteTable returns t as a quoted identifier.
func quoteTable(t outboxdriver.Table) string {
	if t.Schema == "" {
		return `"` + t.Name + `"`
	}
	return `"` + t.Schema + `"."` + t.Name + `"`
}

// Insert builds the publish statement, for example
//
//	INSERT INTO "outbox" (id, topic, payload, dedup_key) VALUES (?, ?, ?, ?)
//	ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING RETURNING id
//
// listing only the columns some message sets, with the ON CONFLICT and
// RETURNING clauses only when some message has a DedupKey (without one,
// every row is stored or the statement fails), and available_at only when
// some message is scheduled (its default is the database clock).
func (d *dialect) Insert(t outboxdriver.Table, rows []outboxdriver.Row, _ outboxdriver.Wake) (string, []any) {
	return d.insert.Build(quoteTable(t), t, rows, outboxdriver.Wake{}, func(b []byte) any { return string(b) })
}

// ErrBusy is wrapped, with the driver's error, by the errors Publish and
// the relay's statements return when SQLite answers SQLITE_BUSY (or one of
// its extended codes, such as SQLITE_BUSY_SNAPSHOT): another connection held
// the write lock. Roll the transaction back and run it again.
//
// A transaction that reads before it writes gets it at once, whatever the
// busy timeout, unless it began with BEGIN IMMEDIATE: SQLite cannot upgrade
// a read to a write once another connection has written since the read
// began. Open the database with _txlock=immediate (see the package
// documentation) so that every read-write transaction takes the write lock
// when it begins, waiting up to the busy timeout. With it, ErrBusy means the
// lock stayed taken for longer than the busy timeout.
//
// It also wraps [outboxdriver.ErrRetryTx], the sentinel every dialect uses for
// "run the whole transaction again".
var ErrBusy error = busyError{}

type busyError struct{}

func (busyError) Error() string {
	return "outbox: SQLite database is busy (SQLITE_BUSY): roll back and retry the transaction; open the database with _txlock=immediate so that transactions wait for the write lock"
}

func (busyError) Is(target error) bool { return target == outboxdriver.ErrRetryTx }

// busy reports whether err is SQLITE_BUSY or one of its extended codes
// (the primary code is the low byte), from a driver whose errors tell their
// result code (modernc.org/sqlite's do).
func busy(err error) bool {
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code()&0xff == 5
}

// Classify wraps SQLITE_BUSY, from a driver whose errors tell their result
// code through a Code() int method (modernc.org/sqlite's *sqlite.Error
// does), with [ErrBusy]. Other errors are returned unchanged: SQLite reports
// a missing table or a read-only transaction only by message text, and
// oncommit does not match errors by text.
func (*dialect) Classify(err error) error {
	if err == nil || !busy(err) || errors.Is(err, ErrBusy) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrBusy, err)
}
