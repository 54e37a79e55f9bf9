package postgres

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds the SQL of ordered delivery (outboxdriver.OrderedDialect):
// the ordered publish, the claim of heads with their runs, the settle of
// runs, redrive, skip and stats.

var _ outboxdriver.OrderedDialect = (*dialect)(nil)

// keysTable is the quoted table of key sequences beside t.
func keysTable(t outboxdriver.Table) string { return quoteTable(outboxdriver.KeysTable(t)) }

// hasOrdered reports whether some row is ordered.
func hasOrdered(rows []outboxdriver.Row) bool {
	for i := range rows {
		if rows[i].Ordered {
			return true
		}
	}
	return false
}

// orderedDedup reports whether some ordered row has a DedupKey: then the
// publish takes two statements (see outboxdriver.OrderedDialect).
func orderedDedup(rows []outboxdriver.Row) bool {
	for i := range rows {
		if rows[i].Ordered && rows[i].DedupKey != "" {
			return true
		}
	}
	return false
}

// keysUpsert is the CTE k that takes the key rows of the ordered rows of
// v (v.ord > 0; v.n of them per key) in key order, adds their numbers to
// last_seq and live, and returns the new values: under the row lock,
// held to commit.
func keysUpsert(t outboxdriver.Table) string {
	return `k AS (
    INSERT INTO ` + keysTable(t) + ` AS ks (message_key, last_seq, live)
    SELECT v.k, max(v.n), max(v.n) FROM v WHERE v.ord > 0 GROUP BY v.k ORDER BY v.k
    ON CONFLICT (message_key) DO UPDATE SET last_seq = ks.last_seq + excluded.last_seq, live = ks.live + excluded.live
    RETURNING ks.message_key, ks.last_seq, ks.live)`
}

// orderedInsertSQL returns the publish statement of a batch with ordered
// rows, for table t. Its parameters are arrays, one element per message
// (so the text is the same whatever the batch): $1 ids, $2 topics, $3 keys,
// $4 payloads, $5 headers, $6 dedup keys, $7 delays in seconds, $8
// not-before times, $9 ord (the message's place among the batch's ordered
// messages of its key, from 1; 0 for an unordered one), $10 n (how many
// ordered messages of its key the batch has).
//
// With seq, the key rows are taken and the messages numbered in the same
// statement: a key's first message is its head (pending) when the key had
// no live message, the others are blocked. Without seq (an ordered message
// has a DedupKey), ordered messages are stored blocked without a key_seq,
// for SequenceSQL. dedup adds ON CONFLICT DO NOTHING RETURNING id::text;
// notify folds pg_notify(channel, payload) into the statement.
func orderedInsertSQL(t outboxdriver.Table, seq, dedup, notify bool, payload string) string {
	tbl := quoteTable(t)
	with := `WITH v AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::float8[], $8::timestamptz[], $9::integer[], $10::integer[])
    AS v(id, topic, k, payload, headers, dedup, delay, nb, ord, n))`
	keySeq, state, from := `NULL::bigint`, `CASE WHEN v.ord > 0 THEN 'blocked' ELSE 'pending' END`, ` FROM v`
	if seq {
		with += `,
` + keysUpsert(t)
		keySeq = `k.last_seq - v.n + v.ord`
		state = `CASE WHEN v.ord > 1 OR k.live > v.n THEN 'blocked' ELSE 'pending' END`
		from = ` FROM v LEFT JOIN k ON v.ord > 0 AND k.message_key = v.k`
	}
	ins := `INSERT INTO ` + tbl + ` (id, topic, message_key, payload, headers, dedup_key, available_at, key_seq, state)
SELECT v.id, v.topic, v.k, v.payload::jsonb, v.headers::jsonb, v.dedup,
    CASE WHEN v.nb IS NOT NULL THEN greatest(now(), v.nb) WHEN v.delay IS NOT NULL THEN now() + make_interval(secs => v.delay) ELSE now() END,
    ` + keySeq + `, ` + state + from
	if dedup {
		ins += `
ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING RETURNING id::text`
	}
	if !notify {
		return with + `
` + ins
	}
	q := with + `,
ins AS (` + ins + `)
SELECT `
	if dedup {
		q += `ins.id `
	}
	q += `FROM pg_notify(` + quoteLiteral(channel(t)) + `, ` + quoteLiteral(payload) + `)`
	if dedup {
		q += `, ins`
	}
	return q
}

// orderedInsertOneSQL returns the publish statement of a batch of one
// ordered message without a DedupKey (the common case: one event per
// transaction), for table t: orderedInsertSQL's statement with scalar
// parameters, $1 id, $2 topic, $3 key, $4 payload, $5 headers, $6 delay in
// seconds, $7 not-before time (NULL when absent). It takes the key row as
// orderedInsertSQL does (adding one to last_seq and live, under the row
// lock held to commit) and stores the message as its key's head (pending)
// when the key had no live message, else blocked. Against the array form
// it saves the unnest of ten arrays, the grouping and sort of the keys and
// the join (about a tenth of the server's time per transaction with 8
// producers, pgbench), and the client's building of array literals.
func orderedInsertOneSQL(t outboxdriver.Table, notify bool, payload string) string {
	q := `WITH k AS (
    INSERT INTO ` + keysTable(t) + ` AS ks (message_key, last_seq, live) VALUES ($3, 1, 1)
    ON CONFLICT (message_key) DO UPDATE SET last_seq = ks.last_seq + 1, live = ks.live + 1
    RETURNING ks.last_seq, ks.live)`
	ins := `INSERT INTO ` + quoteTable(t) + ` (id, topic, message_key, payload, headers, available_at, key_seq, state)
SELECT $1::uuid, $2, $3, $4::jsonb, $5::jsonb,
    CASE WHEN $7::timestamptz IS NOT NULL THEN greatest(now(), $7::timestamptz) WHEN $6::float8 IS NOT NULL THEN now() + make_interval(secs => $6::float8) ELSE now() END,
    k.last_seq, CASE WHEN k.live > 1 THEN 'blocked' ELSE 'pending' END FROM k`
	if !notify {
		return q + `
` + ins
	}
	return q + `,
ins AS (` + ins + `)
SELECT FROM pg_notify(` + quoteLiteral(channel(t)) + `, ` + quoteLiteral(payload) + `)`
}

// oneKey identifies a text of orderedInsertOneSQL.
type oneKey struct {
	t       outboxdriver.Table
	notify  bool
	payload string
}

// orderedOnes caches orderedInsertOneSQL's texts.
var orderedOnes sync.Map // oneKey -> string

// insertOrderedOne is Insert for one ordered row without a DedupKey (see
// orderedInsertOneSQL).
func insertOrderedOne(t outboxdriver.Table, r *outboxdriver.Row, wake outboxdriver.Wake) (string, []any) {
	key := oneKey{t, wake.Send, ""}
	if wake.Send {
		key.payload = wake.Payload
	}
	q, ok := orderedOnes.Load(key)
	if !ok {
		q, _ = orderedOnes.LoadOrStore(key, orderedInsertOneSQL(t, key.notify, key.payload))
	}
	args := []any{r.ID.String(), r.Topic, r.Key, nil, nil, nil, nil}
	if r.Payload != nil {
		args[3] = string(r.Payload)
	}
	if r.Headers != nil {
		args[4] = string(r.Headers)
	}
	switch {
	case !r.NotBefore.IsZero():
		args[6] = r.NotBefore
	case r.Delay > 0:
		args[5] = r.Delay.Seconds()
	}
	return q.(string), args
}

// insertOrdered is Insert for a batch with ordered rows (see
// orderedInsertSQL and, for one row without a DedupKey,
// orderedInsertOneSQL).
func (d *dialect) insertOrdered(t outboxdriver.Table, rows []outboxdriver.Row, wake outboxdriver.Wake) (string, []any) {
	if len(rows) == 1 && rows[0].Ordered && rows[0].DedupKey == "" {
		return insertOrderedOne(t, &rows[0], wake)
	}
	n := len(rows)
	ids, topics, keys := make([]string, n), make([]string, n), make([]string, n)
	nulls := func(get func(r *outboxdriver.Row) (string, bool)) string {
		return arrayLiteral(n, func(i int) (string, bool) { return get(&rows[i]) })
	}
	ord, count := keyPlaces(rows)
	dedup := false
	for i := range rows {
		r := &rows[i]
		ids[i], topics[i], keys[i] = r.ID.String(), r.Topic, r.Key
		dedup = dedup || r.DedupKey != ""
	}
	ints := func(xs []int) string {
		return arrayLiteral(n, func(i int) (string, bool) { return strconv.Itoa(xs[i]), true })
	}
	args := []any{textArray(ids), textArray(topics),
		nulls(func(r *outboxdriver.Row) (string, bool) { return r.Key, r.Key != "" }),
		nulls(func(r *outboxdriver.Row) (string, bool) { return string(r.Payload), r.Payload != nil }),
		nulls(func(r *outboxdriver.Row) (string, bool) { return string(r.Headers), r.Headers != nil }),
		nulls(func(r *outboxdriver.Row) (string, bool) { return r.DedupKey, r.DedupKey != "" }),
		nulls(func(r *outboxdriver.Row) (string, bool) {
			return strconv.FormatFloat(r.Delay.Seconds(), 'f', -1, 64), r.Delay > 0 && r.NotBefore.IsZero()
		}),
		nulls(func(r *outboxdriver.Row) (string, bool) {
			return r.NotBefore.UTC().Format(time.RFC3339Nano), !r.NotBefore.IsZero()
		}),
		ints(ord), ints(count)}
	return orderedInsertSQL(t, !orderedDedup(rows), dedup, wake.Send, wake.Payload), args
}

// keyPlaces returns, for each row, its place among the batch's ordered
// rows of its key (from 1; 0 for an unordered row) and how many ordered
// rows its key has in the batch.
func keyPlaces(rows []outboxdriver.Row) (ord, count []int) {
	ord, count = make([]int, len(rows)), make([]int, len(rows))
	seen := map[string]int{}
	for i := range rows {
		if rows[i].Ordered {
			seen[rows[i].Key]++
			ord[i] = seen[rows[i].Key]
		}
	}
	for i := range rows {
		if rows[i].Ordered {
			count[i] = seen[rows[i].Key]
		}
	}
	return ord, count
}

// SequenceSQL numbers the ordered rows among $1 (a uuid[] literal, in
// publish order) that Insert stored blocked without a key_seq in this
// transaction: it takes their key rows and gives them key_seq and state
// as orderedInsertSQL does in one statement.
func (*dialect) SequenceSQL(t outboxdriver.Table, ids []outboxdriver.ID) (string, []any) {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = id.String()
	}
	tbl := quoteTable(t)
	return `WITH v AS MATERIALIZED (
    SELECT o.id, o.message_key AS k,
        row_number() OVER (PARTITION BY o.message_key ORDER BY x.pos) AS ord,
        count(*) OVER (PARTITION BY o.message_key) AS n
    FROM unnest($1::uuid[]) WITH ORDINALITY AS x(id, pos) JOIN ` + tbl + ` o ON o.id = x.id
    WHERE o.state = 'blocked' AND o.key_seq IS NULL),
` + keysUpsert(t) + `
UPDATE ` + tbl + ` AS o SET key_seq = k.last_seq - v.n + v.ord,
    state = CASE WHEN v.ord > 1 OR k.live > v.n THEN 'blocked' ELSE 'pending' END
FROM v JOIN k ON k.message_key = v.k WHERE o.id = v.id`, []any{textArray(s)}
}

// orderedClaimSQL returns the claim of a relay of an Outbox with
// OrderByKey: claimSettleText's claim and carried successes ($1-$6, $4
// being the largest integer, so that nothing is dead-lettered at claim),
// then, for each claimed ordered head, its run: up to $8 blocked messages
// that follow it in its key (through the index on (message_key,
// key_seq)), cut before the first that is not due or whose topic is not
// among $7 (a text[] literal; NULL with topics allTopics: every topic). $8 also bounds the run members of the
// whole claim: they are shared among the heads round-robin (every head's
// first, then every head's second...), so each run stays a prefix of its
// key and a claim of many busy keys holds at most its heads and $8 more
// messages in memory, while a claim of one hot key gets a run of $8. Rows: part (0 claimed, 1 run member, 2
// carried success fenced off: not written, usually none, as in
// claimSettleText), then the claimed columns, key_seq (0 for none) and the
// head's id for a run member.
func orderedClaimSQL(t outboxdriver.Table, topics int, keep bool) string {
	tbl := quoteTable(t)
	done := `DELETE FROM ` + tbl + ` AS o USING unnest($5::uuid[], $6::integer[]) AS v(id, attempts)`
	if keep {
		done = `UPDATE ` + tbl + ` AS o SET state = 'delivered', settled_at = now(), last_error = NULL FROM unnest($5::uuid[], $6::integer[]) AS v(id, attempts)`
	}
	// Every topic: $7 is NULL, and no topic cuts a run.
	inTopics := `b.topic = ANY($7::text[])`
	if topics == allTopics {
		inTopics = `coalesce(b.topic = ANY($7::text[]), true)`
	}
	// The claimed rows return their key_seq: the heads are read from the
	// claim itself, not looked up again by id (a probe of the primary key
	// and a heap page each, which miss the cache at large backlogs).
	//
	// The runs are read without reading past the budget. Round-robin
	// sharing gives every head at least its first c = $8 / heads (at
	// least 1) messages, n x c <= $8 in all: the first term of run reads
	// them, one range scan of the key index per head, cut at the first
	// message that is not due or of another topic (the window runs over at
	// most c rows, so it reads no row beyond them). The recursive term
	// then goes on one message per level (the next of every run whose
	// chunk was full and not cut: the rows at pos >= c), and runs takes
	// the first $8 rows. PostgreSQL evaluates a recursive CTE only as far
	// as its reader pulls, so the recursion stops once the budget is full:
	// the claim reads the members it returns and, per run, the message
	// that cuts it, not every blocked message of each key up to $8 (a
	// key's messages lie on different heap pages, each a cache miss at a
	// large backlog). The heads are taken in id order and each level
	// follows the one before: the first $8 rows are round-robin's.
	row := `b.id, b.topic, b.message_key, b.payload, b.headers, b.attempts, b.attempts_base, b.created_at, b.key_seq`
	ok := `b.available_at <= now() AND ` + inTopics
	with := claimCTE(t, done+fenceJoin+` RETURNING o.id`, topics, `, o.key_seq`, false, "", "")
	if !strings.HasPrefix(with, "WITH RECURSIVE ") { // all topics: already
		with = "WITH RECURSIVE " + strings.TrimPrefix(with, "WITH ")
	}
	return with + `,
heads AS (
    SELECT c.id, c.message_key AS hk, c.key_seq AS hseq FROM claimed c
    WHERE c.key_seq IS NOT NULL),
share AS MATERIALIZED (
    SELECT greatest($8::bigint / greatest(count(*), 1), 1) AS c FROM heads),
run AS (
    SELECT h.id AS head, r.id, r.topic, r.message_key, r.payload, r.headers, r.attempts, r.attempts_base, r.created_at, r.key_seq, r.pos
    FROM (SELECT * FROM heads ORDER BY id) h CROSS JOIN LATERAL (
        SELECT x.* FROM (
            SELECT ` + row + `,
                bool_and(` + ok + `) OVER w AS ok, row_number() OVER w AS pos
            FROM (
                SELECT * FROM ` + tbl + ` b
                WHERE b.message_key = h.hk AND b.key_seq > h.hseq AND b.state = 'blocked'
                ORDER BY b.key_seq
                LIMIT (SELECT c FROM share)) b
            WINDOW w AS (ORDER BY b.key_seq)) x
        WHERE x.ok) r
    UNION ALL
    SELECT p.head, r.id, r.topic, r.message_key, r.payload, r.headers, r.attempts, r.attempts_base, r.created_at, r.key_seq, p.pos + 1
    FROM run p CROSS JOIN LATERAL (
        SELECT ` + row + `, ` + ok + ` AS ok
        FROM ` + tbl + ` b
        WHERE b.message_key = p.message_key AND b.key_seq > p.key_seq AND b.state = 'blocked'
        ORDER BY b.key_seq
        LIMIT 1) r
    WHERE p.pos >= (SELECT c FROM share) AND r.ok),
runs AS (
    SELECT * FROM run LIMIT $8)
SELECT 0, ` + claimedColumns + `, coalesce(h.hseq, 0), NULL FROM claimed LEFT JOIN heads h USING (id)
UNION ALL
SELECT 1, id::text, topic, coalesce(message_key, ''), payload::text, headers::text, attempts, attempts_base, 0, created_at, key_seq, head::text FROM runs
UNION ALL
SELECT 2, f.id::text, '', '', NULL, NULL, f.attempts, 0, 0, now(), 0, NULL FROM unnest($5::uuid[], $6::integer[]) AS f(id, attempts)
    WHERE f.id NOT IN (SELECT id FROM done)
ORDER BY 1, 11`
}

// orderedClaimTexts are orderedClaimSQL's statements by topic form,
// deleting or keeping carried successes.
type orderedClaimTexts struct{ del, keep [3]string }

var orderedClaims = sqlbuild.NewTexts(func(t outboxdriver.Table) orderedClaimTexts {
	var c orderedClaimTexts
	for form, topics := range topicForms {
		c.del[form] = orderedClaimSQL(t, topics, false)
		c.keep[form] = orderedClaimSQL(t, topics, true)
	}
	return c
})

func (d *dialect) ClaimOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.ClaimParams, runLimit int) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	ct, form := orderedClaims.Get(t), topicForm(p)
	q := ct.del[form]
	if p.KeepDelivered {
		q = ct.keep[form]
	}
	var runTopics any = textArray(p.Topics)
	if form == 2 {
		runTopics = nil // every topic
	}
	ids, attempts := fenceArrays(p.Done)
	rows, err := db.QueryDB(ctx, q, topicsArg(p, form), p.Limit, p.Lease.Seconds(), math.MaxInt32, ids, attempts, runTopics, max(runLimit, 0))
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	claimed := make([]outboxdriver.Claimed, 0, p.Limit)
	var off []outboxdriver.Fence
	type member struct {
		head outboxdriver.ID
		c    outboxdriver.Claimed
	}
	var run []member
	var c outboxdriver.Claimed
	var part, kind int
	var head *string
	dest := []any{&part, idDest{&c.ID}, topicDest{&c.Topic, p.Topics}, &c.Key, &c.Payload, &c.Headers, &c.Attempts, &c.AttemptsBase, &kind, &c.CreatedAt, &c.KeySeq, &head}
	for rows.Next() {
		c, head = outboxdriver.Claimed{}, nil
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, err
		}
		switch part {
		case 0:
			claimed = append(claimed, c)
		case 1:
			if head == nil {
				return nil, nil, fmt.Errorf("outbox: claim: run member %s without a head", c.ID)
			}
			h, err := outboxdriver.ParseID(*head)
			if err != nil {
				return nil, nil, err
			}
			run = append(run, member{h, c})
		default:
			off = append(off, outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	if len(run) > 0 {
		at := make(map[outboxdriver.ID]int, len(claimed))
		for i := range claimed {
			at[claimed[i].ID] = i
		}
		for _, m := range run { // in key_seq order (ORDER BY)
			if i, ok := at[m.head]; ok {
				claimed[i].Run = append(claimed[i].Run, m.c)
			}
		}
	}
	var done []outboxdriver.Fence
	if len(p.Done) > 0 {
		// A copy: p.Done is the relay's buffer, reused by its next claim.
		done = applied(slices.Clone(p.Done), off)
	}
	return claimed, done, nil
}

// lockKeys is the first statement of every write that can move a key's
// head: it takes the key rows $1 (a sorted text[] literal) in key order,
// waiting for open publishes of those keys to commit. The next statement
// of the transaction, with a snapshot taken after the locks, sees every
// message those publishes stored.
func lockKeys(t outboxdriver.Table) string {
	return `SELECT 1 FROM ` + keysTable(t) + ` WHERE message_key = ANY($1::text[]) ORDER BY message_key FOR UPDATE`
}

// settleRunsSQL returns the settle of runs (the second statement of
// SettleRuns, after lockFreeKeysSQL). One element per run: $1 head ids, $2 head
// attempts, $3 keys, $4 failed ids (NULL for none), $5 failed kinds (0
// none, 1 retry, 2 dead), $6 retry delays in seconds, $7 retry times, $8
// errors, $9 halt, $12 how many successes; and one per success: $10 ids
// and $11 the (1-based) run they belong to. keep marks successes delivered
// instead of deleting them. It returns the fences of the heads that held.
// A held head fences its whole run (only the head's holder moves the
// messages behind it), so a held run's $12 successes are all written, and
// its key's live count drops by $12 (plus one for a message dead under
// Continue).
//
// A head dead under Halt keeps settled_at NULL: Purge deletes only rows
// settled before a time, so it never deletes a halted head (its key would
// wait forever for a message that no longer exists); SkipHead sets it.
//
// The heads are found one primary-key probe each (a LATERAL subquery the
// planner cannot pull up: OFFSET 0). As a plain join, with statistics
// taken while no row was processing, PostgreSQL scanned every processing
// row of the claim index and compared each with every run: 1.4-4 s per
// settle of 1,000 runs in a 10,000-key drain (auto_explain). The keys'
// counts come with the runs ($12): counted from the deleted rows (a
// grouping of done joined to the runs), the planner, expecting a handful of
// rows, ran the grouping's output once per run (a nested loop: 145 of a
// settle's 175 ms for 500 runs, auto_explain). Written rows and key rows
// are reached through id = ANY(ARRAY(...)): as joins, the planner hashed
// sequential scans of the outbox and keys tables.
func settleRunsSQL(t outboxdriver.Table, keep bool) string {
	tbl := quoteTable(t)
	// Rows by primary key, through an array (a TID-free probe per id, as
	// the claim does with its ctids): joined to d, the planner guessed
	// thousands of rows and hashed a sequential scan of the whole table.
	// Every write re-checks, on the row version it changes, the fence it
	// relies on (I2 in docs/internals.md): the head still processing with
	// the claimed attempts, a run member still blocked (its key row is
	// locked, so nothing else moves it).
	fenced := `(o.state = 'blocked' OR (o.state = 'processing' AND (o.id, o.attempts) IN (SELECT h_id, h_att FROM ok)))`
	done := `DELETE FROM ` + tbl + ` AS o WHERE o.id = ANY (ARRAY(SELECT id FROM d)) AND ` + fenced
	if keep {
		done = `UPDATE ` + tbl + ` AS o SET state = 'delivered', settled_at = now(), last_error = NULL
    WHERE o.id = ANY (ARRAY(SELECT id FROM d)) AND ` + fenced
	}
	return `WITH r AS (
    SELECT * FROM unnest($1::uuid[], $2::integer[], $3::text[], $4::uuid[], $5::integer[], $6::float8[], $7::timestamptz[], $8::text[], $9::boolean[], $12::integer[])
        WITH ORDINALITY AS r(h_id, h_att, k, f_id, f_kind, f_delay, f_at, f_err, halt, n_done, n)),
ok AS MATERIALIZED (
    SELECT r.* FROM r CROSS JOIN LATERAL (
        SELECT 1 FROM ` + tbl + ` o WHERE o.id = r.h_id AND o.attempts = r.h_att AND o.state = 'processing' OFFSET 0 FOR UPDATE) o),
d AS MATERIALIZED (
    SELECT x.id, ok.k FROM unnest($10::uuid[], $11::integer[]) AS x(id, n) JOIN ok ON ok.n = x.n),
done AS (` + done + `),
failed AS (
    UPDATE ` + tbl + ` AS o SET
        state        = CASE WHEN ok.f_kind = 1 THEN 'pending' ELSE 'dead' END,
        attempts     = CASE WHEN o.id = ok.h_id THEN o.attempts ELSE o.attempts + 1 END,
        available_at = CASE WHEN ok.f_kind <> 1 THEN o.available_at
                            WHEN ok.f_at IS NULL THEN now() + make_interval(secs => ok.f_delay)
                            ELSE greatest(now(), ok.f_at) END,
        settled_at   = CASE WHEN ok.f_kind = 1 OR ok.halt THEN NULL ELSE now() END,
        last_error   = ok.f_err
    FROM ok WHERE o.id = ok.f_id AND ok.f_kind > 0
        AND CASE WHEN o.id = ok.h_id THEN o.state = 'processing' AND o.attempts = ok.h_att ELSE o.state = 'blocked' END
    RETURNING o.id),
nxt AS MATERIALIZED (
    SELECT b.id FROM ok CROSS JOIN LATERAL (
        SELECT o.id FROM ` + tbl + ` o
        WHERE o.message_key = ok.k AND o.key_seq IS NOT NULL AND o.state = 'blocked'
          AND o.id NOT IN (SELECT id FROM d) AND o.id IS DISTINCT FROM ok.f_id
        ORDER BY o.key_seq
        LIMIT 1) b
    WHERE ok.f_kind = 0 OR (ok.f_kind = 2 AND NOT ok.halt)),
promoted AS (
    UPDATE ` + tbl + ` AS o SET state = 'pending' FROM nxt WHERE o.id = nxt.id AND o.state = 'blocked' RETURNING o.id),
kk AS (
    UPDATE ` + keysTable(t) + ` AS ks SET live = ks.live - x.dec, halted_seq = coalesce(x.halted, ks.halted_seq) FROM (
        SELECT ok.k,
            ok.n_done + CASE WHEN ok.f_kind = 2 AND NOT ok.halt THEN 1 ELSE 0 END AS dec,
            CASE WHEN ok.f_kind = 2 AND ok.halt THEN (SELECT s.key_seq FROM ` + tbl + ` s WHERE s.id = ok.f_id) END AS halted
        FROM ok) x
    WHERE ks.message_key = ANY (ARRAY(SELECT k FROM ok)) AND ks.message_key = x.k RETURNING 1)
SELECT h_id::text, h_att FROM ok
    WHERE (SELECT count(*) FROM failed) >= 0 AND (SELECT count(*) FROM promoted) >= 0 AND (SELECT count(*) FROM kk) >= 0`
}

var settleRunsTexts = sqlbuild.NewTexts(func(t outboxdriver.Table) [2]string {
	return [2]string{settleRunsSQL(t, false), settleRunsSQL(t, true)}
})

// sortedKeys returns the distinct keys, sorted: the order every key lock
// is taken in.
func sortedKeys(keys []string) string {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	return textArray(slices.Compact(keys))
}

// inTx runs f in one transaction of db.
func inTx(ctx context.Context, db outboxdriver.DB, f func(tx outboxdriver.DB) error) error {
	tdb, ok := db.(outboxdriver.TxDB)
	if !ok {
		return fmt.Errorf("%w: %T cannot run a transaction, which ordered delivery needs", outboxdriver.ErrUnsupported, db)
	}
	return tdb.InTx(ctx, f)
}

func (d *dialect) SettleRuns(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.SettleParams, runs []outboxdriver.RunOutcome) ([]outboxdriver.Fence, []int, error) {
	if len(runs) == 0 {
		return nil, nil, nil
	}
	keys := make([]string, len(runs))
	for i := range runs {
		keys[i] = runs[i].Key
	}
	var applied []outboxdriver.Fence
	var busy []int
	err := inTx(ctx, db, func(tx outboxdriver.DB) error {
		applied, busy = nil, nil
		locked, err := lockFreeKeys(ctx, tx, t, keys)
		if err != nil {
			return err
		}
		mine := make([]outboxdriver.RunOutcome, 0, len(runs))
		for i := range runs {
			if locked[runs[i].Key] {
				mine = append(mine, runs[i])
			} else {
				busy = append(busy, i)
			}
		}
		if len(mine) == 0 {
			return nil
		}
		q := settleRunsTexts.Get(t)[0]
		if p.KeepDelivered {
			q = settleRunsTexts.Get(t)[1]
		}
		applied, err = sqlbuild.Fences(ctx, tx, q, settleRunsArgs(mine)...)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return applied, busy, nil
}

// lockFreeKeysSQL is the first statement of SettleRuns: it locks the key
// rows $1 (a sorted text[] literal) in key order, skipping those another
// transaction holds (an open publish of the key, another settle), and
// returns the keys it locked. The next statement, with a snapshot taken
// after the locks, sees every message of those keys committed so far.
func lockFreeKeysSQL(t outboxdriver.Table) string {
	return `SELECT message_key FROM ` + keysTable(t) + ` WHERE message_key = ANY($1::text[]) ORDER BY message_key FOR UPDATE SKIP LOCKED`
}

// lockFreeKeys runs lockFreeKeysSQL and returns the keys it locked.
func lockFreeKeys(ctx context.Context, tx outboxdriver.DB, t outboxdriver.Table, keys []string) (map[string]bool, error) {
	rows, err := tx.QueryDB(ctx, lockFreeKeysSQL(t), sortedKeys(keys))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	locked := make(map[string]bool, len(keys))
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		locked[k] = true
	}
	return locked, rows.Err()
}

// settleRunsArgs returns settleRunsSQL's arguments for runs.
func settleRunsArgs(runs []outboxdriver.RunOutcome) []any {
	n := len(runs)
	heads, keys := make([]outboxdriver.Fence, n), make([]string, n)
	var doneIDs []string
	var doneRun []int
	for i := range runs {
		heads[i], keys[i] = runs[i].Head, runs[i].Key
		for _, id := range runs[i].Done {
			doneIDs = append(doneIDs, id.String())
			doneRun = append(doneRun, i+1)
		}
	}
	hid, hatt := fenceArrays(heads)
	el := func(f func(r *outboxdriver.RunOutcome) (string, bool)) string {
		return arrayLiteral(n, func(i int) (string, bool) { return f(&runs[i]) })
	}
	failed := func(r *outboxdriver.RunOutcome) bool {
		return r.Failed.Kind == outboxdriver.SettleRetry || r.Failed.Kind == outboxdriver.SettleDead
	}
	return []any{hid, hatt, textArray(keys),
		el(func(r *outboxdriver.RunOutcome) (string, bool) { return r.Failed.ID.String(), failed(r) }),
		el(func(r *outboxdriver.RunOutcome) (string, bool) {
			switch {
			case !failed(r):
				return "0", true
			case r.Failed.Kind == outboxdriver.SettleRetry:
				return "1", true
			}
			return "2", true
		}),
		el(func(r *outboxdriver.RunOutcome) (string, bool) {
			return strconv.FormatFloat(r.Failed.Delay.Seconds(), 'f', -1, 64), true
		}),
		el(func(r *outboxdriver.RunOutcome) (string, bool) {
			return r.Failed.At.UTC().Format(time.RFC3339Nano), !r.Failed.At.IsZero()
		}),
		el(func(r *outboxdriver.RunOutcome) (string, bool) { return r.Failed.Error, failed(r) }),
		el(func(r *outboxdriver.RunOutcome) (string, bool) { return strconv.FormatBool(r.Halt && failed(r)), true }),
		textArray(doneIDs),
		arrayLiteral(len(doneRun), func(i int) (string, bool) { return strconv.Itoa(doneRun[i]), true }),
		el(func(r *outboxdriver.RunOutcome) (string, bool) { return strconv.Itoa(len(r.Done)), true }),
	}
}

// exec runs a statement and discards its rows.
func exec(ctx context.Context, db outboxdriver.DB, q string, args ...any) error {
	rows, err := db.QueryDB(ctx, q, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	rows.Close()
	return rows.Err()
}

// redriveOrderedIDsSQL returns the redrive of the dead ordered messages
// whose ids are $1 (a uuid[]), the second statement of a transaction that
// has locked their keys (lockKeys), re-checking that each is still dead.
// Each re-enters its key at the place outboxdriver.OrderedDialect's
// RedriveOrdered gives (I5): the key's halted head keeps its key_seq and
// stops halting the key; any other takes a new key_seq after the key's
// last_seq, in its old order among those redriven with it, and counts in
// live again. For each key left without a head (pending or processing)
// and not halted by a head not redriven, the first of its blocked
// messages, redriven or not, becomes pending. It returns how many it
// redrove. The messages are locked first and read on their newest
// versions (FOR UPDATE), so one deleted or changed meanwhile (an operator's
// delete, a purge) is neither redriven nor counted.
func redriveOrderedIDsSQL(t outboxdriver.Table) string {
	tbl, keys := quoteTable(t), keysTable(t)
	return `WITH locked AS MATERIALIZED (
    SELECT o.id, o.message_key, o.key_seq FROM ` + tbl + ` o
    WHERE o.state = 'dead' AND o.key_seq IS NOT NULL AND o.id = ANY($1::uuid[]) FOR UPDATE),
dead AS MATERIALIZED (
    SELECT o.id, o.message_key AS k, o.key_seq IS NOT DISTINCT FROM ks.halted_seq AS halted,
        CASE WHEN o.key_seq IS NOT DISTINCT FROM ks.halted_seq THEN o.key_seq
             ELSE ks.last_seq + row_number() OVER (PARTITION BY o.message_key, o.key_seq IS NOT DISTINCT FROM ks.halted_seq ORDER BY o.key_seq) END AS seq
    FROM locked o JOIN ` + keys + ` ks ON ks.message_key = o.message_key),
kstate AS MATERIALIZED (
    SELECT ks.message_key AS k,
        ks.halted_seq IS NOT NULL AND NOT EXISTS (SELECT 1 FROM dead WHERE dead.k = ks.message_key AND dead.halted) AS halted,
        EXISTS (SELECT 1 FROM ` + tbl + ` h WHERE h.message_key = ks.message_key AND h.key_seq IS NOT NULL AND h.state IN ('pending', 'processing')) AS has_head
    FROM ` + keys + ` ks WHERE ks.message_key IN (SELECT k FROM dead)),
first AS MATERIALIZED (
    SELECT DISTINCT ON (c.k) c.k, c.id FROM (
        SELECT dead.k, dead.id, dead.seq FROM dead
        UNION ALL
        SELECT o.message_key, o.id, o.key_seq FROM ` + tbl + ` o
        WHERE o.message_key IN (SELECT k FROM dead) AND o.key_seq IS NOT NULL AND o.state = 'blocked') c
    JOIN kstate s ON s.k = c.k
    WHERE NOT s.has_head AND NOT s.halted
    ORDER BY c.k, c.seq),
rd AS (
    UPDATE ` + tbl + ` AS o SET state = CASE WHEN o.id IN (SELECT id FROM first) THEN 'pending' ELSE 'blocked' END,
        key_seq = dead.seq, attempts_base = o.attempts, available_at = now(), settled_at = NULL, last_error = NULL
    FROM dead WHERE o.id = dead.id AND o.state = 'dead' RETURNING 1),
pr AS (
    UPDATE ` + tbl + ` AS o SET state = 'pending' FROM first WHERE o.id = first.id AND o.state = 'blocked' RETURNING 1),
kk AS (
    UPDATE ` + keys + ` AS ks SET live = ks.live + x.n, last_seq = ks.last_seq + x.n,
        halted_seq = CASE WHEN x.unhalt THEN NULL ELSE ks.halted_seq END
    FROM (SELECT dead.k, count(*) FILTER (WHERE NOT dead.halted) AS n, bool_or(dead.halted) AS unhalt FROM dead GROUP BY dead.k) x
    WHERE ks.message_key = x.k RETURNING 1)
SELECT (SELECT count(*) FROM rd) + 0 * (SELECT count(*) FROM pr) + 0 * (SELECT count(*) FROM kk)`
}

// redriveUnorderedSQL returns the redrive of the dead unordered messages
// of table t ($1 the topic, "" for all): they become pending, due now, with
// fresh attempts. It returns how many it redrove.
func redriveUnorderedSQL(t outboxdriver.Table) string {
	// attempts stays: (id, attempts) fences one claim and must never repeat.
	return `WITH r AS (UPDATE ` + quoteTable(t) + ` SET state = 'pending', attempts_base = attempts, available_at = now(), settled_at = NULL, last_error = NULL
    WHERE state = 'dead' AND key_seq IS NULL AND ($1 = '' OR topic = $1) RETURNING 1) SELECT count(*) FROM r`
}

// RedriveOrdered redrives the dead unordered messages of topic with one
// statement, then its dead ordered ones in batches of up to
// sqlbuild.InspectBatch, each one transaction that locks the batch's keys
// and redrives only the messages it picked (redriveOrderedIDsSQL): a
// message that dies after the pick, its key not locked, waits for the next
// redrive.
func (*dialect) RedriveOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, topic string) (int64, error) {
	n, err := sqlbuild.CountRows(ctx, db, redriveUnorderedSQL(t), topic)
	if err != nil {
		return 0, err
	}
	m, err := sqlbuild.Batches(ctx, sqlbuild.InspectBatch, func() (int64, error) {
		return redriveOrderedBatch(ctx, db, t, outboxdriver.Filter{Topic: topic})
	})
	return n + m, err
}

// skipHeadSQL returns the skip of key $1's head dead under Halt (after
// the key is locked), when $2 is empty or that head's id: the message stays
// dead (settled now, so Purge may delete it from now on), the key is no
// longer halted and no longer counts it, and its first blocked message
// becomes pending. It returns the skipped message's id, no row when there
// was none.
func skipHeadSQL(t outboxdriver.Table) string {
	tbl, keys := quoteTable(t), keysTable(t)
	return `WITH h AS MATERIALIZED (
    SELECT o.id FROM ` + keys + ` ks JOIN ` + tbl + ` o ON o.message_key = ks.message_key AND o.key_seq = ks.halted_seq
    WHERE ks.message_key = $1 AND o.state = 'dead' AND ($2 = '' OR o.id::text = $2) FOR UPDATE OF o),
nxt AS MATERIALIZED (
    SELECT o.id FROM ` + tbl + ` o
    WHERE o.message_key = $1 AND o.key_seq IS NOT NULL AND o.state = 'blocked' AND EXISTS (SELECT 1 FROM h)
    ORDER BY o.key_seq LIMIT 1),
pr AS (UPDATE ` + tbl + ` AS o SET state = 'pending' FROM nxt WHERE o.id = nxt.id RETURNING 1),
sk AS (UPDATE ` + tbl + ` AS o SET settled_at = now() FROM h WHERE o.id = h.id RETURNING 1),
kk AS (UPDATE ` + keys + ` SET live = live - 1, halted_seq = NULL WHERE message_key = $1 AND EXISTS (SELECT 1 FROM h) RETURNING 1)
SELECT id::text FROM h`
}

func (*dialect) SkipHead(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, key string, head outboxdriver.ID) (outboxdriver.ID, bool, error) {
	want := ""
	if !head.IsZero() {
		want = head.String()
	}
	var id outboxdriver.ID
	var ok bool
	err := inTx(ctx, db, func(tx outboxdriver.DB) error {
		if err := exec(ctx, tx, lockKeys(t), textArray([]string{key})); err != nil {
			return err
		}
		rows, err := tx.QueryDB(ctx, skipHeadSQL(t), key, want)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				return err
			}
			if id, err = outboxdriver.ParseID(s); err != nil {
				return err
			}
			ok = true
		}
		return rows.Err()
	})
	return id, ok, err
}

// orderedStatsSQL returns, per topic: blocked messages, held keys (a head
// of the topic with messages behind it), blocked keys (a head of the topic
// dead under Halt or pending a retry) and the age in microseconds of the
// oldest of those heads.
func orderedStatsSQL(t outboxdriver.Table) string {
	tbl := quoteTable(t)
	const failed = `(o.state = 'dead' OR o.last_error IS NOT NULL)`
	return `SELECT topic, sub, sum(blocked)::bigint, sum(held)::bigint, sum(bk)::bigint, max(age)::bigint FROM (
    SELECT topic, ` + subscriberOf("message_key") + ` AS sub, count(*) AS blocked, 0 AS held, 0 AS bk, 0 AS age FROM ` + tbl + ` WHERE state = 'blocked' GROUP BY 1, 2
    UNION ALL
    SELECT o.topic, ` + subscriberOf("o.message_key") + `, 0, count(*) FILTER (WHERE ks.live > 1), count(*) FILTER (WHERE ` + failed + `),
        COALESCE((EXTRACT(EPOCH FROM now() - min(o.created_at) FILTER (WHERE ` + failed + `)) * 1000000)::bigint, 0)
    FROM ` + keysTable(t) + ` ks JOIN ` + tbl + ` o ON o.message_key = ks.message_key AND o.key_seq IS NOT NULL
        AND (o.state IN ('pending', 'processing') OR (o.state = 'dead' AND o.key_seq = ks.halted_seq))
    WHERE ks.live > 0
    GROUP BY 1, 2) x
GROUP BY topic, sub ORDER BY topic, sub`
}

func (d *dialect) StatsOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) ([]outboxdriver.TopicStats, error) {
	ts, err := d.Stats(ctx, db, t)
	if err != nil {
		return nil, err
	}
	return sqlbuild.OrderedStats(ctx, db, orderedStatsSQL(t), ts, time.Microsecond)
}

// CheckOrdered reads nothing but the columns and table ordered delivery
// needs.
func (d *dialect) CheckOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) error {
	err := exec(ctx, db, `SELECT key_seq FROM `+quoteTable(t)+` WHERE false`)
	if err == nil {
		err = exec(ctx, db, `SELECT message_key, last_seq, live, halted_seq FROM `+keysTable(t)+` WHERE false`)
	}
	if err != nil {
		return d.Classify(err)
	}
	return nil
}
