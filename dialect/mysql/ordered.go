package mysql

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds the SQL of ordered delivery (outboxdriver.OrderedDialect)
// on MySQL and MariaDB: the numbering of ordered publishes, the claim of
// heads with their runs, the settle of runs, redrive, skip and stats.
//
// A statement writes one table here, and no trigger is installed (CREATE
// TRIGGER needs SUPER, or log_bin_trust_function_creators, on a MySQL with
// binary logging). So the ordered publish is three statements on the
// caller's transaction (outboxdriver.Sequencer): Insert stores the ordered
// rows blocked without a key_seq; the first statement of
// SequenceStatements takes the key rows in key order, adding the stored
// rows to last_seq and live, under row locks held to the commit; the
// second numbers the rows from the key rows it now holds.
//
// Every write that moves a key's head (the settle of runs, redrive, skip)
// is one transaction that first locks its key rows in key order, by
// primary key (redrive and skip wait for open publishes of those keys; the
// settle of runs skips the keys another transaction holds and leaves
// their runs for later, so that an open publish delays only its own key),
// then reads what it needs with plain reads, whose snapshot InnoDB takes
// at the first of them, after the locks: they see every message the
// publishes stored. Those reads take no locks, and the writes reach rows
// by primary key (see [keys]), each fenced in its own WHERE on the
// rows it changes, so a settle never holds a gap of the key index that a
// publisher's INSERT waits for. A write changes only messages of the keys
// it locked.

var (
	_ outboxdriver.OrderedDialect = (*dialect)(nil)
	_ outboxdriver.Sequencer      = (*dialect)(nil)
)

// keysTable is the quoted table of key sequences beside t.
func keysTable(t outboxdriver.Table) string { return quoteTable(outboxdriver.KeysTable(t)) }

// keyIndex is the FORCE INDEX clause of migration 0005's key index on t.
func keyIndex(t outboxdriver.Table) string { return " FORCE INDEX (`" + t.Name + "_key_seq_idx`)" }

// normKey is a key as the columns' collation compares it: utf8mb4_bin is
// PAD SPACE, so keys that differ only by trailing spaces are one key (one
// row of the keys table, one order).
func normKey(k string) string { return strings.TrimRight(k, " ") }

// SequenceSQL returns no statement: the numbering is SequenceStatements'.
func (*dialect) SequenceSQL(outboxdriver.Table, []outboxdriver.ID) (string, []any) { return "", nil }

// SequenceStatements returns the numbering of the ordered rows among ids
// (stored blocked without a key_seq by Insert in this transaction, ids in
// publish order), for example
//
//	INSERT INTO `outbox_keys` (message_key, last_seq, live)
//	SELECT o.message_key, COUNT(*), COUNT(*) FROM (SELECT _ascii'<id>' COLLATE ascii_bin AS id, 1 AS pos UNION ALL ...) AS k
//	STRAIGHT_JOIN `outbox` AS o FORCE INDEX (PRIMARY) ON o.id = k.id
//	WHERE o.state = 'blocked' AND o.key_seq IS NULL GROUP BY o.message_key ORDER BY o.message_key
//	ON DUPLICATE KEY UPDATE last_seq = last_seq + VALUES(last_seq), live = live + VALUES(live)
//
// takes the key rows in key order (an insert of a new key, or the lock of
// an existing one), and adds the rows to last_seq and live; then
//
//	UPDATE (SELECT s.id, ROW_NUMBER() OVER (PARTITION BY s.message_key ORDER BY k.pos) AS ord,
//	        COUNT(*) OVER (PARTITION BY s.message_key) AS n FROM ... ) AS v
//	STRAIGHT_JOIN `outbox` AS o FORCE INDEX (PRIMARY) ON o.id = v.id
//	STRAIGHT_JOIN `outbox_keys` AS ks FORCE INDEX (PRIMARY) ON ks.message_key = o.message_key
//	SET o.key_seq = ks.last_seq - v.n + v.ord, o.state = IF(v.ord = 1 AND ks.live = v.n, 'pending', 'blocked')
//
// numbers them in publish order from the key rows it holds: a key's first
// message is its head (pending) when the key had no live message. Rows a
// duplicate DedupKey kept out are not among ids, so they are neither
// numbered nor counted. VALUES() in ON DUPLICATE KEY UPDATE is deprecated
// on MySQL 8.0.20+ (a warning), and the form that replaces it, a row
// alias, is not MariaDB's; both servers run VALUES().
//
// One id (the common publish of one message) takes the same two steps
// without the grouping and the window functions:
//
//	INSERT INTO `outbox_keys` (message_key, last_seq, live)
//	SELECT s.message_key, 1, 1 FROM `outbox` AS s WHERE s.id = '<id>' AND s.state = 'blocked' AND s.key_seq IS NULL
//	ON DUPLICATE KEY UPDATE last_seq = last_seq + 1, live = live + 1
//
//	UPDATE `outbox` AS o STRAIGHT_JOIN `outbox_keys` AS ks FORCE INDEX (PRIMARY) ON ks.message_key = o.message_key
//	SET o.key_seq = ks.last_seq, o.state = IF(ks.live = 1, 'pending', 'blocked')
//	WHERE o.id = '<id>' AND o.state = 'blocked' AND o.key_seq IS NULL
func (*dialect) SequenceStatements(t outboxdriver.Table, ids []outboxdriver.ID) []outboxdriver.Statement {
	tbl := quoteTable(t)
	if len(ids) == 1 {
		one := "s.id = '" + ids[0].String() + "' AND s.state = 'blocked' AND s.key_seq IS NULL"
		return []outboxdriver.Statement{
			{Query: "INSERT INTO " + keysTable(t) + " (message_key, last_seq, live)\nSELECT s.message_key, 1, 1 FROM " + tbl + " AS s WHERE " + one +
				"\nON DUPLICATE KEY UPDATE last_seq = last_seq + 1, live = live + 1"},
			{Query: "UPDATE " + tbl + " AS o STRAIGHT_JOIN " + keysTable(t) + " AS ks FORCE INDEX (PRIMARY) ON ks.message_key = o.message_key\n" +
				"SET o.key_seq = ks.last_seq, o.state = IF(ks.live = 1, 'pending', 'blocked')\nWHERE " + strings.ReplaceAll(one, "s.", "o.")},
		}
	}
	var from strings.Builder
	from.WriteByte('(')
	for i, id := range ids {
		if i > 0 {
			from.WriteString(" UNION ALL ")
		}
		from.WriteString("SELECT _ascii'" + id.String() + "'")
		if i == 0 {
			from.WriteString(" COLLATE ascii_bin AS id, 1 AS pos")
		} else {
			from.WriteString(", " + strconv.Itoa(i+1))
		}
	}
	from.WriteString(") AS k STRAIGHT_JOIN " + tbl + " AS s FORCE INDEX (PRIMARY) ON s.id = k.id\nWHERE s.state = 'blocked' AND s.key_seq IS NULL")
	return []outboxdriver.Statement{
		{Query: "INSERT INTO " + keysTable(t) + " (message_key, last_seq, live)\nSELECT s.message_key, COUNT(*), COUNT(*) FROM " + from.String() +
			" GROUP BY s.message_key ORDER BY s.message_key\nON DUPLICATE KEY UPDATE last_seq = last_seq + VALUES(last_seq), live = live + VALUES(live)"},
		{Query: "UPDATE (SELECT s.id, ROW_NUMBER() OVER (PARTITION BY s.message_key ORDER BY k.pos) AS ord, COUNT(*) OVER (PARTITION BY s.message_key) AS n\n    FROM " +
			from.String() + ") AS v\nSTRAIGHT_JOIN " + tbl + " AS o FORCE INDEX (PRIMARY) ON o.id = v.id\nSTRAIGHT_JOIN " + keysTable(t) +
			" AS ks FORCE INDEX (PRIMARY) ON ks.message_key = o.message_key\nSET o.key_seq = ks.last_seq - v.n + v.ord, o.state = IF(v.ord = 1 AND ks.live = v.n, 'pending', 'blocked')"},
	}
}

// runHead is a claimed ordered head whose run is read.
type runHead struct {
	id  outboxdriver.ID
	key string
	seq int64
}

// runSQL returns the read of the runs of claimed ordered heads: for each
// head, the blocked messages after it in its key (at most limit, through
// the key index), cut before the first that is not due or whose topic is
// not among topics (nil: every topic); then the members of all runs shared
// round-robin (every head's first, then every head's second...), at most
// limit, so that each run stays a prefix of its key. Rows: head id, then
// the claimed columns and key_seq. It is a plain read.
func runSQL(t outboxdriver.Table, heads []runHead, topics []string, limit int) string {
	tbl, lim := quoteTable(t), strconv.Itoa(limit)
	var ok strings.Builder
	ok.WriteString("b.available_at <= " + now)
	if topics != nil {
		ok.WriteString(" AND CAST(b.topic AS BINARY) IN (")
		for i, topic := range topics {
			if i > 0 {
				ok.WriteString(", ")
			}
			binary(&ok, topic)
		}
		ok.WriteByte(')')
	}
	var b strings.Builder
	b.WriteString("SELECT x.head, x.id, x.topic, x.message_key, x.payload, x.headers, x.attempts, x.attempts_base, x.created, x.key_seq FROM (\n" +
		"  SELECT r.*, MIN(r.ok) OVER (PARTITION BY r.head ORDER BY r.key_seq) AS run, ROW_NUMBER() OVER (PARTITION BY r.head ORDER BY r.key_seq) AS pos FROM (")
	for i, h := range heads {
		if i > 0 {
			b.WriteString("\n    UNION ALL")
		}
		b.WriteString("\n    (SELECT _ascii'" + h.id.String() + "' AS head, b.id, b.topic, b.message_key, b.payload, b.headers, b.attempts, b.attempts_base," +
			" TIMESTAMPDIFF(MICROSECOND, '1970-01-01', b.created_at) AS created, b.key_seq, " + ok.String() + " AS ok\n     FROM " + tbl + " AS b" + keyIndex(t) +
			" WHERE b.message_key = ")
		text(&b, h.key)
		b.WriteString(" AND b.key_seq > " + strconv.FormatInt(h.seq, 10) + " AND b.state = 'blocked' ORDER BY b.key_seq LIMIT " + lim + ")")
	}
	b.WriteString(") AS r) AS x\nWHERE x.run = 1 ORDER BY x.pos, x.head LIMIT " + lim)
	return b.String()
}

// ClaimOrdered settles p.Done and claims as Claim does, in one short
// transaction, with the key_seq of each claimed row and never
// dead-lettering; then it reads the runs of the claimed ordered heads
// (runSQL), a plain read after the commit: a run is blocked messages of a
// key whose head this claim now holds, and while it is held nothing but a
// publisher changes them (it appends committed messages after them). When
// the read fails, the claim has committed all the same: its heads come back
// when their lease lapses, with their runs.
func (d *dialect) ClaimOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.ClaimParams, runLimit int) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	p.MaxAttempts = math.MaxInt
	claimed, done, err := d.claimTx(ctx, db, t, p, true)
	if err != nil || runLimit <= 0 {
		return claimed, done, err
	}
	at := make(map[outboxdriver.ID]int, len(claimed))
	var heads []runHead
	for i := range claimed {
		if c := &claimed[i]; c.KeySeq > 0 {
			at[c.ID] = i
			heads = append(heads, runHead{c.ID, c.Key, c.KeySeq})
		}
	}
	if len(heads) == 0 {
		return claimed, done, nil
	}
	topics := p.Topics
	if p.AllTopics {
		topics = nil
	}
	rows, err := db.QueryDB(ctx, runSQL(t, heads, topics, runLimit))
	if err != nil {
		return nil, done, err
	}
	for rows.Next() {
		var c outboxdriver.Claimed
		var head, id string
		var created int64
		if err := rows.Scan(&head, &id, &c.Topic, &c.Key, &c.Payload, &c.Headers, &c.Attempts, &c.AttemptsBase, &created, &c.KeySeq); err != nil {
			rows.Close()
			return nil, done, err
		}
		h, err := outboxdriver.ParseID(head)
		if err == nil {
			c.ID, err = outboxdriver.ParseID(id)
		}
		if err != nil {
			rows.Close()
			return nil, done, err
		}
		c.CreatedAt = time.UnixMicro(created).UTC()
		if i, ok := at[h]; ok { // rows come in key_seq order within a run
			claimed[i].Run = append(claimed[i].Run, c)
		}
	}
	if err := closeRows(rows); err != nil {
		return nil, done, err
	}
	return claimed, done, nil
}

// keyList writes keys, sorted and without repeats, as a list of literals.
func keyList(b *strings.Builder, keys []string) {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	for i, k := range slices.Compact(keys) {
		if i > 0 {
			b.WriteString(", ")
		}
		text(b, k)
	}
}

// keyRows writes how the writes of ordered delivery reach key rows: a
// derived table v of keys, sorted and without repeats, joined first to
// the keys table (as ks) by primary key,
//
//	(SELECT <key> AS k UNION ALL SELECT <key> ...) AS v
//	STRAIGHT_JOIN `outbox_keys` AS ks FORCE INDEX (PRIMARY) ON ks.message_key = v.k
//
// so that each key row is one unique lookup (eq_ref), taken in key order,
// and no other key row is read or locked. A WHERE message_key IN (...)
// does not promise this: when the list is most of a small table, MariaDB
// scans the whole primary key, and a locking scan locks (and waits for)
// every key row it passes, such as the row of a key whose publisher's
// transaction is open: the write would then wait for a key it skipped.
func keyRows(b *strings.Builder, t outboxdriver.Table, ks []string) {
	ks = slices.Clone(ks)
	slices.Sort(ks)
	b.WriteByte('(')
	for i, k := range slices.Compact(ks) {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString("SELECT ")
		text(b, k)
		if i == 0 {
			b.WriteString(" AS k")
		}
	}
	b.WriteString(") AS v STRAIGHT_JOIN " + keysTable(t) + " AS ks FORCE INDEX (PRIMARY) ON ks.message_key = v.k")
}

// lockKeysSQL returns the first statement of every write that can move a
// key's head: it locks the key rows of keys in key order, by primary key
// (keyRows: no other key row, no gap), and reads their last_seq and
// halted_seq. Without skipLocked it waits for open publishes of those keys
// to commit (redrive, skip); with skipLocked (the settle of runs) it skips
// the key rows another transaction holds and returns only those it
// locked.
func lockKeysSQL(t outboxdriver.Table, keys []string, skipLocked bool) string {
	var b strings.Builder
	b.WriteString("SELECT ks.message_key, ks.last_seq, ks.halted_seq FROM ")
	keyRows(&b, t, keys)
	b.WriteString(" FOR UPDATE")
	if skipLocked {
		b.WriteString(" SKIP LOCKED")
	}
	return b.String()
}

// keyRow is a key row that a write has locked.
type keyRow struct {
	last   int64 // last_seq
	halted int64 // halted_seq; 0 for none (key_seq values start at 1)
}

// lockKeys runs lockKeysSQL and returns the rows it locked, by normKey.
func lockKeys(ctx context.Context, tx outboxdriver.DB, t outboxdriver.Table, keys []string, skipLocked bool) (map[string]keyRow, error) {
	rows, err := tx.QueryDB(ctx, lockKeysSQL(t, keys, skipLocked))
	if err != nil {
		return nil, err
	}
	locked := make(map[string]keyRow, len(keys))
	for rows.Next() {
		var k string
		var r keyRow
		var h *int64
		if err := rows.Scan(&k, &r.last, &h); err != nil {
			rows.Close()
			return nil, err
		}
		if h != nil {
			r.halted = *h
		}
		locked[normKey(k)] = r
	}
	return locked, closeRows(rows)

}

// failure is a failed message of a held run.
type failure struct {
	id   outboxdriver.ID
	head outboxdriver.Fence // the run's head
	s    outboxdriver.Settlement
	halt bool
}

// runFence writes the WHERE of a write of messages of the held runs
// headed by heads: the fence of each row, checked by the write itself on
// the row version it changes (I2): a head must still be processing with
// its claimed attempts, any other message (a run member) still blocked.
func runFence(b *strings.Builder, heads []outboxdriver.Fence) {
	b.WriteString("\nWHERE CASE o.id")
	for _, h := range heads {
		b.WriteString(" WHEN '" + h.ID.String() + "' THEN o.state = 'processing' AND o.attempts = " + strconv.Itoa(h.Attempts))
	}
	b.WriteString(" ELSE o.state = 'blocked' END")
}

// runFailedSQL returns the write of the failed messages of held runs, by
// primary key, fenced (runFence): a retry makes the message its key's
// head again (pending after its delay, attempts + 1 for a run member), a
// dead one is dead (settled_at NULL under Halt, so that Purge never
// deletes a halted head, whose key would wait for it forever).
func runFailedSQL(t outboxdriver.Table, fs []failure) string {
	var b strings.Builder
	ids := make([]outboxdriver.ID, len(fs))
	for i := range fs {
		ids[i] = fs[i].id
	}
	each := func(col string, v func(b *strings.Builder, f *failure)) {
		b.WriteString(",\n    o." + col + " = CASE o.id")
		for i := range fs {
			b.WriteString(" WHEN '" + fs[i].id.String() + "' THEN ")
			v(&b, &fs[i])
		}
		b.WriteString(" END")
	}
	b.WriteString("UPDATE ")
	keys(&b, t, ids)
	b.WriteString(" SET o.last_error = CASE o.id")
	for i := range fs {
		b.WriteString(" WHEN '" + fs[i].id.String() + "' THEN ")
		text(&b, fs[i].s.Error)
	}
	b.WriteString(" END")
	retry := func(f *failure) bool { return f.s.Kind == outboxdriver.SettleRetry }
	each("state", func(b *strings.Builder, f *failure) {
		if retry(f) {
			b.WriteString("'pending'")
		} else {
			b.WriteString("'dead'")
		}
	})
	each("attempts", func(b *strings.Builder, f *failure) {
		if f.id == f.head.ID {
			b.WriteString("o.attempts")
		} else {
			b.WriteString("o.attempts + 1")
		}
	})
	each("available_at", func(b *strings.Builder, f *failure) {
		switch {
		case !retry(f):
			b.WriteString("o.available_at")
		case f.s.At.IsZero():
			b.WriteString(now + " + ")
			micros(b, f.s.Delay)
		default:
			b.WriteString("GREATEST(" + now + ", '" + clampTime(f.s.At).Format(datetime) + "')")
		}
	})
	each("settled_at", func(b *strings.Builder, f *failure) {
		if retry(f) || f.halt {
			b.WriteString("NULL")
		} else {
			b.WriteString(now)
		}
	})
	heads := make([]outboxdriver.Fence, len(fs))
	for i := range fs {
		heads[i] = fs[i].head
	}
	runFence(&b, heads)
	return b.String()
}

// keyChange is what a write does to a key row: live changes by n,
// last_seq grows by seq (the key_seq values a redrive gave), and halted
// (when set) becomes its halted_seq: the key_seq of message haltedBy, or
// NULL when unhalt.
type keyChange struct {
	key      string
	n, seq   int
	haltedBy outboxdriver.ID
	unhalt   bool
}

// keysUpdateSQL returns the update of key rows after a write (see
// keyChange): by primary key (keyRows), each assignment reading only its
// own column.
func keysUpdateSQL(t outboxdriver.Table, cs []keyChange) string {
	var b strings.Builder
	add := func(col string, v func(c *keyChange) int) {
		b.WriteString("ks." + col + " = ks." + col + " + CASE ks.message_key")
		for i := range cs {
			b.WriteString(" WHEN ")
			text(&b, cs[i].key)
			b.WriteString(" THEN " + strconv.Itoa(v(&cs[i])))
		}
		b.WriteString(" ELSE 0 END")
	}
	ks := make([]string, len(cs))
	for i := range cs {
		ks[i] = cs[i].key
	}
	b.WriteString("UPDATE ")
	keyRows(&b, t, ks)
	b.WriteString("\nSET ")
	add("live", func(c *keyChange) int { return c.n })
	if slices.ContainsFunc(cs, func(c keyChange) bool { return c.seq != 0 }) {
		b.WriteString(",\n    ")
		add("last_seq", func(c *keyChange) int { return c.seq })
	}
	first := true
	for _, c := range cs {
		if c.haltedBy.IsZero() && !c.unhalt {
			continue
		}
		if first {
			b.WriteString(",\n    ks.halted_seq = CASE ks.message_key")
			first = false
		}
		b.WriteString(" WHEN ")
		text(&b, c.key)
		if c.unhalt {
			b.WriteString(" THEN NULL")
		} else {
			b.WriteString(" THEN (SELECT s.key_seq FROM " + quoteTable(t) + " AS s WHERE s.id = '" + c.haltedBy.String() + "')")
		}
	}
	if !first {
		b.WriteString(" ELSE ks.halted_seq END")
	}
	return b.String()
}

// nextSQL returns the read of the first blocked message of each of keys,
// in key_seq order, through the key index (a plain read): the messages
// that become heads when their keys have none.
func nextSQL(t outboxdriver.Table, keys []string) string {
	return perKey(t, "b", "b.id, b.message_key", " AND b.key_seq > 0 AND b.state = 'blocked' ORDER BY b.key_seq LIMIT 1)", keys)
}

// headsSQL returns the read of the keys among keys that have a head (a
// pending or processing ordered message), a plain read through the key
// index: it walks a key's ordered messages up to its head.
func headsSQL(t outboxdriver.Table, keys []string) string {
	return perKey(t, "h", "h.message_key", " AND h.key_seq > 0 AND h.state IN ('pending', 'processing') LIMIT 1)", keys)
}

// perKey returns the UNION ALL, one parenthesized read of cols per key of
// keys, of t aliased as alias through the key index, where the key is the
// message_key and tail follows (closing the parenthesis).
func perKey(t outboxdriver.Table, alias, cols, tail string, keys []string) string {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString("\nUNION ALL ")
		}
		b.WriteString("(SELECT " + cols + " FROM " + quoteTable(t) + " AS " + alias + keyIndex(t) + " WHERE " + alias + ".message_key = ")
		text(&b, k)
		b.WriteString(tail)
	}
	return b.String()
}

// promote gives each of keys its first blocked message as its head
// (pending), in tx after the keys are locked. With check, only keys that
// have no head and are not halted (halted, by normKey) are given one: a
// redrive or a skip; a settle knows its keys have none.
func promote(ctx context.Context, tx outboxdriver.DB, t outboxdriver.Table, ks []string, check bool, halted map[string]bool) error {
	slices.Sort(ks)
	ks = slices.Compact(ks)
	if check {
		has := map[string]bool{}
		if err := scanStrings(ctx, tx, headsSQL(t, ks), func(k ...string) { has[normKey(k[0])] = true }, 1); err != nil {
			return err
		}
		ks = slices.DeleteFunc(ks, func(k string) bool { return has[normKey(k)] || halted[normKey(k)] })
	}
	if len(ks) == 0 {
		return nil
	}
	var ids []outboxdriver.ID
	if err := scanStrings(ctx, tx, nextSQL(t, ks), func(s ...string) {
		if id, err := outboxdriver.ParseID(s[0]); err == nil {
			ids = append(ids, id)
		}
	}, 2); err != nil || len(ids) == 0 {
		return err
	}
	var b strings.Builder
	b.WriteString("UPDATE ")
	keys(&b, t, ids)
	b.WriteString(" SET o.state = 'pending' WHERE o.state = 'blocked'")
	return exec(ctx, tx, b.String())
}

// scanStrings runs q and calls f with the n text columns of each row.
func scanStrings(ctx context.Context, db outboxdriver.DB, q string, f func(s ...string), n int) error {
	rows, err := db.QueryDB(ctx, q)
	if err != nil {
		return err
	}
	s := make([]string, n)
	dest := make([]any, n)
	for i := range s {
		dest[i] = &s[i]
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return err
		}
		f(s...)
	}
	return closeRows(rows)
}

// runDoneSQL returns the write of the successes ids of held runs whose
// heads are heads, by primary key, fenced (runFence): deleted, or marked
// delivered with keep, without their key_seq (so that a key's delivered
// history is out of the key index's ranges).
func runDoneSQL(t outboxdriver.Table, ids []outboxdriver.ID, heads []outboxdriver.Fence, keep bool) string {
	var b strings.Builder
	if keep {
		b.WriteString("UPDATE ")
		keys(&b, t, ids)
		b.WriteString(" SET o.state = 'delivered', o.settled_at = " + now + ", o.last_error = NULL, o.key_seq = NULL")
	} else {
		b.WriteString("DELETE o FROM ")
		keys(&b, t, ids)
	}
	runFence(&b, heads)
	return b.String()
}

// SettleRuns writes the outcomes in one transaction: it locks the runs'
// key rows in key order, skipping those another transaction holds
// (lockKeysSQL with SKIP LOCKED: an open publish of the key, a redrive, a
// skip, another settle), whose runs it returns in busy, untouched. Then
// it locks the heads of the others (lockSQL), and for the runs whose head
// still holds writes their successes (runDoneSQL) and failures
// (runFailedSQL), each write fenced on the rows it changes, counts them in
// their keys (keysUpdateSQL) and gives the keys left without a head their
// next message (nextSQL, then an update by primary key). It never waits
// for a key row: one open publishing transaction delays only its own key.
func (d *dialect) SettleRuns(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.SettleParams, runs []outboxdriver.RunOutcome) ([]outboxdriver.Fence, []int, error) {
	if len(runs) == 0 {
		return nil, nil, nil
	}
	ks := make([]string, len(runs))
	for i := range runs {
		ks[i] = runs[i].Key
	}
	var applied []outboxdriver.Fence
	var busy []int
	err := d.inTx(ctx, db, "settle", func(tx outboxdriver.DB) error {
		applied, busy = nil, nil
		locked, err := lockKeys(ctx, tx, t, ks, true)
		if err != nil {
			return err
		}
		var mine []int
		var heads []outboxdriver.Fence
		for i := range runs {
			if _, ok := locked[normKey(runs[i].Key)]; ok {
				mine, heads = append(mine, i), append(heads, runs[i].Head)
			} else {
				busy = append(busy, i)
			}
		}
		if len(mine) == 0 {
			return nil
		}
		idx, err := held(ctx, tx, t, heads, nil)
		if err != nil || len(idx) == 0 {
			return err
		}
		var done []outboxdriver.ID
		var failed []failure
		var next []string
		change := map[string]*keyChange{}
		for _, j := range idx {
			r := &runs[mine[j]]
			applied = append(applied, r.Head)
			done = append(done, r.Done...)
			c := change[normKey(r.Key)]
			if c == nil {
				c = &keyChange{key: r.Key}
				change[normKey(r.Key)] = c
			}
			c.n -= len(r.Done)
			switch r.Failed.Kind {
			case outboxdriver.SettleRetry:
				failed = append(failed, failure{r.Failed.ID, r.Head, r.Failed, false})
			case outboxdriver.SettleDead:
				failed = append(failed, failure{r.Failed.ID, r.Head, r.Failed, r.Halt})
				if r.Halt {
					c.haltedBy = r.Failed.ID // the key waits
				} else {
					c.n--
					next = append(next, r.Key)
				}
			default:
				next = append(next, r.Key)
			}
		}
		if len(done) > 0 {
			if err := exec(ctx, tx, runDoneSQL(t, done, applied, p.KeepDelivered)); err != nil {
				return err
			}
		}
		if len(failed) > 0 {
			if err := exec(ctx, tx, runFailedSQL(t, failed)); err != nil {
				return err
			}
		}
		cs := make([]keyChange, 0, len(change))
		for _, c := range change {
			if c.n != 0 || !c.haltedBy.IsZero() {
				cs = append(cs, *c)
			}
		}
		if len(cs) > 0 {
			if err := exec(ctx, tx, keysUpdateSQL(t, cs)); err != nil {
				return err
			}
		}
		if len(next) > 0 {
			return promote(ctx, tx, t, next, false, nil)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return applied, busy, nil
}

// deadOrdered is a dead ordered message picked for a redrive.
type deadOrdered struct {
	id  outboxdriver.ID
	key string
	seq int64 // its key_seq, once locked
}

// redriveOrderedIDs redrives, in one transaction, the dead ordered
// messages of picked that are still dead: it locks their keys (lockKeysSQL,
// waiting for open publishes of those keys), then the messages, and
// changes only those whose key row it holds. Each re-enters its key at
// the place outboxdriver.OrderedDialect's RedriveOrdered gives (I5): the
// key's halted head keeps its key_seq and no longer halts the key (it
// never stopped counting in live); any other takes a new key_seq after
// the key's last_seq, in its old order among those redriven with it
// (last_seq and live grow by one for each). All become blocked with
// fresh attempts, and each key left without a head, and not halted by a
// head not redriven, gets its first blocked message as its head. It
// returns how many it redrove.
func (d *dialect) redriveOrderedIDs(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, picked []deadOrdered) (int64, error) {
	ids, ks := make([]outboxdriver.ID, len(picked)), make([]string, len(picked))
	for i, m := range picked {
		ids[i], ks[i] = m.id, m.key
	}
	var n int64
	err := d.inTx(ctx, db, "redrive", func(tx outboxdriver.DB) error {
		n = 0
		locked, err := lockKeys(ctx, tx, t, ks, false)
		if err != nil {
			return err
		}
		var b strings.Builder
		b.WriteString("SELECT o.id, o.message_key, o.key_seq FROM ")
		keys(&b, t, ids)
		b.WriteString(" WHERE o.state = 'dead' AND o.key_seq IS NOT NULL FOR UPDATE")
		rows, err := tx.QueryDB(ctx, b.String())
		if err != nil {
			return err
		}
		var still []deadOrdered
		for rows.Next() {
			var m deadOrdered
			var id string
			if err := rows.Scan(&id, &m.key, &m.seq); err != nil {
				rows.Close()
				return err
			}
			if m.id, err = outboxdriver.ParseID(id); err != nil {
				rows.Close()
				return err
			}
			if _, ok := locked[normKey(m.key)]; ok { // never a message whose key row this transaction does not hold
				still = append(still, m)
			}
		}
		if err := closeRows(rows); err != nil || len(still) == 0 {
			return err
		}
		// Each key's redriven messages in their old order: the new
		// key_seq values follow it.
		slices.SortFunc(still, func(a, b deadOrdered) int {
			return cmp.Or(strings.Compare(normKey(a.key), normKey(b.key)), cmp.Compare(a.seq, b.seq))
		})
		change := map[string]*keyChange{}
		var cs []*keyChange
		var touched []string
		var renumbered []deadOrdered
		for _, m := range still {
			nk := normKey(m.key)
			c := change[nk]
			if c == nil {
				c = &keyChange{key: m.key}
				change[nk], cs = c, append(cs, c)
			}
			touched = append(touched, m.key)
			if k := locked[nk]; k.halted != 0 && k.halted == m.seq {
				c.unhalt = true
				continue
			}
			c.n++
			c.seq++
			m.seq = locked[nk].last + int64(c.seq)
			renumbered = append(renumbered, m)
		}
		b.Reset()
		b.WriteString("UPDATE ")
		keys(&b, t, idsOf(still))
		b.WriteString(" SET o.state = 'blocked', o.attempts_base = o.attempts, o.available_at = " + now + ", o.settled_at = NULL, o.last_error = NULL")
		if len(renumbered) > 0 {
			b.WriteString(",\n    o.key_seq = CASE o.id")
			for _, m := range renumbered {
				b.WriteString(" WHEN '" + m.id.String() + "' THEN " + strconv.FormatInt(m.seq, 10))
			}
			b.WriteString(" ELSE o.key_seq END")
		}
		b.WriteString("\nWHERE o.state = 'dead'")
		if err := exec(ctx, tx, b.String()); err != nil {
			return err
		}
		kcs := make([]keyChange, len(cs))
		halted := map[string]bool{}
		for i, c := range cs {
			kcs[i] = *c
		}
		for nk, k := range locked {
			if k.halted != 0 && (change[nk] == nil || !change[nk].unhalt) {
				halted[nk] = true
			}
		}
		if err := exec(ctx, tx, keysUpdateSQL(t, kcs)); err != nil {
			return err
		}
		n = int64(len(still))
		return promote(ctx, tx, t, touched, true, halted)
	})
	return n, err
}

// idsOf returns the ids of ms.
func idsOf(ms []deadOrdered) []outboxdriver.ID {
	ids := make([]outboxdriver.ID, len(ms))
	for i := range ms {
		ids[i] = ms[i].id
	}
	return ids
}

// redriveOrderedBatches redrives the dead ordered messages that find (a
// plain read of id and message_key, at most opBatch rows in id order, of
// messages still dead) lists, a batch per transaction, until find comes
// back short or a batch redrives nothing.
func (d *dialect) redriveOrderedBatches(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, find string) (int64, error) {
	var total int64
	for {
		var picked []deadOrdered
		err := scanStrings(ctx, db, find, func(s ...string) {
			if id, err := outboxdriver.ParseID(s[0]); err == nil {
				picked = append(picked, deadOrdered{id: id, key: s[1]})
			}
		}, 2)
		if err != nil || len(picked) == 0 {
			return total, err
		}
		n, err := d.redriveOrderedIDs(ctx, db, t, picked)
		total += n
		if err != nil || len(picked) < opBatch || n == 0 {
			return total, err
		}
	}
}

// deadOrderedSQL returns the find of a redrive of dead ordered messages
// matching cond (a condition on unprefixed columns): their ids and keys,
// at most opBatch, in id order (a read of the primary key: MySQL has no
// partial index of dead rows).
func deadOrderedSQL(t outboxdriver.Table, cond string) string {
	return "SELECT id, message_key FROM " + quoteTable(t) + " WHERE state = 'dead' AND key_seq IS NOT NULL AND " + cond +
		" ORDER BY id LIMIT " + strconv.Itoa(opBatch)
}

// RedriveOrdered redrives the dead unordered messages of topic ("" for
// all) as Redrive does, then its dead ordered ones at their places in their
// keys (redriveOrderedIDs), a batch per transaction.
func (d *dialect) RedriveOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, topic string) (int64, error) {
	find, revive := redriveSQL(t, topic, " AND key_seq IS NULL")
	n, err := d.batched(ctx, db, "redrive", find, revive)
	if err != nil {
		return n, err
	}
	var cond strings.Builder
	cond.WriteString("TRUE")
	if topic != "" {
		cond.WriteString(" AND " + topicIs + "= ")
		binary(&cond, topic)
	}
	m, err := d.redriveOrderedBatches(ctx, db, t, deadOrderedSQL(t, cond.String()))
	return n + m, err
}

// SkipHead skips key's head dead under Halt, when head is zero or that
// head's id, in one transaction: it locks the key's row, finds the dead
// message at its halted_seq, marks it settled now (Purge may delete it from
// now on), makes the key no longer halted nor count it, and gives the key
// its first blocked message as its head.
func (d *dialect) SkipHead(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, key string, head outboxdriver.ID) (outboxdriver.ID, bool, error) {
	var id outboxdriver.ID
	var ok bool
	err := d.inTx(ctx, db, "skip", func(tx outboxdriver.DB) error {
		id, ok = outboxdriver.ID{}, false
		locked, err := lockKeys(ctx, tx, t, []string{key}, false)
		if err != nil {
			return err
		}
		seq := locked[normKey(key)].halted
		if seq == 0 {
			return nil
		}
		var b strings.Builder
		b.WriteString("SELECT o.id FROM " + quoteTable(t) + " AS o" + keyIndex(t) + " WHERE o.message_key = ")
		text(&b, key)
		b.WriteString(" AND o.key_seq = " + strconv.FormatInt(seq, 10) + " AND o.state = 'dead'")
		if !head.IsZero() {
			b.WriteString(" AND o.id = '" + head.String() + "'")
		}
		if err := scanStrings(ctx, tx, b.String(), func(s ...string) {
			if pid, err := outboxdriver.ParseID(s[0]); err == nil {
				id, ok = pid, true
			}
		}, 1); err != nil || !ok {
			return err
		}
		b.Reset()
		b.WriteString("UPDATE ")
		keys(&b, t, []outboxdriver.ID{id})
		b.WriteString(" SET o.settled_at = " + now + " WHERE o.state = 'dead'")
		if err := exec(ctx, tx, b.String()); err != nil {
			return err
		}
		if err := exec(ctx, tx, keysUpdateSQL(t, []keyChange{{key: key, n: -1, unhalt: true}})); err != nil {
			return err
		}
		return promote(ctx, tx, t, []string{key}, true, nil)
	})
	if err != nil {
		return outboxdriver.ID{}, false, err
	}
	return id, ok, nil
}

// orderedStatsSQL returns, per topic (its bytes): blocked messages, held
// keys (a head of the topic with messages behind it), blocked keys (a head
// of the topic dead under Halt or pending a retry) and the age in
// microseconds of the oldest of those heads.
func orderedStatsSQL(t outboxdriver.Table) string {
	tbl := quoteTable(t)
	const failed = `(o.state = 'dead' OR o.last_error IS NOT NULL)`
	return `SELECT topic, sub, SUM(blocked), SUM(held), SUM(bk), MAX(age) FROM (
    SELECT ` + topicIs + `AS topic, ` + subscriberOf("message_key") + ` AS sub, COUNT(*) AS blocked, 0 AS held, 0 AS bk, 0 AS age FROM ` + tbl + ` WHERE state = 'blocked' GROUP BY 1, 2
    UNION ALL
    SELECT CAST(o.topic AS BINARY), ` + subscriberOf("o.message_key") + `, 0, SUM(ks.live > 1), SUM(` + failed + `),
        COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN ` + failed + ` THEN o.created_at END), ` + now + `), 0)
    FROM ` + keysTable(t) + ` AS ks STRAIGHT_JOIN ` + tbl + ` AS o` + keyIndex(t) + ` ON o.message_key = ks.message_key AND o.key_seq > 0
        AND (o.state IN ('pending', 'processing') OR (o.state = 'dead' AND o.key_seq = ks.halted_seq))
    WHERE ks.live > 0
    GROUP BY 1, 2) AS x
GROUP BY topic, sub ORDER BY topic, sub`
}

func (d *dialect) StatsOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) ([]outboxdriver.TopicStats, error) {
	ts, err := d.Stats(ctx, db, t)
	if err != nil {
		return nil, err
	}
	return sqlbuild.OrderedStats(ctx, db, orderedStatsSQL(t), ts, time.Microsecond)
}

// CheckOrdered reads no row of key_seq and of the keys table: an unknown
// column (1054) or table (1146) is [outboxdriver.ErrSchemaMismatch].
func (d *dialect) CheckOrdered(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) error {
	err := exec(ctx, db, "SELECT key_seq FROM "+quoteTable(t)+" WHERE FALSE")
	if err == nil {
		err = exec(ctx, db, "SELECT message_key, last_seq, live, halted_seq FROM "+keysTable(t)+" WHERE FALSE")
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == errBadField || me.Number == errNoSuchTable) {
		return fmt.Errorf("%w: %w (apply migrations 0005 and 0006)", outboxdriver.ErrSchemaMismatch, err)
	}
	return d.Classify(err)
}
