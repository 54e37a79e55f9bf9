// Package postgres is the PostgreSQL dialect of oncommit: all of its SQL text.
//
// Publish stores a message with one INSERT ... ON CONFLICT DO NOTHING on the
// caller's transaction (a duplicate DedupKey is skipped, never an error that
// would abort the transaction), with pg_notify folded into the same statement
// when notifications are on: PostgreSQL delivers the notification only if the
// transaction commits. Times come from the database clock (now()).
//
// Use it with database/sql (lib/pq or pgx's stdlib driver, through
// adapters/sqltx) or with pgx v5 (through adapters/pgxtx).
package postgres

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// maxParams is PostgreSQL's limit of bind parameters in one statement.
const maxParams = 65535

// paramsPerRow is the most parameters one inserted row uses: id, topic,
// key, payload, headers, dedup key, and a delay or not-before time.
const paramsPerRow = 7

// Dialect returns the PostgreSQL dialect.
func Dialect() outboxdriver.Dialect { return &dialect{insert: newInsert(), texts: newTexts()} }

type dialect struct {
	insert  *sqlbuild.Insert
	texts   relayTexts
	literal literalClaims
}

func (*dialect) Name() string { return "postgres" }

func (*dialect) Capabilities() outboxdriver.Capabilities {
	// MinLease: the relay's floor. A renewal is one short statement that
	// waits only for the row locks of the relay's own short statements.
	return outboxdriver.Capabilities{Notify: true, MaxParams: maxParams, ParamsPerRow: paramsPerRow, Ordered: true, AllTopics: true, AsyncCommit: true, MinLease: time.Second}
}

// quoteTable returns t as a quoted, possibly schema-qualified, identifier.
func quoteTable(t outboxdriver.Table) string {
	if t.Schema == "" {
		return `"` + t.Name + `"`
	}
	return `"` + t.Schema + `"."` + t.Name + `"`
}

// channel returns the notification channel of table t: its name as written
// in the outbox package's Config.Table. One fixed channel per table keeps NOTIFY payloads
// constant and avoids channel-name collisions between topics.
func channel(t outboxdriver.Table) string { return t.String() }

// Insert builds the publish statement. Without notify, for one message
// with a key, a payload and a DedupKey:
//
//	INSERT INTO "outbox" (id, topic, message_key, payload, dedup_key) VALUES ($1, $2, $3, $4, $5)
//	ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING RETURNING id::text
//
// Only the columns some message sets are listed. The ON CONFLICT and
// RETURNING clauses are present only when some message has a DedupKey;
// without one no row can conflict, every row is stored or the statement
// fails, and a plain INSERT is cheaper. available_at is left to its
// default, now(), unless some message is scheduled: then it is now() for an
// immediate message, now() + make_interval(secs => $n) for a Delay, and
// greatest(now(), $n) for a NotBefore, with these parameters after all the
// column parameters.
//
// With wake.Send the INSERT becomes a CTE and the statement calls pg_notify
// with the channel and wake.Payload (empty unless the Outbox coalesces its
// notifications): one notification per transaction, on one channel per
// table:
//
//	WITH ins AS (INSERT ... RETURNING id::text) SELECT ins.id FROM pg_notify('outbox', ''), ins
//	WITH ins AS (INSERT ...) SELECT FROM pg_notify('outbox', '')          -- no DedupKey
//
// A batch with ordered rows (Row.Ordered) is stored with orderedInsertSQL
// instead, a batch of one ordered row without a DedupKey with
// orderedInsertOneSQL.
func (d *dialect) Insert(t outboxdriver.Table, rows []outboxdriver.Row, wake outboxdriver.Wake) (string, []any) {
	if hasOrdered(rows) {
		return d.insertOrdered(t, rows, wake)
	}
	return d.insert.Build(quoteTable(t), t, rows, wake, jsonText)
}

// jsonText passes JSON as text, which every driver sends in a form jsonb
// accepts (lib/pq would send []byte as bytea).
func jsonText(b []byte) any { return string(b) }

func newInsert() *sqlbuild.Insert {
	return &sqlbuild.Insert{
		Placeholder: func(b *strings.Builder, n int) {
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
		},
		Now: "now()",
		Delay: func(b *strings.Builder, p func()) {
			b.WriteString("now() + make_interval(secs => ")
			p()
			b.WriteByte(')')
		},
		NotBefore: func(b *strings.Builder, p func()) {
			b.WriteString("greatest(now(), ")
			p()
			b.WriteString("::timestamptz)")
		},
		DelayArg:     func(r *outboxdriver.Row) any { return r.Delay.Seconds() },
		NotBeforeArg: func(r *outboxdriver.Row) any { return r.NotBefore },
		OnConflict:   ` ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING`,
		Returning:    ` RETURNING id::text`,
		Notify: func(b *strings.Builder, insert string, t outboxdriver.Table, returning bool, payload string) {
			b.WriteString("WITH ins AS (")
			b.WriteString(insert)
			if returning {
				b.WriteString(") SELECT ins.id FROM pg_notify(")
			} else {
				b.WriteString(") SELECT FROM pg_notify(")
			}
			b.WriteString(quoteLiteral(channel(t)))
			b.WriteString(", ")
			b.WriteString(quoteLiteral(payload))
			b.WriteByte(')')
			if returning {
				b.WriteString(", ins")
			}
		},
	}
}

// quoteLiteral quotes s as an SQL string literal. s is a validated table
// name, but quote properly all the same.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// sqlStater is implemented by *pgconn.PgError (pgx, pgx stdlib) and
// *pq.Error (lib/pq).
type sqlStater interface{ SQLState() string }

// Classify maps PostgreSQL errors to the outbox sentinels by SQLSTATE.
func (*dialect) Classify(err error) error {
	var se sqlStater
	if err == nil || !errors.As(err, &se) {
		return err
	}
	var sentinel error
	switch se.SQLState() {
	case "25P02": // in_failed_sql_transaction
		sentinel = outboxdriver.ErrTxAborted
	case "25006": // read_only_sql_transaction
		sentinel = outboxdriver.ErrReadOnlyTx
	case "42P01": // undefined_table
		sentinel = outboxdriver.ErrTableMissing
	case "42703": // undefined_column
		sentinel = outboxdriver.ErrSchemaMismatch
	case "40001", "40P01", "55P03": // serialization_failure, deadlock_detected, lock_not_available
		sentinel = outboxdriver.ErrRetryTx
	default:
		return err
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}
