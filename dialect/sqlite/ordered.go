package sqlite

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds the SQL of ordered delivery (outboxdriver.OrderedDialect)
// on SQLite: the claim of heads with their runs, the settle of runs,
// redrive, skip and stats. The ordered publish is Insert's statement with
// ordered rows stored 'blocked'; the trigger of migration 0004 numbers them
// (see docs/dialects.md for why this orders by commit).
//
// SQLite has one writer at a time. Every write below runs under the
// database's write lock, which a publisher holds from its INSERT (from its
// BEGIN with _txlock=immediate) to its commit: a write that moves a key's
// head waits for open publishes of the key, as PostgreSQL's key row lock
// makes it, and sees every message they stored. So the writes that must
// be atomic (the settle of runs, redrive, skip) are each one transaction,
// and nothing else needs a lock.

var _ outboxdriver.OrderedDialect = (*dialect)(nil)

// keysTable is the quoted table of key sequences beside t.
func keysTable(t outboxdriver.Table) string { return quoteTable(outboxdriver.KeysTable(t)) }

// trigger is the name of migration 0004's trigger on t.
func trigger(t outboxdriver.Table) string { return t.Name + "_seq_trg" }

// SequenceSQL returns no statement: the trigger numbers ordered rows as
// the INSERT stores them, a duplicate DedupKey included (it stores
// nothing, so nothing is numbered), and Publish sends nothing more.
func (*dialect) SequenceSQL(outboxdriver.Table, []outboxdriver.ID) (string, []any) { return "", nil }

// runSQL returns the read of the runs of claimed ordered heads: ?1 the
// heads as a JSON array of [id, key, key_seq], ?2 the claimed topics (a
// JSON array), ?3 the run limit (at least 1), ?4 true for a claim of every
// topic (?2 is then not read). For each head, the blocked
// messages after it in its key, at most ?3 (bounded through the key
// index: the ?3-th of them is found by one index walk), cut before the
// first that is not due or whose topic is not claimed; then the members
// of all runs shared round-robin (every head's first, then every head's
// second...), at most ?3, so that each run stays a prefix of its key.
// Rows: head id, then the claimed columns.
func runSQL(t outboxdriver.Table) string {
	tbl := quoteTable(t)
	return `WITH h AS (SELECT value->>0 AS head, value->>1 AS k, value->>2 AS seq FROM json_each(?1)),
m AS (
    SELECT h.head, b.id, b.topic, b.message_key, b.payload, b.headers, b.attempts, b.attempts_base, b.created_at, b.key_seq,
        b.available_at <= ` + now + ` AND (?4 OR b.topic IN (SELECT value FROM json_each(?2))) AS ok
    FROM h JOIN ` + tbl + ` b ON b.message_key = h.k AND b.state = 'blocked' AND b.key_seq > h.seq
        AND b.key_seq <= coalesce((
            SELECT x.key_seq FROM ` + tbl + ` x WHERE x.message_key = h.k AND x.state = 'blocked' AND x.key_seq > h.seq
            ORDER BY x.key_seq LIMIT 1 OFFSET ?3 - 1), b.key_seq)),
r AS (
    SELECT *, min(ok) OVER w AS run, row_number() OVER w AS pos FROM m
    WINDOW w AS (PARTITION BY head ORDER BY key_seq))
SELECT head, id, topic, coalesce(message_key, ''), payload, headers, attempts, attempts_base, created_at, key_seq
FROM r WHERE run ORDER BY pos, head LIMIT ?3`
}

// orderedTexts caches the ordered statements per table.
var orderedTexts = sqlbuild.NewTexts(func(t outboxdriver.Table) (o struct{ claim, claimAll, runs string }) {
	o.claim, o.claimAll, o.runs = claimSQL(t, true, true), claimSQL(t, false, true), runSQL(t)
	return o
})

// ClaimOrdered settles p.Done and claims as Claim does, with the key_seq
// of each claimed row and never dead-lettering, then reads the runs of the
// claimed ordered heads (runSQL). The read needs no transaction with the
// claim: a run is blocked messages of a key whose head this claim now
// holds, and while it is held nothing but a publisher changes them (it
// appends committed messages after them). When the read fails, the claim
// has committed all the same (as the carried settle has, before the plain
// claim): its heads come back when their lease lapses, with their runs.
func (d *dialect) ClaimOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.ClaimParams, runLimit int) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	db = relayDB(db)
	done, err := d.carried(ctx, db, t, p)
	if err != nil {
		return nil, nil, err
	}
	ot := orderedTexts.Get(t)
	p.MaxAttempts = math.MaxInt64
	q := ot.claim
	if p.AllTopics {
		q = ot.claimAll
	}
	claimed, err := d.claimWith(ctx, db, q, p, true)
	if err != nil || runLimit <= 0 {
		return claimed, done, d.Classify(err)
	}
	at := make(map[outboxdriver.ID]int, len(claimed))
	var heads [][]any
	for i := range claimed {
		if c := &claimed[i]; c.KeySeq > 0 {
			at[c.ID] = i
			heads = append(heads, []any{c.ID.String(), c.Key, c.KeySeq})
		}
	}
	if len(heads) == 0 {
		return claimed, done, nil
	}
	rows, err := db.QueryDB(ctx, ot.runs, jsonText(heads), jsonText(p.Topics), runLimit, p.AllTopics)
	if err != nil {
		return nil, done, d.Classify(err)
	}
	defer rows.Close()
	var c outboxdriver.Claimed
	var head, id string
	var created int64
	dest := []any{&head, &id, &c.Topic, &c.Key, &c.Payload, &c.Headers, &c.Attempts, &c.AttemptsBase, &created, &c.KeySeq}
	for rows.Next() {
		c = outboxdriver.Claimed{}
		if err := rows.Scan(dest...); err != nil {
			return nil, done, err
		}
		h, err := outboxdriver.ParseID(head)
		if err != nil {
			return nil, done, err
		}
		if c.ID, err = outboxdriver.ParseID(id); err != nil {
			return nil, done, err
		}
		c.CreatedAt = time.UnixMilli(created).UTC()
		if i, ok := at[h]; ok { // rows come in key_seq order within a run
			claimed[i].Run = append(claimed[i].Run, c)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, done, d.Classify(err)
	}
	return claimed, done, nil
}

// inTx runs f in one transaction of db, again from the start while it
// fails with SQLITE_BUSY (a deferred transaction whose snapshot went stale
// before its first write, or a write lock held past the busy timeout),
// until ctx ends.
func inTx(ctx context.Context, db outboxdriver.DB, f func(tx outboxdriver.DB) error) error {
	tdb, ok := db.(outboxdriver.TxDB)
	if !ok {
		return fmt.Errorf("%w: %T cannot run a transaction, which ordered delivery needs", outboxdriver.ErrUnsupported, db)
	}
	for attempt := 1; ; attempt++ {
		err := tdb.InTx(ctx, f)
		if err == nil || !busy(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-time.After(busyPause.Delay(attempt)):
		}
	}
}

// promoteSQL returns the statement that gives each key of ?1 (a JSON
// array) its head when it has none: the key's first blocked message (in
// key_seq order) becomes pending, unless the key has a pending or
// processing ordered message or is halted (halted_seq set). Every write
// that can leave a key without its head ends with it (the settle of runs,
// redrive, skip), so the rule "a key with live messages and no halted
// head has exactly one head" is kept in one place.
func promoteSQL(t outboxdriver.Table) string {
	tbl := quoteTable(t)
	return `UPDATE ` + tbl + ` SET state = 'pending' WHERE rowid IN (
    SELECT (SELECT b.rowid FROM ` + tbl + ` b
            WHERE b.message_key = ks.message_key AND b.state = 'blocked' AND b.key_seq IS NOT NULL
            ORDER BY b.key_seq LIMIT 1)
    FROM ` + keysTable(t) + ` ks
    WHERE ks.message_key IN (SELECT value FROM json_each(?1)) AND ks.halted_seq IS NULL
      AND NOT EXISTS (SELECT 1 FROM ` + tbl + ` h
            WHERE h.message_key = ks.message_key AND h.state IN ('pending', 'processing') AND h.key_seq IS NOT NULL))
RETURNING 1`
}

// keysSQL returns the update of the key rows after a write: ?1 a JSON
// array of [key, change of live, halted_seq or null]; a halted_seq sets
// the key's, a null keeps it.
func keysSQL(t outboxdriver.Table) string {
	return `UPDATE ` + keysTable(t) + ` AS ks SET live = ks.live + v.n, halted_seq = coalesce(v.halted, ks.halted_seq)
FROM (SELECT value->>0 AS k, value->>1 AS n, value->>2 AS halted FROM json_each(?1)) AS v
WHERE ks.message_key = v.k RETURNING 1`
}

// runSettleSQL returns the statements of SettleRuns after the heads are
// checked, each fenced in its own WHERE on the rows it changes (I2): a
// run's head must still be processing with its claimed attempts, a run
// member still blocked. The successes (?1 a JSON array of [id, the
// claimed attempts for a head, null for a run member]) deleted, or marked
// delivered (keep), returning their keys; the failed messages (?1 a JSON
// array of [id, head id, kind (1 retry, 2 dead), delay ms, at ms or null,
// error, halt, the head's claimed attempts]) made their keys' heads again
// (pending after the delay, attempts + 1 for a run member) or dead
// (settled_at NULL under Halt, so that Purge never deletes a halted head),
// returning key, key_seq, state and whether settled.
func runSettleSQL(t outboxdriver.Table, keep bool) (done, failed string) {
	tbl := quoteTable(t)
	mine := ` WHERE rowid IN (
    SELECT o.rowid FROM json_each(?1) AS v JOIN ` + tbl + ` AS o ON o.id = v.value->>0
    WHERE CASE WHEN v.value->>1 IS NULL THEN o.state = 'blocked' ELSE o.state = 'processing' AND o.attempts = v.value->>1 END)
RETURNING message_key`
	done = `DELETE FROM ` + tbl + mine
	if keep {
		done = `UPDATE ` + tbl + ` SET state = 'delivered', settled_at = ` + now + `, last_error = NULL` + mine
	}
	failed = `UPDATE ` + tbl + ` AS o SET
    state        = CASE WHEN v.kind = 1 THEN 'pending' ELSE 'dead' END,
    attempts     = CASE WHEN o.id = v.head THEN o.attempts ELSE o.attempts + 1 END,
    available_at = CASE WHEN v.kind <> 1 THEN o.available_at
                        WHEN v.at IS NULL THEN ` + now + ` + v.delay ELSE max(` + now + `, v.at) END,
    settled_at   = CASE WHEN v.kind = 1 OR v.halt THEN NULL ELSE ` + now + ` END,
    last_error   = v.err
FROM (SELECT value->>0 AS id, value->>1 AS head, value->>2 AS kind, value->>3 AS delay, value->>4 AS at, value->>5 AS err, value->>6 AS halt,
          value->>7 AS head_attempts
      FROM json_each(?1)) AS v
WHERE o.id = v.id
  AND CASE WHEN o.id = v.head THEN o.state = 'processing' AND o.attempts = v.head_attempts ELSE o.state = 'blocked' END
RETURNING message_key, key_seq, state, settled_at IS NOT NULL`
	return done, failed
}

var runSettleTexts = sqlbuild.NewTexts(func(t outboxdriver.Table) (s struct{ heads, done, keep, failed, failedKeep, keys, promote string }) {
	s.heads = `SELECT o.id, o.attempts FROM ` + values + `, ` + quoteTable(t) + ` AS o
WHERE o.id = v.id AND o.attempts = v.attempts AND o.state = 'processing'`
	s.done, s.failed = runSettleSQL(t, false)
	s.keep, _ = runSettleSQL(t, true)
	s.keys, s.promote = keysSQL(t), promoteSQL(t)
	return s
})

// SettleRuns writes the outcomes in one transaction: it takes the write
// lock (so it waits for open publishes, and sees what they stored, and
// never returns busy: no other transaction can hold a key), keeps the runs
// whose head is still held, writes their successes and failures
// (runSettleSQL, fenced on each row it changes), counts them in their
// keys and gives the keys left without a head their next one.
func (d *dialect) SettleRuns(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.SettleParams, runs []outboxdriver.RunOutcome) ([]outboxdriver.Fence, []int, error) {
	if len(runs) == 0 {
		return nil, nil, nil
	}
	st := runSettleTexts.Get(t)
	heads := make([]outboxdriver.Fence, len(runs))
	for i := range runs {
		heads[i] = runs[i].Head
	}
	var applied []outboxdriver.Fence
	err := inTx(ctx, db, func(tx outboxdriver.DB) error {
		var err error
		applied, err = sqlbuild.Fences(ctx, tx, st.heads, settleRows(sqlbuild.Successes(heads)))
		if err != nil || len(applied) == 0 {
			return err
		}
		held := make(map[outboxdriver.Fence]bool, len(applied))
		for _, f := range applied {
			held[f] = true
		}
		var done, failed [][]any
		var keys []string
		for i := range runs {
			r := &runs[i]
			if !held[r.Head] {
				continue
			}
			keys = append(keys, r.Key)
			for _, id := range r.Done {
				var fence any // a run member: blocked
				if id == r.Head.ID {
					fence = r.Head.Attempts
				}
				done = append(done, []any{id.String(), fence})
			}
			if k := r.Failed.Kind; k == outboxdriver.SettleRetry || k == outboxdriver.SettleDead {
				kind := 2
				if k == outboxdriver.SettleRetry {
					kind = 1
				}
				var at any
				if !r.Failed.At.IsZero() {
					at = r.Failed.At.UnixMilli()
				}
				failed = append(failed, []any{r.Failed.ID.String(), r.Head.ID.String(), kind, r.Failed.Delay.Milliseconds(), at, r.Failed.Error, r.Halt && kind == 2, r.Head.Attempts})
			}
		}
		live := map[string]int{}
		halted := map[string]int64{}
		if len(done) > 0 {
			q := st.done
			if p.KeepDelivered {
				q = st.keep
			}
			if err := scanEach(ctx, tx, q, []any{jsonText(done)}, func(s scanner) error {
				var k string
				if err := s.Scan(&k); err != nil {
					return err
				}
				live[k]--
				return nil
			}); err != nil {
				return err
			}
		}
		if len(failed) > 0 {
			if err := scanEach(ctx, tx, st.failed, []any{jsonText(failed)}, func(s scanner) error {
				var k, state string
				var seq int64
				var settled bool
				if err := s.Scan(&k, &seq, &state, &settled); err != nil {
					return err
				}
				switch {
				case state == string(outboxdriver.StateDead) && settled: // ContinueKey
					live[k]--
				case state == string(outboxdriver.StateDead): // HaltKey: the key waits
					halted[k] = seq
				}
				return nil
			}); err != nil {
				return err
			}
		}
		if err := d.writeKeys(ctx, tx, t, live, halted); err != nil {
			return err
		}
		return exec(ctx, tx, st.promote, jsonText(keys))
	})
	if err != nil {
		return nil, nil, d.Classify(err)
	}
	return applied, nil, nil
}

// writeKeys adds live[k] to the live count of each key and sets the
// halted_seq of each key of halted.
func (*dialect) writeKeys(ctx context.Context, tx outboxdriver.DB, t outboxdriver.Table, live map[string]int, halted map[string]int64) error {
	var rows [][]any
	for k, n := range live {
		var h any
		if s, ok := halted[k]; ok {
			h = s
		}
		rows = append(rows, []any{k, n, h})
	}
	for k, s := range halted {
		if _, ok := live[k]; !ok {
			rows = append(rows, []any{k, 0, s})
		}
	}
	if len(rows) == 0 {
		return nil
	}
	return exec(ctx, tx, runSettleTexts.Get(t).keys, jsonText(rows))
}

// scanner is the Scan of a row.
type scanner interface{ Scan(dest ...any) error }

// scanEach runs q and calls f for each row.
func scanEach(ctx context.Context, db outboxdriver.DB, q string, args []any, f func(scanner) error) error {
	rows, err := db.QueryDB(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := f(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// exec runs a statement and discards its rows.
func exec(ctx context.Context, db outboxdriver.DB, q string, args ...any) error {
	return scanEach(ctx, db, q, args, func(scanner) error { return nil })
}

// redriveOrderedSQL returns the redrive of the dead ordered messages of
// table t matching pick (a condition on its unprefixed columns): they
// become blocked again, with fresh attempts, due now, each at the place
// outboxdriver.OrderedDialect's RedriveOrdered gives (I5): the key's
// halted head (its key_seq the key's halted_seq) keeps its key_seq; any
// other (dead under the Continue policy, or a skipped head) takes a new
// key_seq after the key's last_seq, in its old order among those of its
// key redriven with it. It returns each one's key and key_seq. The keys'
// counts, last_seq and heads are written after it (redriveKeysSQL, then
// promoteSQL).
func redriveOrderedSQL(t outboxdriver.Table, pick string) string {
	tbl := quoteTable(t)
	return `UPDATE ` + tbl + ` AS o SET state = 'blocked', attempts_base = o.attempts, available_at = ` + now + `, settled_at = NULL, last_error = NULL,
    key_seq = v.seq
FROM (
    SELECT d.rid, CASE WHEN d.key_seq IS ks.halted_seq THEN d.key_seq
        ELSE ks.last_seq + row_number() OVER (PARTITION BY d.message_key, d.key_seq IS ks.halted_seq ORDER BY d.key_seq) END AS seq
    FROM (SELECT rowid AS rid, message_key, key_seq FROM ` + tbl + ` WHERE state = 'dead' AND key_seq IS NOT NULL AND ` + pick + `) AS d
    JOIN ` + keysTable(t) + ` AS ks ON ks.message_key = d.message_key) AS v
WHERE o.rowid = v.rid AND o.state = 'dead'
RETURNING message_key, key_seq`
}

// redriveKeysSQL returns the update of the key rows after a redrive: ?1 a
// JSON array of [key, key_seq] of the redriven messages. Each counts in
// its key's live again and took a new key_seq (last_seq grows by one),
// but a halted head, which never stopped counting and kept its key_seq:
// it no longer halts its key.
func redriveKeysSQL(t outboxdriver.Table) string {
	keys := keysTable(t)
	return `UPDATE ` + keys + ` AS ks SET live = ks.live + v.n - v.unhalt, last_seq = ks.last_seq + v.n - v.unhalt,
    halted_seq = CASE WHEN v.unhalt > 0 THEN NULL ELSE ks.halted_seq END
FROM (SELECT r.value->>0 AS k, count(*) AS n, sum(r.value->>1 IS kk.halted_seq) AS unhalt
      FROM json_each(?1) r JOIN ` + keys + ` kk ON kk.message_key = r.value->>0 GROUP BY 1) AS v
WHERE ks.message_key = v.k RETURNING 1`
}

// redriveOrdered redrives, on transaction tx, the dead ordered messages
// that q (redriveOrderedSQL) picks, each at its place in its key (I5),
// re-counts them in their keys and gives the keys left without a head
// their first blocked message: a redriven message re-enters its key at
// its place, never beside the key's head.
func redriveOrdered(ctx context.Context, tx outboxdriver.DB, t outboxdriver.Table, q string, args ...any) (int64, error) {
	var redriven [][]any
	var keys []string
	if err := scanEach(ctx, tx, q, args, func(s scanner) error {
		var k string
		var seq int64
		if err := s.Scan(&k, &seq); err != nil {
			return err
		}
		redriven, keys = append(redriven, []any{k, seq}), append(keys, k)
		return nil
	}); err != nil || len(redriven) == 0 {
		return 0, err
	}
	if err := exec(ctx, tx, redriveKeysSQL(t), jsonText(redriven)); err != nil {
		return 0, err
	}
	slices.Sort(keys)
	if err := exec(ctx, tx, promoteSQL(t), jsonText(slices.Compact(keys))); err != nil {
		return 0, err
	}
	return int64(len(redriven)), nil
}

// RedriveOrdered redrives, in one transaction, the dead unordered
// messages of topic ("" for all) as Redrive does, and its dead ordered
// ones at their places in their keys (redriveOrderedSQL).
func (d *dialect) RedriveOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, topic string) (int64, error) {
	var n int64
	err := inTx(ctx, db, func(tx outboxdriver.DB) error {
		un, err := count(ctx, tx, `UPDATE `+quoteTable(t)+` SET state = 'pending', attempts_base = attempts, available_at = `+now+`, settled_at = NULL, last_error = NULL
WHERE state = 'dead' AND key_seq IS NULL AND (?1 = '' OR topic = ?1) RETURNING 1`, topic)
		if err != nil {
			return err
		}
		ord, err := redriveOrdered(ctx, tx, t, redriveOrderedSQL(t, "(?1 = '' OR topic = ?1)"), topic)
		n = un + ord
		return err
	})
	return n, d.Classify(err)
}

// skipHeadSQL returns the skip of key ?1's head dead under Halt, when ?2
// is empty or that head's id: the message stays dead, settled now (Purge
// may delete it from now on); it returns its id. The key row and the
// key's next head are written after it.
func skipHeadSQL(t outboxdriver.Table) string {
	tbl := quoteTable(t)
	return `UPDATE ` + tbl + ` SET settled_at = ` + now + ` WHERE rowid = (
    SELECT o.rowid FROM ` + keysTable(t) + ` ks JOIN ` + tbl + ` o
        ON o.message_key = ks.message_key AND o.state = 'dead' AND o.key_seq = ks.halted_seq
    WHERE ks.message_key = ?1 AND (?2 = '' OR o.id = ?2))
RETURNING id`
}

func (d *dialect) SkipHead(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, key string, head outboxdriver.ID) (outboxdriver.ID, bool, error) {
	want := ""
	if !head.IsZero() {
		want = head.String()
	}
	var id outboxdriver.ID
	var ok bool
	err := inTx(ctx, db, func(tx outboxdriver.DB) error {
		ok = false
		err := scanEach(ctx, tx, skipHeadSQL(t), []any{key, want}, func(s scanner) error {
			var text string
			if err := s.Scan(&text); err != nil {
				return err
			}
			var err error
			id, err = outboxdriver.ParseID(text)
			ok = err == nil
			return err
		})
		if err != nil || !ok {
			return err
		}
		// The key no longer counts it, nor waits for it.
		if err := exec(ctx, tx, `UPDATE `+keysTable(t)+` SET live = live - 1, halted_seq = NULL WHERE message_key = ?1`, key); err != nil {
			return err
		}
		return exec(ctx, tx, promoteSQL(t), jsonText([]string{key}))
	})
	if err != nil {
		return outboxdriver.ID{}, false, d.Classify(err)
	}
	return id, ok, nil
}

// orderedStatsSQL returns, per topic: blocked messages, held keys (a head
// of the topic with messages behind it), blocked keys (a head of the topic
// dead under Halt or pending a retry) and the age in milliseconds of the
// oldest of those heads.
func orderedStatsSQL(t outboxdriver.Table) string {
	tbl := quoteTable(t)
	const failed = `(o.state = 'dead' OR o.last_error IS NOT NULL)`
	return `SELECT topic, sub, sum(blocked), sum(held), sum(bk), max(age) FROM (
    SELECT topic, ` + subscriberOf("message_key") + ` AS sub, count(*) AS blocked, 0 AS held, 0 AS bk, 0 AS age FROM ` + tbl + ` WHERE state = 'blocked' GROUP BY 1, 2
    UNION ALL
    SELECT o.topic, ` + subscriberOf("o.message_key") + `, 0, sum(ks.live > 1), sum(` + failed + `),
        coalesce(` + now + ` - min(CASE WHEN ` + failed + ` THEN o.created_at END), 0)
    FROM ` + keysTable(t) + ` ks JOIN ` + tbl + ` o ON o.message_key = ks.message_key AND o.key_seq IS NOT NULL
        AND (o.state IN ('pending', 'processing') OR (o.state = 'dead' AND o.key_seq = ks.halted_seq))
    WHERE ks.live > 0
    GROUP BY 1, 2)
GROUP BY topic, sub ORDER BY topic, sub`
}

func (d *dialect) StatsOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) ([]outboxdriver.TopicStats, error) {
	ts, err := d.Stats(ctx, db, t)
	if err != nil {
		return nil, d.Classify(err)
	}
	ts, err = sqlbuild.OrderedStats(ctx, db, orderedStatsSQL(t), ts, time.Millisecond)
	return ts, d.Classify(err)
}

// CheckOrdered reads no row of key_seq and of the keys table, and looks
// up the trigger that numbers ordered messages: without it they would
// stay blocked, unnumbered, for ever ([outboxdriver.ErrSchemaMismatch]).
func (d *dialect) CheckOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) error {
	err := exec(ctx, db, `SELECT key_seq FROM `+quoteTable(t)+` WHERE 0`)
	if err == nil {
		err = exec(ctx, db, `SELECT message_key, last_seq, live, halted_seq FROM `+keysTable(t)+` WHERE 0`)
	}
	if err != nil {
		return fmt.Errorf("%w: %w (apply migration 0004)", outboxdriver.ErrSchemaMismatch, d.Classify(err))
	}
	n, err := count(ctx, db, `SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = ?1 AND tbl_name = ?2`, trigger(t), t.Name)
	if err != nil {
		return d.Classify(err)
	}
	if n == 0 {
		return fmt.Errorf("%w: no trigger %s on %s, which numbers ordered messages (apply migration 0004)", outboxdriver.ErrSchemaMismatch, trigger(t), t)
	}
	return nil
}
