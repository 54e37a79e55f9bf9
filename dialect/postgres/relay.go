package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

// textArray writes ss as a PostgreSQL array literal, passed as one text
// parameter and cast to text[] in SQL: every driver sends a string, where
// a Go slice would need driver-specific wrapping (pq.Array).
func textArray(ss []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if s[j] == '"' || s[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// ClaimSQL returns the claim statement for table t. The due rows are chosen
// in a MATERIALIZED CTE: it is evaluated once, so its LIMIT holds whatever
// plan PostgreSQL picks; the IN (subquery ... LIMIT) form can be re-executed
// per outer row under a nested loop and, with SKIP LOCKED, return more rows
// than the limit.
//
// $1 topics (text[] literal), $2 limit, $3 lease in seconds, $4 max attempts.
func ClaimSQL(t outbox.Table) string {
	tbl := QuoteTable(t)
	return `WITH due AS MATERIALIZED (
    SELECT id FROM ` + tbl + `
    WHERE state IN ('pending', 'processing') AND available_at <= now() AND topic = ANY($1::text[])
    ORDER BY available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
UPDATE ` + tbl + ` AS o SET
    state        = CASE WHEN o.attempts >= $4 THEN 'dead' ELSE 'processing' END,
    attempts     = CASE WHEN o.attempts >= $4 THEN o.attempts ELSE o.attempts + 1 END,
    available_at = CASE WHEN o.attempts >= $4 THEN o.available_at ELSE now() + make_interval(secs => $3::float8) END,
    settled_at   = CASE WHEN o.attempts >= $4 THEN now() END,
    last_error   = CASE WHEN o.attempts >= $4 THEN 'max attempts reached' ELSE o.last_error END
FROM due WHERE o.id = due.id
RETURNING o.id::text, o.topic, o.message_key, o.payload::text, o.headers::text, o.attempts, o.state, o.created_at`
}

func (*dialect) Claim(ctx context.Context, db outbox.DB, t outbox.Table, p outbox.ClaimParams) ([]outbox.Claimed, error) {
	rows, err := db.QueryDB(ctx, ClaimSQL(t), textArray(p.Topics), p.Limit, p.Lease.Seconds(), p.MaxAttempts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []outbox.Claimed
	for rows.Next() {
		var c outbox.Claimed
		var id, state string
		var key sql.NullString
		if err := rows.Scan(&id, &c.Topic, &key, &c.Payload, &c.Headers, &c.Attempts, &state, &c.CreatedAt); err != nil {
			return nil, err
		}
		if c.ID, err = outbox.ParseID(id); err != nil {
			return nil, err
		}
		c.Key, c.Dead = key.String, state == string(outbox.StateDead)
		out = append(out, c)
	}
	return out, rows.Err()
}

// fenced runs a statement over a VALUES list of (id, attempts, extra...)
// rows, returning the (id, attempts) of the rows it changed. head is the
// statement up to the VALUES list, tail what follows it; extra are the
// SQL types of the extra columns, and args gives their values per row.
func fenced(ctx context.Context, db outbox.DB, head, tail string, first []any, fences []outbox.Fence, extra []string, args func(i int) []any) ([]outbox.Fence, error) {
	var b strings.Builder
	b.WriteString(head)
	params := append([]any(nil), first...)
	n := len(params)
	for i, f := range fences {
		if i > 0 {
			b.WriteString(", ")
		}
		n++
		b.WriteString("($" + strconv.Itoa(n) + "::uuid, ")
		n++
		b.WriteString("$" + strconv.Itoa(n) + "::integer")
		params = append(params, f.ID.String(), f.Attempts)
		var more []any
		if args != nil {
			more = args(i)
		}
		for j, typ := range extra {
			n++
			b.WriteString(", $" + strconv.Itoa(n) + "::" + typ)
			params = append(params, more[j])
		}
		b.WriteByte(')')
	}
	b.WriteString(tail)
	rows, err := db.QueryDB(ctx, b.String(), params...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []outbox.Fence
	for rows.Next() {
		var id string
		var f outbox.Fence
		if err := rows.Scan(&id, &f.Attempts); err != nil {
			return nil, err
		}
		if f.ID, err = outbox.ParseID(id); err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, rows.Err()
}

const fenceJoin = ` WHERE o.id = v.id AND o.attempts = v.attempts AND o.state = 'processing' RETURNING o.id::text, o.attempts`

func (*dialect) Settle(ctx context.Context, db outbox.DB, t outbox.Table, p outbox.SettleParams, s []outbox.Settlement) ([]outbox.Fence, error) {
	tbl := QuoteTable(t)
	var done, retry, dead []outbox.Settlement
	for _, x := range s {
		switch x.Kind {
		case outbox.SettleDone:
			done = append(done, x)
		case outbox.SettleRetry:
			retry = append(retry, x)
		case outbox.SettleDead:
			dead = append(dead, x)
		}
	}
	fences := func(xs []outbox.Settlement) []outbox.Fence {
		f := make([]outbox.Fence, len(xs))
		for i := range xs {
			f[i] = xs[i].Fence
		}
		return f
	}
	var applied []outbox.Fence
	run := func(xs []outbox.Settlement, head, tail string, extra []string, args func(i int) []any) error {
		if len(xs) == 0 {
			return nil
		}
		got, err := fenced(ctx, db, head, tail, nil, fences(xs), extra, args)
		applied = append(applied, got...)
		return err
	}
	var err error
	if p.KeepDelivered {
		err = run(done, `UPDATE `+tbl+` AS o SET state = 'delivered', settled_at = now(), last_error = NULL FROM (VALUES `,
			`) AS v(id, attempts)`+fenceJoin, nil, nil)
	} else {
		err = run(done, `DELETE FROM `+tbl+` AS o USING (VALUES `, `) AS v(id, attempts)`+fenceJoin, nil, nil)
	}
	if err != nil {
		return applied, fmt.Errorf("settle done: %w", err)
	}
	err = run(retry, `UPDATE `+tbl+` AS o SET state = 'pending', last_error = v.err,
    available_at = CASE WHEN v.at IS NULL THEN now() + make_interval(secs => v.delay) ELSE greatest(now(), v.at) END
FROM (VALUES `, `) AS v(id, attempts, delay, at, err)`+fenceJoin, []string{"float8", "timestamptz", "text"}, func(i int) []any {
		var at any
		if !retry[i].At.IsZero() {
			at = retry[i].At.UTC()
		}
		return []any{retry[i].Delay.Seconds(), at, retry[i].Error}
	})
	if err != nil {
		return applied, fmt.Errorf("settle retry: %w", err)
	}
	if p.DiscardDead {
		err = run(dead, `DELETE FROM `+tbl+` AS o USING (VALUES `,
			`) AS v(id, attempts) WHERE o.id = v.id AND o.attempts = v.attempts AND o.state IN ('processing', 'dead') RETURNING o.id::text, o.attempts`, nil, nil)
	} else {
		err = run(dead, `UPDATE `+tbl+` AS o SET state = 'dead', settled_at = now(), last_error = v.err FROM (VALUES `,
			`) AS v(id, attempts, err)`+fenceJoin, []string{"text"}, func(i int) []any { return []any{dead[i].Error} })
	}
	if err != nil {
		return applied, fmt.Errorf("settle dead: %w", err)
	}
	return applied, nil
}

func (*dialect) Renew(ctx context.Context, db outbox.DB, t outbox.Table, lease time.Duration, held []outbox.Fence) ([]outbox.Fence, error) {
	return fenced(ctx, db, `UPDATE `+QuoteTable(t)+` AS o SET available_at = now() + make_interval(secs => $1::float8) FROM (VALUES `,
		`) AS v(id, attempts)`+fenceJoin, []any{lease.Seconds()}, held, nil, nil)
}

// count runs a statement returning one integer.
func count(ctx context.Context, db outbox.DB, q string, args ...any) (int64, error) {
	rows, err := db.QueryDB(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		if err := rows.Scan(&n); err != nil {
			return 0, err
		}
	}
	return n, rows.Err()
}

func (*dialect) Redrive(ctx context.Context, db outbox.DB, t outbox.Table, topic string) (int64, error) {
	return count(ctx, db, `WITH r AS (UPDATE `+QuoteTable(t)+` SET state = 'pending', attempts = 0, available_at = now(), settled_at = NULL, last_error = NULL
    WHERE state = 'dead' AND ($1 = '' OR topic = $1) RETURNING 1) SELECT count(*) FROM r`, topic)
}

func (*dialect) Purge(ctx context.Context, db outbox.DB, t outbox.Table, states []outbox.State, olderThan time.Duration) (int64, error) {
	ss := make([]string, len(states))
	for i, s := range states {
		ss[i] = string(s)
	}
	return count(ctx, db, `WITH d AS (DELETE FROM `+QuoteTable(t)+`
    WHERE state = ANY($1::text[]) AND state IN ('delivered', 'dead') AND settled_at < now() - make_interval(secs => $2::float8) RETURNING 1)
SELECT count(*) FROM d`, textArray(ss), olderThan.Seconds())
}

func (*dialect) Stats(ctx context.Context, db outbox.DB, t outbox.Table) ([]outbox.TopicStats, error) {
	rows, err := db.QueryDB(ctx, `SELECT topic,
    count(*) FILTER (WHERE state = 'pending'),
    count(*) FILTER (WHERE state = 'processing'),
    count(*) FILTER (WHERE state = 'delivered'),
    count(*) FILTER (WHERE state = 'dead'),
    COALESCE(EXTRACT(EPOCH FROM now() - min(available_at) FILTER (WHERE state = 'pending' AND available_at <= now())), 0)::float8
FROM `+QuoteTable(t)+` GROUP BY topic ORDER BY topic`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []outbox.TopicStats
	for rows.Next() {
		var s outbox.TopicStats
		var age float64
		if err := rows.Scan(&s.Topic, &s.Pending, &s.Processing, &s.Delivered, &s.Dead, &age); err != nil {
			return nil, err
		}
		s.OldestPending = time.Duration(age * float64(time.Second))
		out = append(out, s)
	}
	return out, rows.Err()
}

// ListenSQL returns the LISTEN statement for table t's channel.
func (*dialect) ListenSQL(t outbox.Table) string {
	return `LISTEN "` + Channel(t) + `"`
}
