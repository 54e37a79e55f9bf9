package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/oncommit/oncommit/internal/backoff"
	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// SQLite has one writer at a time and no SKIP LOCKED: each claim is one
// UPDATE ... RETURNING, and a write statement takes the database's write lock
// before it reads, so claims by any number of relays (goroutines or
// processes) on one file are serialised and never overlap. The due rows are
// picked by a LIMIT subquery that SQLite evaluates once; it returns their
// rowids, which the UPDATE finds directly in the table (the ids would take
// a search of the primary key index first). Lists (topics,
// fences) travel as one JSON text parameter read with json_each.

// claimText returns the claim statement for table t: ?1 topics (JSON array),
// ?2 limit, ?3 lease in milliseconds, ?4 max attempts.
func claimText(t outboxdriver.Table) string { return claimSQL(t, true, false) }

// claimAllSQL is claimText for a claim of every topic (a relay with a
// catch-all handler): no topic filter (?1 is not read). The claim index,
// (available_at, id), does not lead with the topic: both forms read it
// in claim order.
func claimAllSQL(t outboxdriver.Table) string { return claimSQL(t, false, false) }

// claimSQL is claimText (claimAllSQL without byTopic), returning also each
// row's key_seq (0 for an unordered row) when ordered: the claim of
// ClaimOrdered.
func claimSQL(t outboxdriver.Table, byTopic, ordered bool) string {
	tbl := quoteTable(t)
	keySeq := ""
	if ordered {
		keySeq = ", coalesce(key_seq, 0)"
	}
	topics := `
      AND topic IN (SELECT value FROM json_each(?1))`
	if !byTopic {
		topics = ""
	}
	// spent: the row had its ?4 attempts since its last redrive.
	const spent = `attempts - attempts_base >= ?4`
	return `UPDATE ` + tbl + ` SET
    state        = CASE WHEN ` + spent + ` THEN 'dead' ELSE 'processing' END,
    settled_at   = CASE WHEN ` + spent + ` THEN ` + now + ` END,
    last_error   = CASE WHEN ` + spent + ` THEN 'max attempts reached' ELSE last_error END,
    available_at = CASE WHEN ` + spent + ` THEN available_at ELSE ` + now + ` + ?3 END,
    attempts     = CASE WHEN ` + spent + ` THEN attempts ELSE attempts + 1 END
WHERE rowid IN (
    SELECT rowid FROM ` + tbl + `
    WHERE state IN ('pending', 'processing') AND available_at <= ` + now + topics + `
    ORDER BY available_at, id
    LIMIT ?2)
RETURNING id, topic, coalesce(message_key, ''), payload, headers, attempts, attempts_base, state, created_at` + keySeq
}

// relayDB returns db as the relay's statements run on it: prepared, when db
// can (SQLite parses a statement in the caller's process, and the claim and
// settle statements are long, so parsing each of them once saves a fifth
// of the claim's cost), and started over when SQLite answers SQLITE_BUSY.
func relayDB(db outboxdriver.DB) outboxdriver.DB {
	run := db.QueryDB
	if p, ok := db.(outboxdriver.PreparedDB); ok {
		run = p.QueryPrepared
	}
	return retryDB(run)
}

// retryDB runs each statement with run, again while it fails with
// SQLITE_BUSY, after a pause of a few milliseconds, until ctx ends (its
// error then wraps ctx.Err()).
//
// Each relay statement runs alone, in autocommit, so one that failed with
// SQLITE_BUSY changed nothing and can run again. SQLite's lock has no
// queue: a waiting connection polls it, at intervals that grow to 100 ms
// (SQLite's busy handler), and under sustained writes a connection that
// has waited long polls least often and can wait out the whole busy
// timeout while others take the lock. Starting over restarts the polls at
// 1 ms, and the relay keeps its claims, outcomes and renewals coming for
// as long as its command timeout allows, rather than failing them.
type retryDB func(ctx context.Context, query string, args ...any) (outboxdriver.Rows, error)

func (run retryDB) QueryDB(ctx context.Context, query string, args ...any) (outboxdriver.Rows, error) {
	for attempt := 1; ; attempt++ {
		rows, err := run(ctx, query, args...)
		if err == nil || !busy(err) {
			return rows, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-time.After(busyPause.Delay(attempt)):
		}
	}
}

// busyPause is the pause before a relay statement runs again after
// SQLITE_BUSY: short, since the busy timeout has been waited out already
// (or SQLite answered at once where waiting could deadlock).
var busyPause = backoff.Policy{Base: time.Millisecond, Cap: 20 * time.Millisecond, Jitter: 1}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only strings and numbers are marshalled here
	}
	return string(b)
}

// relayTexts caches the relay's statements per table (built once, not on
// every claim, settle and renewal).
type relayTexts struct {
	claim  *sqlbuild.Texts[[2]string] // claimText, claimAllSQL
	settle *sqlbuild.Texts[settleTexts]
	renew  *sqlbuild.Texts[string]
	purge  *sqlbuild.Texts[string]
}

// settleTexts are settleSQL's statements.
type settleTexts struct {
	deleteDone, markDelivered, retry, markDead, deleteDead string
}

func newTexts() relayTexts {
	return relayTexts{
		claim: sqlbuild.NewTexts(func(t outboxdriver.Table) [2]string { return [2]string{claimText(t), claimAllSQL(t)} }),
		settle: sqlbuild.NewTexts(func(t outboxdriver.Table) (st settleTexts) {
			st.deleteDone, st.markDelivered, st.retry, st.markDead, st.deleteDead = settleSQL(t)
			return st
		}),
		renew: sqlbuild.NewTexts(renewSQL),
		purge: sqlbuild.NewTexts(purgeSQL),
	}
}

// Claim settles p.Done, then claims, as two statements: on SQLite a commit
// is cheap (WAL), and each statement takes the write lock on its own, so
// there is nothing to gain from one transaction for both.
func (d *dialect) Claim(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	db = relayDB(db)
	done, err := d.carried(ctx, db, t, p)
	if err != nil {
		return nil, nil, err
	}
	q := d.texts.claim.Get(t)[0]
	if p.AllTopics {
		q = d.texts.claim.Get(t)[1]
	}
	claimed, err := d.claimWith(ctx, db, q, p, false)
	return claimed, done, d.Classify(err)
}

// carried settles the successes a claim carries (p.Done).
func (d *dialect) carried(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.ClaimParams) ([]outboxdriver.Fence, error) {
	if len(p.Done) == 0 {
		return nil, nil
	}
	done, err := d.settleKind(ctx, db, t, outboxdriver.SettleParams{KeepDelivered: p.KeepDelivered}, outboxdriver.SettleDone, sqlbuild.Successes(p.Done))
	return done, d.Classify(err)
}

// claimWith runs claim statement q (claimSQL's, with key_seq when
// ordered) and scans the rows it claimed.
func (d *dialect) claimWith(ctx context.Context, db outboxdriver.DB, q string, p outboxdriver.ClaimParams, ordered bool) ([]outboxdriver.Claimed, error) {
	topics := jsonText(p.Topics)
	if p.AllTopics {
		topics = "[]" // not read
	}
	rows, err := db.QueryDB(ctx, q, topics, p.Limit, p.Lease.Milliseconds(), p.MaxAttempts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	// Scanned in place, through variables declared once.
	out := make([]outboxdriver.Claimed, 0, p.Limit)
	var c outboxdriver.Claimed
	var id, state string
	var created int64
	dest := []any{&id, &c.Topic, &c.Key, &c.Payload, &c.Headers, &c.Attempts, &c.AttemptsBase, &state, &created}
	if ordered {
		dest = append(dest, &c.KeySeq)
	}
	for rows.Next() {
		c = outboxdriver.Claimed{}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if c.ID, err = outboxdriver.ParseID(id); err != nil {
			return nil, err
		}
		c.CreatedAt = time.UnixMilli(created).UTC()
		c.Dead = state == string(outboxdriver.StateDead)
		out = append(out, c)
	}
	return out, rows.Err()
}

// settleRows is the JSON form of settlements: [id, attempts, delay ms,
// at ms or null, error] per row.
func settleRows(s []outboxdriver.Settlement) string {
	rows := make([][]any, len(s))
	for i, x := range s {
		var at any
		if !x.At.IsZero() {
			at = x.At.UnixMilli()
		}
		rows[i] = []any{x.ID.String(), x.Attempts, x.Delay.Milliseconds(), at, x.Error}
	}
	return jsonText(rows)
}

// values unpacks settleRows as a table v(id, attempts, delay, at, err).
const values = `(SELECT value->>0 AS id, value->>1 AS attempts, value->>2 AS delay, value->>3 AS at, value->>4 AS err FROM json_each(?1)) AS v`

// settleSQL returns the fenced settle statements for table t, each over
// ?1, the settlements as a JSON array of [id, attempts, delay ms, at ms,
// error]: done (delete or mark delivered), retry, dead (mark or delete).
// The two deletes take instead ?1 the ids, as a JSON array, and ?2 the
// attempts all of them were claimed with: one statement per attempts value
// compares an integer per row, which costs a fifth of the delete less than
// matching "id:attempts" keys (and settlements mostly share their attempts).
func settleSQL(t outboxdriver.Table) (deleteDone, markDelivered, retry, markDead, deleteDead string) {
	tbl := quoteTable(t)
	const fence = ` WHERE o.id = v.id AND o.attempts = v.attempts AND o.state = 'processing' RETURNING id, attempts`
	const byAttempts = ` AND id IN (SELECT value FROM json_each(?1)) AND attempts = ?2 RETURNING id, attempts`
	deleteDone = `DELETE FROM ` + tbl + ` WHERE state = 'processing'` + byAttempts
	markDelivered = `UPDATE ` + tbl + ` AS o SET state = 'delivered', settled_at = ` + now + `, last_error = NULL FROM ` + values + fence
	retry = `UPDATE ` + tbl + ` AS o SET state = 'pending', last_error = v.err,
    available_at = CASE WHEN v.at IS NULL THEN ` + now + ` + v.delay ELSE max(` + now + `, v.at) END
FROM ` + values + fence
	markDead = `UPDATE ` + tbl + ` AS o SET state = 'dead', settled_at = ` + now + `, last_error = v.err FROM ` + values + fence
	deleteDead = `DELETE FROM ` + tbl + ` WHERE state IN ('processing', 'dead')` + byAttempts
	return
}

func (d *dialect) settleKind(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.SettleParams, kind outboxdriver.SettleKind, s []outboxdriver.Settlement) ([]outboxdriver.Fence, error) {
	st := d.texts.settle.Get(t)
	// The deletes take ids and one attempts value; the updates take a row
	// of values per settlement.
	var q string
	deletes := false
	switch {
	case kind == outboxdriver.SettleDone && p.KeepDelivered:
		q = st.markDelivered
	case kind == outboxdriver.SettleDone:
		q, deletes = st.deleteDone, true
	case kind == outboxdriver.SettleRetry:
		q = st.retry
	case p.DiscardDead:
		q, deletes = st.deleteDead, true
	default:
		q = st.markDead
	}
	if !deletes {
		return sqlbuild.Fences(ctx, db, q, settleRows(s))
	}
	var applied []outboxdriver.Fence
	for _, group := range sqlbuild.ByAttempts(s) {
		got, err := sqlbuild.Fences(ctx, db, q, idList(group), group[0].Attempts)
		applied = append(applied, got...)
		if err != nil {
			return applied, err
		}
	}
	return applied, nil
}

// idList is the JSON array of the ids of s, written directly: ids print as
// UUID text, which JSON strings hold as is.
func idList(s []outboxdriver.Settlement) string {
	var buf [36]byte
	var b strings.Builder
	b.Grow(2 + 39*len(s))
	b.WriteByte('[')
	for i, x := range s {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.Write(x.ID.AppendText(buf[:0]))
		b.WriteByte('"')
	}
	b.WriteByte(']')
	return b.String()
}

func (d *dialect) Settle(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.SettleParams, s []outboxdriver.Settlement) ([]outboxdriver.Fence, error) {
	db = relayDB(db)
	done, retry, dead := sqlbuild.ByKind(s)
	var applied []outboxdriver.Fence
	for _, group := range [][]outboxdriver.Settlement{done, retry, dead} {
		if len(group) == 0 {
			continue
		}
		got, err := d.settleKind(ctx, db, t, p, group[0].Kind, group)
		applied = append(applied, got...)
		if err != nil {
			return applied, fmt.Errorf("settle: %w", d.Classify(err))
		}
	}
	return applied, nil
}

// renewSQL returns the lease renewal: ?1 settlements as in settleSQL (only
// id and attempts are read), ?2 the lease in milliseconds.
func renewSQL(t outboxdriver.Table) string {
	return `UPDATE ` + quoteTable(t) + ` AS o SET available_at = ` + now + ` + ?2 FROM ` + values +
		` WHERE o.id = v.id AND o.attempts = v.attempts AND o.state = 'processing' RETURNING id, attempts`
}

func (d *dialect) Renew(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, lease time.Duration, held []outboxdriver.Fence) ([]outboxdriver.Fence, error) {
	kept, err := sqlbuild.Fences(ctx, relayDB(db), d.texts.renew.Get(t), settleRows(sqlbuild.Successes(held)), lease.Milliseconds())
	return kept, d.Classify(err)
}

// count runs a statement and counts the rows it returns.
func count(ctx context.Context, db outboxdriver.DB, q string, args ...any) (int64, error) {
	rows, err := db.QueryDB(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		n++
	}
	return n, rows.Err()
}

func (*dialect) Redrive(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, topic string) (int64, error) {
	// attempts stays: (id, attempts) fences one claim and must never repeat.
	return count(ctx, db, `UPDATE `+quoteTable(t)+` SET state = 'pending', attempts_base = attempts, available_at = `+now+`, settled_at = NULL, last_error = NULL
WHERE state = 'dead' AND (?1 = '' OR topic = ?1) RETURNING 1`, topic)
}

// purgeSQL returns one batch of a purge of table t: it deletes at most ?3
// rows in the states ?1 (a JSON array; only delivered and dead are ever
// deleted) settled more than ?2 milliseconds ago, found through the
// settled index, and returns a row for each. The LIMIT subquery is
// evaluated once, so the batch never exceeds it.
func purgeSQL(t outboxdriver.Table) string {
	tbl := quoteTable(t)
	return `DELETE FROM ` + tbl + ` WHERE rowid IN (
    SELECT rowid FROM ` + tbl + `
    WHERE state IN (SELECT value FROM json_each(?1)) AND state IN ('delivered', 'dead') AND settled_at < ` + now + ` - ?2
    LIMIT ?3)
RETURNING 1`
}

// Purge deletes in batches of sqlbuild.PurgeBatch rows, each one short
// statement in autocommit (see purgeSQL), until a batch deletes fewer or
// ctx ends: SQLite has one writer, and a purge of a large backlog in one
// statement would hold the write lock, and every publisher waiting on it,
// for as long as it runs; between batches publishers and claims take their
// turn. A batch that meets SQLITE_BUSY starts over, as the relay's
// statements do.
func (d *dialect) Purge(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, states []outboxdriver.State, olderThan time.Duration) (int64, error) {
	db = relayDB(db)
	q, list := d.texts.purge.Get(t), jsonText(sqlbuild.TerminalStates(states))
	n, err := sqlbuild.Batches(ctx, sqlbuild.PurgeBatch, func() (int64, error) {
		return count(ctx, db, q, list, olderThan.Milliseconds(), sqlbuild.PurgeBatch)
	})
	return n, d.Classify(err)
}

func (*dialect) Stats(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) ([]outboxdriver.TopicStats, error) {
	return sqlbuild.Stats(ctx, db, `SELECT topic, `+subscriberOf("message_key")+`,
    sum(state = 'pending'), sum(state = 'processing'), sum(state = 'delivered'), sum(state = 'dead'),
    sum(state = 'pending' AND available_at <= `+now+`),
    coalesce(`+now+` - min(CASE WHEN state = 'pending' AND available_at <= `+now+` THEN available_at END), 0)
FROM `+quoteTable(t)+` GROUP BY 1, 2 ORDER BY 1, 2`, time.Millisecond)
}

// subscriberOf is the subscriber of a copy whose stored key is column
// col (see outboxdriver.SubscriberKey), empty for another message.
func subscriberOf(col string) string {
	return `CASE WHEN instr(` + col + `, char(31)) > 0 THEN substr(` + col + `, 1, instr(` + col + `, char(31)) - 1) ELSE '' END`
}

// ListenSQL returns "": SQLite has no notifications; relays poll.
func (*dialect) ListenSQL(outboxdriver.Table) string { return "" }
