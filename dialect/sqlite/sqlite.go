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
// as modernc.org/sqlite (no cgo). Open the database in WAL mode with a busy
// timeout, busy timeout first (the driver applies the pragmas in order, and
// switching a new file to WAL takes a lock that connections opening at the
// same time must wait for), for example
//
//	sql.Open("sqlite", "file:app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
//
// SQLite allows one writer at a time; ids are stored as the canonical UUID
// text of the message id, which sorts by time and reads back as
// [outbox.ID.String] prints it. Qualified table names ("schema.name") are
// not supported: use an unqualified name.
package sqlite

import (
	"strings"
	"time"

	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outbox"
)

// MaxParams is SQLite's default limit of bind parameters in one statement
// (SQLITE_MAX_VARIABLE_NUMBER since 3.32).
const MaxParams = 32766

// DefaultPollInterval is the relay's default poll interval on SQLite: with
// no notifications, a relay finds new messages only by polling.
const DefaultPollInterval = 100 * time.Millisecond

// now is the database clock as stored: integer milliseconds since the epoch.
const now = `CAST(unixepoch('subsec') * 1000 AS INTEGER)`

// Dialect returns the SQLite dialect.
func Dialect() outbox.Dialect {
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
		DelayArg:     func(r *outbox.Row) any { return r.Delay.Milliseconds() },
		NotBeforeArg: func(r *outbox.Row) any { return r.NotBefore.UnixMilli() },
		OnConflict:   ` ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING`,
		Returning:    ` RETURNING id`,
	}, texts: newTexts()}
}

type dialect struct {
	insert *sqlbuild.Insert
	texts  relayTexts
}

func (*dialect) Name() string { return "sqlite" }

func (*dialect) Capabilities() outbox.Capabilities {
	return outbox.Capabilities{MaxParams: MaxParams, ParamsPerRow: 7, PollInterval: DefaultPollInterval}
}

// QuoteTable returns t as a quoted identifier.
func QuoteTable(t outbox.Table) string {
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
func (d *dialect) Insert(t outbox.Table, rows []outbox.Row, _ outbox.Wake) (string, []any) {
	return d.insert.Build(QuoteTable(t), t, rows, outbox.Wake{}, func(b []byte) any { return string(b) })
}

// Classify returns err unchanged: SQLite reports these conditions only by
// message text, and oncommit does not match errors by text.
func (*dialect) Classify(err error) error { return err }
