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
	"sync"

	"github.com/oncommit/oncommit/outbox"
)

// MaxParams is PostgreSQL's limit of bind parameters in one statement.
const MaxParams = 65535

// paramsPerRow is the most parameters one inserted row uses: id, topic,
// key, payload, headers, dedup key, and a delay or not-before time.
const paramsPerRow = 7

// Dialect returns the PostgreSQL dialect.
func Dialect() outbox.Dialect { return &dialect{} }

type dialect struct {
	// stmts caches the text of statements whose rows are all immediate,
	// keyed by stmtKey: a batch of n such rows always has the same text.
	stmts sync.Map
}

type stmtKey struct {
	table         outbox.Table
	n             int
	dedup, notify bool
}

func (*dialect) Name() string { return "postgres" }

func (*dialect) Capabilities() outbox.Capabilities {
	return outbox.Capabilities{Notify: true, SkipLocked: true, MaxParams: MaxParams, ParamsPerRow: paramsPerRow}
}

// QuoteTable returns t as a quoted, possibly schema-qualified, identifier.
func QuoteTable(t outbox.Table) string {
	if t.Schema == "" {
		return `"` + t.Name + `"`
	}
	return `"` + t.Schema + `"."` + t.Name + `"`
}

// Channel returns the notification channel of table t: its name as written
// in outbox.Config.Table. One fixed channel per table keeps NOTIFY payloads
// constant and avoids channel-name collisions between topics.
func Channel(t outbox.Table) string { return t.String() }

const insertColumns = ` (id, topic, message_key, payload, headers, dedup_key, available_at) VALUES `

const onConflict = ` ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING RETURNING id`

// Insert builds the publish statement. Without notify:
//
//	INSERT INTO "outbox" (id, topic, message_key, payload, headers, dedup_key, available_at)
//	VALUES ($1, $2, $3, $4, $5, $6, now()), ...
//	ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING RETURNING id::text
//
// The ON CONFLICT clause is present only when some row has a DedupKey;
// without one no row can conflict, and a plain INSERT is cheaper.
//
// With notify the INSERT becomes a CTE and the statement calls pg_notify
// with the channel and an empty payload: one notification per transaction,
// on one channel per table:
//
//	WITH ins AS (INSERT ... RETURNING id) SELECT ins.id::text FROM pg_notify('outbox', ''), ins
//
// available_at is now() for an immediate message, now() + make_interval(secs
// => $n) for a Delay, and greatest(now(), $n) for a NotBefore; these
// parameters come after the six column parameters of every row.
func (d *dialect) Insert(t outbox.Table, rows []outbox.Row, notify bool) (string, []any) {
	args := make([]any, 0, len(rows)*6)
	immediate, dedup := true, false
	for i := range rows {
		r := &rows[i]
		args = append(args, r.ID.String(), r.Topic, nullString(r.Key), nullBytes(r.Payload), nullBytes(r.Headers), nullString(r.DedupKey))
		immediate = immediate && r.Delay == 0 && r.NotBefore.IsZero()
		dedup = dedup || r.DedupKey != ""
	}
	if !immediate {
		return build(t, rows, dedup, notify, args)
	}
	key := stmtKey{t, len(rows), dedup, notify}
	if q, ok := d.stmts.Load(key); ok {
		return q.(string), args
	}
	q, args := build(t, rows, dedup, notify, args)
	d.stmts.Store(key, q)
	return q, args
}

// build writes the statement for rows; args holds their six column values
// each, and build appends the scheduling parameters.
func build(t outbox.Table, rows []outbox.Row, dedup, notify bool, args []any) (string, []any) {
	var b strings.Builder
	b.Grow(200 + 48*len(rows))
	if notify {
		b.WriteString("WITH ins AS (")
	}
	b.WriteString("INSERT INTO ")
	b.WriteString(QuoteTable(t))
	b.WriteString(insertColumns)
	// Parameters $1..$6n are the rows' columns, six a row; scheduling
	// parameters follow them, in row order.
	n, extra := 0, 6*len(rows)
	param := func(p *int) {
		*p++
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(*p))
	}
	for i := range rows {
		r := &rows[i]
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for c := range 6 {
			if c > 0 {
				b.WriteString(", ")
			}
			param(&n)
		}
		switch {
		case r.Delay > 0:
			b.WriteString(", now() + make_interval(secs => ")
			param(&extra)
			args = append(args, r.Delay.Seconds())
			b.WriteString("))")
		case !r.NotBefore.IsZero():
			b.WriteString(", greatest(now(), ")
			param(&extra)
			args = append(args, r.NotBefore)
			b.WriteString("::timestamptz))")
		default:
			b.WriteString(", now())")
		}
	}
	// Without a dedup key no row can conflict (ids are unique), so the
	// cheaper plain INSERT does; ON CONFLICT costs a speculative insertion
	// per row.
	if dedup {
		b.WriteString(onConflict)
	} else {
		b.WriteString(" RETURNING id")
	}
	if notify {
		b.WriteString(") SELECT ins.id::text FROM pg_notify(")
		b.WriteString(quoteLiteral(Channel(t)))
		b.WriteString(", ''), ins")
	} else {
		b.WriteString("::text")
	}
	return b.String(), args
}

// nullString maps "" to SQL NULL.
func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// nullBytes maps nil to SQL NULL and passes JSON as text, which every
// driver sends in a form jsonb accepts (lib/pq would send []byte as bytea).
func nullBytes(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
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
		sentinel = outbox.ErrTxAborted
	case "25006": // read_only_sql_transaction
		sentinel = outbox.ErrReadOnlyTx
	case "42P01": // undefined_table
		sentinel = outbox.ErrTableMissing
	default:
		return err
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}
