package postgres

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// allTopics, as the topics of claimText, claimSettleText and
// orderedClaimSQL, makes a claim of every topic.
const allTopics = pgsql.AllTopics

// textArray writes ss as a PostgreSQL text[] literal (see arrayLiteral).
func textArray(ss []string) string {
	return arrayLiteral(len(ss), func(i int) (string, bool) { return ss[i], true })
}

// claimText returns the claim statement for table t.
//
// The due rows are chosen in a MATERIALIZED CTE: it is evaluated once, so
// its LIMIT holds whatever plan PostgreSQL picks; the seed's
// id IN (subquery ... LIMIT) form can be re-executed per outer row under a
// nested loop and, with SKIP LOCKED, take more rows than the limit. The
// UPDATE then finds the chosen rows with ctid = ANY(ARRAY(SELECT ctid FROM
// due)), a TID scan whatever the planner believes about the limit: with a
// generic plan (a prepared statement after five runs) it assumes LIMIT $2
// keeps 10% of the table, and a join with the CTE turned into a hash join
// over a sequential scan of the whole table. The TIDs are those of the row
// versions due locked, which no one else can change before this statement
// does; a version newer than the statement's snapshot (due re-checked a row
// another relay had just committed) is not visible to the TID scan, and the
// row is simply not claimed this time.
//
// $1 the topics, $2 limit, $3 lease in seconds, $4 max attempts. topics
// is how many topics the claim takes. With one, $1 is the topic itself:
// topic = $1, an equality the claim index (topic, available_at, id) serves
// in claim order, so due rows of other topics are never read. With more,
// $1 is a text[] literal, and due takes, per topic (a LATERAL subquery
// over unnest($1)), the first $2 due rows of that topic from the same
// index, each locked as it is read with SKIP LOCKED; the at most
// topics x $2 rows are then sorted by (available_at, id) and the first $2
// kept. So the claim keeps its order across its topics, reads and locks at
// most $2 rows per topic however many due rows of other topics (or of its
// own) stand behind them, and never sorts more than topics x $2 rows. The
// rows locked but not kept stay locked until the claim commits: another
// relay skips them for that instant. One statement text serves every
// number of topics. (A merge of per-topic index scans cannot lock lazily:
// PostgreSQL assumes no order out of a row lock, so the merge is a sort
// above the locks; and locking after the merge would make relays of the
// same topics pick the same candidates and skip each other's.)
//
// topics allTopics claims every topic (a relay with a catch-all handler):
// $1 is ” and the topics are those of the live rows, found by a skip scan
// of the claim index (a recursive CTE: the first live topic after $1, then
// the first after that, one index probe per topic), and claimed as several
// topics are. So a claim of every topic reads, per topic, one probe and at
// most $2 rows, as if every topic were registered.
func claimText(t outboxdriver.Table, topics int) string {
	return claimSQL(t, topics, false, "")
}

// claimSQL is claimText, with async its asynchronous-commit form (see
// asyncCommit).
func claimSQL(t outboxdriver.Table, topics int, async bool, limit string) string {
	return claimCTE(t, "", topics, "", async, limit, `$5`) + `
SELECT ` + claimColumns + ` FROM claimed`
}

// asyncCommit is a one-time filter (an InitPlan, evaluated once, before
// the scan it guards) that sets synchronous_commit to off for the
// statement's own transaction (set_config's is_local): the statement then
// commits without waiting for the WAL flush. Nothing else on the
// connection is changed: the setting ends with the transaction, which for
// a statement sent outside one is the statement itself. The claims and
// settles of a relay with RelayConfig.AsyncCommit carry it.
const asyncCommit = ` AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL`

// claimColumns are claimedColumns with the id as its 16 bytes
// (uuid_send): every driver passes a bytea through as it came, so the
// relay copies each id instead of parsing its text (see idDest). The
// ordered claim keeps claimedColumns.
const claimColumns = `uuid_send(id), ` + claimedTail

// claimedTail is claimedColumns after the id.
const claimedTail = `topic, coalesce(message_key, ''), payload::text, headers::text, attempts, attempts_base, ` + kindClaimed + `, created_at`

// claimedColumns are the columns a claim returns, none of them NULL but the
// payload and headers (so rows scan into plain strings, integers and times,
// with no per-row allocation for a NULL-able wrapper): id, topic, key (empty
// for none), payload, headers, attempts, attempts_base, kind, created_at.
const claimedColumns = `id::text, ` + claimedTail

// The kind of a row a claim returns, as an integer (no string to allocate
// per row): claimed, dead-lettered at claim, or a carried success that was
// not written (fenced off).
const (
	kindClaimed  = `CASE WHEN state = 'dead' THEN 1 ELSE 0 END`
	rowDead      = 1
	rowFencedOff = 2
)

// claimSettleText is claimText that also settles successes in the same
// statement, and so the same commit: $5 ids and $6 attempts (array
// literals) are deleted (or marked delivered when keep is true), fenced as in
// settleSQL; those it did not write (fenced off) are returned as rows of
// kind rowFencedOff, usually none. The claim's UPDATE
// leaves those ids alone (one whose lease lapsed may be among the due rows),
// so no row is both settled and claimed by the one statement.
func claimSettleText(t outboxdriver.Table, topics int, keep bool) string {
	return claimSettleSQL(t, topics, keep, false, "")
}

// claimSettleSQL is claimSettleText, with async its asynchronous-commit
// form (see asyncCommit) and limit, when not "", the claim's limit
// written in the text (see claimCTE).
func claimSettleSQL(t outboxdriver.Table, topics int, keep, async bool, limit string) string {
	tbl := quoteTable(t)
	done := deleteFenced(tbl, `$5`, `$6`)
	if keep {
		done = `UPDATE ` + tbl + ` AS o SET state = 'delivered', settled_at = now(), last_error = NULL FROM unnest($5::uuid[], $6::integer[]) AS v(id, attempts)` + fenceJoin
	}
	return claimCTE(t, done+` RETURNING o.id`, topics, "", async, limit, `$7`) + `
SELECT ` + claimColumns + ` FROM claimed
UNION ALL
SELECT uuid_send(f.id), '', '', NULL, NULL, f.attempts, 0, ` + strconv.Itoa(rowFencedOff) + `, now() FROM unnest($5::uuid[], $6::integer[]) AS f(id, attempts)
    WHERE f.id NOT IN (SELECT id FROM done)`
}

// claimCTE returns the claim's WITH clause: due (the rows to claim,
// locked) and claimed (the UPDATE), preceded, when done is not "", by
// done AS (done), a settle of successes.
//
// The settle runs to completion before due locks anything: due's WHERE
// counts done's rows, a one-time filter evaluated before its scan. The
// order matters with several relays. Under READ COMMITTED, FOR UPDATE SKIP
// LOCKED that meets a row another relay's claim has just committed locks
// the row's new version to re-check it, and keeps that lock until its
// statement commits even though the row no longer qualifies. A settle
// waiting for such a lock held by a statement that in turn waits for this
// one's locks would deadlock (it did, about once in seven four-relay
// drains: PostgreSQL broke the cycle after deadlock_timeout); with every
// settle ahead of every lock, a statement that waits holds no lock another
// settle needs.
//
// more adds columns to claimed's RETURNING list (", o.key_seq" for the
// ordered claim). async adds asyncCommit to due's WHERE. win, when not
// "", is the parameter holding the claim's window (see windowStart).
//
// limit, when not "", is the claim's limit as a literal (see
// literalClaims): due's LIMIT is written in the text, and claimed still
// takes at most $2 of due's rows, which the caller passes equal to it.
func claimCTE(t outboxdriver.Table, done string, topics int, more string, async bool, limit, win string) string {
	tbl := quoteTable(t)
	take := `ARRAY(SELECT ctid FROM due)`
	if limit == "" {
		limit = `$2`
	} else {
		take = `ARRAY(SELECT ctid FROM due LIMIT $2)`
	}
	// spent: the row had its $4 attempts since its last redrive.
	const spent = `o.attempts - o.attempts_base >= $4`
	with, after, skip := `WITH `, "", ""
	// The one topic, or each of several (see claimText).
	topic, list := `topic = $1`, `unnest($1::text[]) AS t(topic)`
	if topics > 1 || topics == allTopics {
		topic = `topic = t.topic`
	}
	live := ""
	if topics == allTopics {
		with = `WITH RECURSIVE `
		live = `live AS (
    (SELECT topic FROM ` + tbl + ` WHERE topic > $1::text AND state IN ('pending', 'processing') ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT o.topic FROM ` + tbl + ` AS o WHERE o.topic > live.topic AND o.state IN ('pending', 'processing') ORDER BY o.topic LIMIT 1)
    FROM live WHERE live.topic IS NOT NULL),
`
		list = `live AS t(topic)`
	}
	if done != "" {
		with += `done AS (` + done + `),
`
		after = `
      AND (SELECT count(*) FROM done) >= 0`
		skip = ` AND o.id <> ALL($5::uuid[])`
	}
	if async {
		after += asyncCommit
	}
	// The claim's window (ClaimParams.Recent), when it has one.
	if win != "" {
		win = ` AND available_at >= ` + windowStart(win)
	}
	if topics == allTopics && win != "" {
		live = strings.Replace(live, `state IN ('pending', 'processing') ORDER BY topic`, `state IN ('pending', 'processing') AND available_at <= now()`+win+` ORDER BY topic`, 1)
		live = strings.Replace(live, `o.state IN ('pending', 'processing') ORDER BY o.topic`, `o.state IN ('pending', 'processing') AND o.available_at <= now()`+strings.Replace(win, `available_at`, `o.available_at`, 1)+` ORDER BY o.topic`, 1)
	}
	after = win + after
	due := `SELECT ctid FROM ` + tbl + `
    WHERE ` + topic + ` AND state IN ('pending', 'processing') AND available_at <= now()` + after + `
    ORDER BY available_at, id
    LIMIT ` + limit + `
    FOR UPDATE SKIP LOCKED`
	if topics > 1 || topics == allTopics {
		due = `SELECT x.ctid FROM ` + list + ` CROSS JOIN LATERAL (
    SELECT ctid, available_at, id FROM ` + tbl + `
    WHERE ` + topic + ` AND state IN ('pending', 'processing') AND available_at <= now()` + after + `
    ORDER BY available_at, id
    LIMIT ` + limit + `
    FOR UPDATE SKIP LOCKED) AS x
    ORDER BY x.available_at, x.id
    LIMIT ` + limit
	}
	return with + live + `due AS MATERIALIZED (
    ` + due + `),
claimed AS (
    UPDATE ` + tbl + ` AS o SET
        state        = CASE WHEN ` + spent + ` THEN 'dead' ELSE 'processing' END,
        attempts     = CASE WHEN ` + spent + ` THEN o.attempts ELSE o.attempts + 1 END,
        available_at = CASE WHEN ` + spent + ` THEN o.available_at ELSE now() + make_interval(secs => $3::float8) END,
        settled_at   = CASE WHEN ` + spent + ` THEN now() END,
        last_error   = CASE WHEN ` + spent + ` THEN 'max attempts reached' ELSE o.last_error END
    WHERE o.ctid = ANY (` + take + `)` + skip + `
    RETURNING o.id, o.topic, o.message_key, o.payload, o.headers, o.attempts, o.attempts_base, o.state, o.created_at` + more + `)`
}

// windowStart is the start of a claim's window of $n seconds
// (ClaimParams.Recent), the whole index for 0. The claim index
// (topic, available_at, id) serves it as the lower bound of its range: a
// windowed claim never reads the entries before it, those of rows deleted
// long ago that VACUUM cannot remove while an old snapshot is open.
func windowStart(n string) string {
	return `CASE WHEN ` + n + `::float8 > 0 THEN now() - make_interval(secs => ` + n + `::float8) ELSE '-infinity' END`
}

// relayTexts caches the relay's statements per table (built once, not on
// every claim, settle and renewal).
type relayTexts struct {
	claim  *sqlbuild.Texts[claimTexts]
	settle *sqlbuild.Texts[[2]settleTexts] // [1]: with asyncCommit
	renew  *sqlbuild.Texts[string]
	purge  *sqlbuild.Texts[string]
}

// claimTexts are a claim's statements, indexed by topicForm: claimText,
// and claimSettleText deleting or keeping the successes.
type claimTexts struct {
	claim, claimDelete, claimKeep [3]string
	// The same with asynchronous commit (ClaimParams.AsyncCommit).
	claimAsync, claimDeleteAsync, claimKeepAsync [3]string
}

// buildClaimTexts builds a table's claimTexts, with the limit written in
// the text when limit is not "" (see literalClaims).
func buildClaimTexts(t outboxdriver.Table, limit string) claimTexts {
	var c claimTexts
	for form, topics := range topicForms {
		c.claim[form] = claimSQL(t, topics, false, limit)
		c.claimDelete[form] = claimSettleSQL(t, topics, false, false, limit)
		c.claimKeep[form] = claimSettleSQL(t, topics, true, false, limit)
		c.claimAsync[form] = claimSQL(t, topics, true, limit)
		c.claimDeleteAsync[form] = claimSettleSQL(t, topics, false, true, limit)
		c.claimKeepAsync[form] = claimSettleSQL(t, topics, true, true, limit)
	}
	return c
}

// literalClaims caches claim statements whose LIMIT is written in the
// text, for the first maxLiteralLimits (table, limit) pairs a dialect
// claims with; other claims use the statements with LIMIT $2.
//
// Why: a prepared claim with LIMIT $2 has, as a generic plan, a LIMIT the
// planner guesses at 10% of the table's rows; behind a large backlog that
// plan looks far dearer than a custom plan for LIMIT 100, so PostgreSQL
// planned the statement anew on every run (pg_prepared_statements: 0
// generic, 500 custom plans over a 50,000-message drain; about 0.5 ms of
// planning per claim of 100, some 5 µs of server CPU per message). With
// the limit in the text the generic plan is as cheap as a custom one and
// is kept after five runs (TestClaimGenericPlan). A relay claims with
// the same limit, its batch size, whenever it has slots for a batch, so a
// handful of texts per table covers it.
type literalClaims struct {
	m sync.Map // literalKey -> *claimTexts
	n atomic.Int32
}

type literalKey struct {
	t     outboxdriver.Table
	limit int
}

// maxLiteralLimits bounds the literal claim texts per dialect value (each
// is prepared once per connection that runs it).
const maxLiteralLimits = 16

// claimTexts returns the claim statements for t and a claim of limit
// rows: those with the limit in their text when they are cached or there
// is room for them, else those with LIMIT $2.
func (d *dialect) claimTexts(t outboxdriver.Table, limit int) claimTexts {
	k := literalKey{t, limit}
	if v, ok := d.literal.m.Load(k); ok {
		return *v.(*claimTexts)
	}
	// n grows only while below the bound: at most the bound plus the
	// claims racing for the last place.
	if limit >= 1 && d.literal.n.Load() < maxLiteralLimits && d.literal.n.Add(1) <= maxLiteralLimits {
		c := buildClaimTexts(t, strconv.Itoa(limit))
		v, _ := d.literal.m.LoadOrStore(k, &c)
		return *v.(*claimTexts)
	}
	return d.texts.claim.Get(t)
}

// topicForms are the topics argument of claimText for each topicForm.
var topicForms = [3]int{1, 2, allTopics}

// topicForm is 0 for a claim of one topic, 1 for several, 2 for every
// topic.
func topicForm(p outboxdriver.ClaimParams) int {
	switch {
	case p.AllTopics:
		return 2
	case len(p.Topics) == 1:
		return 0
	}
	return 1
}

// topicsArg is claimText's $1 for the claim p in topic form form.
func topicsArg(p outboxdriver.ClaimParams, form int) any {
	switch form {
	case 0:
		return p.Topics[0]
	case 2:
		return ""
	}
	return textArray(p.Topics)
}

// settleTexts are settleSQL's statements.
type settleTexts struct {
	deleteDone, markDelivered, retry, markDead, deleteDead string
}

func newTexts() relayTexts {
	return relayTexts{
		claim: sqlbuild.NewTexts(func(t outboxdriver.Table) claimTexts { return buildClaimTexts(t, "") }),
		settle: sqlbuild.NewTexts(func(t outboxdriver.Table) [2]settleTexts {
			var st [2]settleTexts
			st[0].deleteDone, st[0].markDelivered, st[0].retry, st[0].markDead, st[0].deleteDead = settleSQL(t)
			// Each settleSQL statement ends in fencedOff's WHERE, so the
			// filter appends to it (TestAsyncCommitStatements runs each).
			st[1] = settleTexts{st[0].deleteDone + asyncCommit, st[0].markDelivered + asyncCommit, st[0].retry + asyncCommit,
				st[0].markDead + asyncCommit, st[0].deleteDead + asyncCommit}
			return st
		}),
		renew: sqlbuild.NewTexts(renewSQL),
		purge: sqlbuild.NewTexts(purgeSQL),
	}
}

func (d *dialect) Claim(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	ct, form := d.claimTexts(t, p.Limit), topicForm(p)
	q := ct.claim[form]
	if p.AsyncCommit {
		q = ct.claimAsync[form]
	}
	args := []any{topicsArg(p, form), p.Limit, p.Lease.Seconds(), p.MaxAttempts}
	if len(p.Done) > 0 {
		switch {
		case p.KeepDelivered && p.AsyncCommit:
			q = ct.claimKeepAsync[form]
		case p.KeepDelivered:
			q = ct.claimKeep[form]
		case p.AsyncCommit:
			q = ct.claimDeleteAsync[form]
		default:
			q = ct.claimDelete[form]
		}
		ids, attempts := fenceArrays(p.Done)
		args = append(args, ids, attempts)
	}
	args = append(args, p.Recent.Seconds())
	rows, err := db.QueryDB(ctx, q, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	// Scanned in place, through variables declared once: per row, only
	// the key (when set) is allocated; the id is decoded from the driver's
	// bytes, the topic is one of p.Topics, and the payload and headers are
	// copied into the claim's buffers (see bytesDest).
	claimed := make([]outboxdriver.Claimed, 0, p.Limit)
	var off []outboxdriver.Fence
	var c outboxdriver.Claimed
	var kind int
	var arena []byte
	dest := []any{idDest{&c.ID}, topicDest{&c.Topic, p.Topics}, &c.Key, bytesDest{&c.Payload, &arena}, bytesDest{&c.Headers, &arena}, &c.Attempts, &c.AttemptsBase, &kind, &c.CreatedAt}
	for rows.Next() {
		c = outboxdriver.Claimed{}
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, err
		}
		if kind == rowFencedOff {
			off = append(off, outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts})
			continue
		}
		c.Dead = kind == rowDead
		claimed = append(claimed, c)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	var done []outboxdriver.Fence
	if len(p.Done) > 0 {
		// p.Done itself when none was fenced off (usually): the relay
		// reads it before it reuses its buffer (see Claim's doc).
		done = applied(p.Done, off)
	}
	return claimed, done, nil
}

// idDest scans an id, its 16 bytes (uuid_send(id), a bytea) or its text
// form (id::text), into an ID without making a string of it first: pgx
// hands ScanBytes its own buffer (its BytesScanner), database/sql drivers
// call Scan.
type idDest struct{ id *outboxdriver.ID }

func (d idDest) ScanBytes(b []byte) error {
	if len(b) == len(d.id) {
		*d.id = outboxdriver.ID(b)
		return nil
	}
	return d.id.UnmarshalText(b)
}

func (d idDest) Scan(src any) error {
	switch v := src.(type) {
	case []byte:
		return d.ScanBytes(v)
	case string:
		id, err := outboxdriver.ParseID(v)
		*d.id = id
		return err
	}
	return fmt.Errorf("outbox: scan id: unexpected %T", src)
}

// bytesDest scans a payload or headers column (NULL gives nil) into a
// slice of a claim's buffer, arena, rather than an allocation per row: the
// text is appended to the buffer while it fits, and a buffer that is full
// is left to the rows that point into it (a new one, twice as large up to
// maxArena, takes the next rows; a text over a quarter of maxArena gets an
// allocation of its own). Each slice is capped at its length, so a handler
// appending to its payload copies it instead of writing over the next
// row's. A handler that keeps a payload keeps its buffer (maxArena at
// most) alive.
type bytesDest struct {
	p     *[]byte
	arena *[]byte
}

// minArena and maxArena bound the size of one buffer of bytesDest.
const (
	minArena = 1 << 10
	maxArena = 16 << 10
)

func (d bytesDest) ScanBytes(b []byte) error {
	switch {
	case b == nil:
		*d.p = nil
		return nil
	case len(b) == 0:
		*d.p = []byte{}
		return nil
	case len(b) > maxArena/4:
		*d.p = bytes.Clone(b)
		return nil
	}
	a := *d.arena
	if len(b) > cap(a)-len(a) {
		a = make([]byte, 0, max(len(b), min(maxArena, max(minArena, 2*cap(a)))))
	}
	start := len(a)
	a = append(a, b...)
	*d.arena = a
	*d.p = a[start:len(a):len(a)]
	return nil
}

func (d bytesDest) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*d.p = nil
		return nil
	case []byte:
		return d.ScanBytes(v)
	case string:
		return d.ScanBytes([]byte(v))
	}
	return fmt.Errorf("outbox: scan payload: unexpected %T", src)
}

// topicDest scans a topic into a string, reusing the claim's topic strings
// (every claimed row has one of them) instead of allocating one per row.
type topicDest struct {
	s      *string
	topics []string
}

func (d topicDest) ScanBytes(b []byte) error {
	for _, t := range d.topics {
		if string(b) == t {
			*d.s = t
			return nil
		}
	}
	*d.s = string(b)
	return nil
}

func (d topicDest) Scan(src any) error {
	switch v := src.(type) {
	case []byte:
		return d.ScanBytes(v)
	case string:
		*d.s = v
		return nil
	}
	return fmt.Errorf("outbox: scan topic: unexpected %T", src)
}

// arrayLiteral writes a PostgreSQL array literal of n elements; elem gives
// the text of element i, or ok false for NULL. Passed as one text parameter
// and cast in SQL, it works with every driver and keeps the statement text
// constant whatever the batch size, so prepared statements are reused.
func arrayLiteral(n int, elem func(i int) (string, bool)) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		s, ok := elem(i)
		if !ok {
			b.WriteString("NULL")
			continue
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

// fenceArrays returns the ids and attempts of fences as array literals.
func fenceArrays(fences []outboxdriver.Fence) (ids, attempts string) {
	// Written directly: ids and integers need no quoting in an array
	// literal. Into strings.Builders, which return their bytes without a
	// copy; the id literal's length is known.
	var bi, ba strings.Builder
	bi.Grow(1 + 37*max(len(fences), 1))
	ba.Grow(2 + 4*len(fences))
	var id [36]byte
	var num [20]byte
	bi.WriteByte('{')
	ba.WriteByte('{')
	for i, f := range fences {
		if i > 0 {
			bi.WriteByte(',')
			ba.WriteByte(',')
		}
		bi.Write(f.ID.AppendText(id[:0]))
		ba.Write(strconv.AppendInt(num[:0], int64(f.Attempts), 10))
	}
	bi.WriteByte('}')
	ba.WriteByte('}')
	return bi.String(), ba.String()
}

// fenceJoin joins the fences, unnested from $1 (ids) and $2 (attempts)
// as v, to the rows still processing. The join on the primary key finds
// each row with one index probe (a semi-join against the unnested pairs
// would compare every pair with every row).
const fenceJoin = ` WHERE o.id = v.id AND o.attempts = v.attempts AND o.state = 'processing'`

// deleteFenced is the delete of successes, fenced like fenceJoin, ids in
// parameter ids and attempts in attempts, with no join: a row is read
// only through the primary key at one of the ids (id = ANY), and its
// attempts looked up at the id's place in the array. A join leaves the
// plan to the statistics, which a held MVCC horizon makes lie (VACUUM
// removes nothing and leaves the indexes' statistics where they were), and
// the joined delete's generic plan then read a whole index of dead
// entries (docs/internals.md, "A held MVCC horizon"). The state is
// concatenated with the empty string so that no partial index on the
// state (the claim index) is implied: the planner, believing that index
// nearly empty, chose to read it whole over the primary key's probes.
func deleteFenced(tbl, ids, attempts string) string {
	return `DELETE FROM ` + tbl + ` AS o WHERE o.id = ANY(` + ids + `::uuid[]) AND o.state || '' = 'processing' AND o.attempts = (` + attempts + `::integer[])[array_position(` + ids + `::uuid[], o.id)]`
}

// fenceReturning returns the fences a renewal wrote (renewals are few: the
// leases of handlers running for a third of the lease).
const fenceReturning = ` RETURNING o.id::text, o.attempts`

// fencedOff wraps a settle statement that returns the ids it wrote
// (RETURNING o.id) so that it returns the fences it did not write instead:
// those of $1 (ids) and $2 (attempts) missing from its RETURNING. Every
// fence is usually written, so the statement usually returns no row, and
// the relay reads nothing back per message (see applied).
func fencedOff(stmt string) string {
	return `WITH s AS (` + stmt + ` RETURNING o.id)
SELECT f.id::text, f.attempts FROM unnest($1::uuid[], $2::integer[]) AS f(id, attempts) WHERE f.id NOT IN (SELECT id FROM s)`
}

// applied returns the fences of all that are not among fenced (what a
// fencedOff statement returned): all itself when none was fenced off.
func applied(all, fenced []outboxdriver.Fence) []outboxdriver.Fence {
	if len(fenced) == 0 {
		return all
	}
	off := make(map[outboxdriver.ID]bool, len(fenced))
	for _, f := range fenced {
		off[f.ID] = true
	}
	out := make([]outboxdriver.Fence, 0, len(all)-len(fenced))
	for _, f := range all {
		if !off[f.ID] {
			out = append(out, f)
		}
	}
	return out
}

// settleSQL returns the fenced settle statements for table t: done (delete
// or mark delivered), retry, dead (mark or delete). Each takes $1 ids
// (uuid[] literal) and $2 attempts (integer[] literal); retry also takes
// $3 delays in seconds, $4 absolute times and $5 errors; dead takes $3 errors.
// Each returns the (id, attempts) pairs it did not write (see fencedOff).
func settleSQL(t outboxdriver.Table) (deleteDone, markDelivered, retry, markDead, deleteDead string) {
	tbl := quoteTable(t)
	const pairs = ` unnest($1::uuid[], $2::integer[]) AS v(id, attempts)`
	deleteDone = fencedOff(deleteFenced(tbl, `$1`, `$2`))
	markDelivered = fencedOff(`UPDATE ` + tbl + ` AS o SET state = 'delivered', settled_at = now(), last_error = NULL FROM` + pairs + fenceJoin)
	retry = fencedOff(`UPDATE ` + tbl + ` AS o SET state = 'pending', last_error = v.err,
    available_at = CASE WHEN v.at IS NULL THEN now() + make_interval(secs => v.delay) ELSE greatest(now(), v.at) END
FROM unnest($1::uuid[], $2::integer[], $3::float8[], $4::timestamptz[], $5::text[]) AS v(id, attempts, delay, at, err)` + fenceJoin)
	markDead = fencedOff(`UPDATE ` + tbl + ` AS o SET state = 'dead', settled_at = now(), last_error = v.err
FROM unnest($1::uuid[], $2::integer[], $3::text[]) AS v(id, attempts, err)` + fenceJoin)
	deleteDead = fencedOff(`DELETE FROM ` + tbl + ` AS o USING` + pairs + ` WHERE o.id = v.id AND o.attempts = v.attempts AND o.state IN ('processing', 'dead')`)
	return
}

func (d *dialect) Settle(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.SettleParams, s []outboxdriver.Settlement) ([]outboxdriver.Fence, error) {
	done, retry, dead := sqlbuild.ByKind(s)
	sts := d.texts.settle.Get(t)
	st := &sts[0]
	if p.AsyncCommit {
		st = &sts[1] // each statement ends with asyncCommit
	}
	deleteDone, markDelivered, retrySQL, markDead, deleteDead := st.deleteDone, st.markDelivered, st.retry, st.markDead, st.deleteDead
	var written []outboxdriver.Fence
	run := func(xs []outboxdriver.Settlement, q string, extra ...func(x *outboxdriver.Settlement) (string, bool)) error {
		if len(xs) == 0 {
			return nil
		}
		fences := sqlbuild.FencesOf(xs)
		ids, attempts := fenceArrays(fences)
		args := []any{ids, attempts}
		for _, f := range extra {
			args = append(args, arrayLiteral(len(xs), func(i int) (string, bool) { return f(&xs[i]) }))
		}
		off, err := sqlbuild.Fences(ctx, db, q, args...)
		if err != nil {
			return err
		}
		written = append(written, applied(fences, off)...)
		return nil
	}
	errText := func(x *outboxdriver.Settlement) (string, bool) { return x.Error, true }
	q := deleteDone
	if p.KeepDelivered {
		q = markDelivered
	}
	if err := run(done, q); err != nil {
		return written, fmt.Errorf("settle done: %w", err)
	}
	err := run(retry, retrySQL,
		func(x *outboxdriver.Settlement) (string, bool) {
			return strconv.FormatFloat(x.Delay.Seconds(), 'f', -1, 64), true
		},
		func(x *outboxdriver.Settlement) (string, bool) {
			return x.At.UTC().Format(time.RFC3339Nano), !x.At.IsZero()
		},
		errText)
	if err != nil {
		return written, fmt.Errorf("settle retry: %w", err)
	}
	if p.DiscardDead {
		err = run(dead, deleteDead)
	} else {
		err = run(dead, markDead, errText)
	}
	if err != nil {
		return written, fmt.Errorf("settle dead: %w", err)
	}
	return written, nil
}

// renewSQL returns the lease renewal statement: $1 ids and $2 attempts as
// in settleSQL, $3 the lease in seconds.
func renewSQL(t outboxdriver.Table) string {
	return `UPDATE ` + quoteTable(t) + ` AS o SET available_at = now() + make_interval(secs => $3::float8)
FROM unnest($1::uuid[], $2::integer[]) AS v(id, attempts)` + fenceJoin + fenceReturning
}

func (d *dialect) Renew(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, lease time.Duration, held []outboxdriver.Fence) ([]outboxdriver.Fence, error) {
	ids, attempts := fenceArrays(held)
	return sqlbuild.Fences(ctx, db, d.texts.renew.Get(t), ids, attempts, lease.Seconds())
}

func (*dialect) Redrive(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, topic string) (int64, error) {
	// attempts stays: (id, attempts) fences one claim and must never repeat.
	return sqlbuild.CountRows(ctx, db, `WITH r AS (UPDATE `+quoteTable(t)+` SET state = 'pending', attempts_base = attempts, available_at = now(), settled_at = NULL, last_error = NULL
    WHERE state = 'dead' AND ($1 = '' OR topic = $1) RETURNING 1) SELECT count(*) FROM r`, topic)
}

// purgeSQL returns one batch of a purge of table t: it deletes at most $3
// rows in the states $1 (a text[] literal; only delivered and dead are ever
// deleted) settled more than $2 seconds ago, and returns how many. $4 names
// the purge (see purgeKey).
//
// The rows are chosen, through the settled index, by id = ANY(ARRAY(SELECT
// ... LIMIT $3)): the array is built once, so the batch never exceeds its
// LIMIT whatever the plan (the planner may flatten id IN (SELECT ... LIMIT)
// into a join that re-runs it).
//
// One purge of a table and states at a time, across replicas: each batch
// takes pg_try_advisory_xact_lock on the purge's key, once (an InitPlan,
// the One-Time Filter of the scan), and deletes nothing when another
// session's batch holds it. The janitor of every replica purges on the same
// schedule; one of them deleting the backlog, batch after batch, while the
// others find the lock taken and return at once, bounds the write load on
// the primary whatever the number of replicas. The lock is scoped to the
// batch's transaction (no session state: it works behind PgBouncer in
// transaction mode) and keyed on the states too, so an operator's purge of
// dead messages is never turned away by a janitor purging delivered ones.
// FOR UPDATE SKIP LOCKED then keeps purges of different states, and a
// redrive or a relay's settle of a dead row, from waiting on each other's
// row locks: a batch never waits, its length is only its own work.
func purgeSQL(t outboxdriver.Table) string {
	tbl := quoteTable(t)
	return `WITH d AS (DELETE FROM ` + tbl + ` WHERE id = ANY (ARRAY(
    SELECT id FROM ` + tbl + `
    WHERE state = ANY($1::text[]) AND state IN ('delivered', 'dead') AND settled_at < now() - make_interval(secs => $2::float8)
      AND (SELECT pg_try_advisory_xact_lock(hashtext('oncommit.purge'), hashtext($4)))
    LIMIT $3
    FOR UPDATE SKIP LOCKED))
  RETURNING 1)
SELECT count(*) FROM d`
}

// purgeKey names a purge of states of table t for purgeSQL's lock.
func purgeKey(t outboxdriver.Table, states []string) string {
	return t.String() + " " + strings.Join(states, ",")
}

// Purge deletes in batches of sqlbuild.PurgeBatch rows, each its own
// statement and commit (see purgeSQL), until a batch deletes fewer or ctx
// ends: a backlog too large to delete within one command timeout is
// deleted over several purges instead of never.
func (d *dialect) Purge(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, states []outboxdriver.State, olderThan time.Duration) (int64, error) {
	ss := sqlbuild.TerminalStates(states)
	q, key, list := d.texts.purge.Get(t), purgeKey(t, ss), textArray(ss)
	return sqlbuild.Batches(ctx, sqlbuild.PurgeBatch, func() (int64, error) {
		return sqlbuild.CountRows(ctx, db, q, list, olderThan.Seconds(), sqlbuild.PurgeBatch, key)
	})
}

func (*dialect) Stats(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) ([]outboxdriver.TopicStats, error) {
	return sqlbuild.Stats(ctx, db, `SELECT topic, `+subscriberOf("message_key")+`,
    count(*) FILTER (WHERE state = 'pending'),
    count(*) FILTER (WHERE state = 'processing'),
    count(*) FILTER (WHERE state = 'delivered'),
    count(*) FILTER (WHERE state = 'dead'),
    count(*) FILTER (WHERE state = 'pending' AND available_at <= now()),
    COALESCE((EXTRACT(EPOCH FROM now() - min(available_at) FILTER (WHERE state = 'pending' AND available_at <= now())) * 1000000)::bigint, 0)
FROM `+quoteTable(t)+` GROUP BY 1, 2 ORDER BY 1, 2`, time.Microsecond)
}

// subscriberOf is the subscriber of a copy whose stored key is column
// col (see outboxdriver.SubscriberKey), empty for another message.
func subscriberOf(col string) string {
	return `CASE WHEN strpos(` + col + `, chr(31)) > 0 THEN split_part(` + col + `, chr(31), 1) ELSE '' END`
}

// ListenSQL returns the LISTEN statement for table t's channel.
func (*dialect) ListenSQL(t outboxdriver.Table) string {
	return `LISTEN "` + channel(t) + `"`
}

// oldestDueSQL returns OldestDue's statement: per topic ($1 a text[]
// literal, or every live topic when all is true, found by the claim's
// skip scan), the first due row in claim order, and of those the oldest,
// as seconds before now(), NULL when none is due; and the seconds the
// statement took (clock_timestamp() is read after the aggregate has read
// its input). It reads the claim
// index from its start, as a claim without a window does, and locks
// nothing.
func oldestDueSQL(t outboxdriver.Table, all bool) string {
	tbl := quoteTable(t)
	with, list := ``, `unnest($1::text[]) AS t(topic)`
	if all {
		with = `WITH RECURSIVE live AS (
    (SELECT topic FROM ` + tbl + ` WHERE state IN ('pending', 'processing') ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT o.topic FROM ` + tbl + ` AS o WHERE o.topic > live.topic AND o.state IN ('pending', 'processing') ORDER BY o.topic LIMIT 1)
    FROM live WHERE live.topic IS NOT NULL)
`
		list = `live AS t(topic)`
	}
	return with + `SELECT extract(epoch FROM now() - min(x.available_at))::float8, extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 FROM ` + list + ` CROSS JOIN LATERAL (
    SELECT available_at FROM ` + tbl + `
    WHERE topic = t.topic AND state IN ('pending', 'processing') AND available_at <= now()
    ORDER BY available_at, id
    LIMIT 1) AS x`
}

// OldestDue implements outboxdriver.WindowedClaimer.
func (d *dialect) OldestDue(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.ClaimParams) (outboxdriver.Due, error) {
	var args []any
	if !p.AllTopics {
		args = append(args, textArray(p.Topics))
	}
	var due outboxdriver.Due
	rows, err := db.QueryDB(ctx, oldestDueSQL(t, p.AllTopics), args...)
	if err != nil {
		return due, err
	}
	defer rows.Close()
	var age *float64
	var took float64
	for rows.Next() {
		if err := rows.Scan(&age, &took); err != nil {
			return due, err
		}
	}
	if err := rows.Err(); err != nil {
		return due, err
	}
	due.Took = time.Duration(max(took, 0) * float64(time.Second))
	if age != nil {
		due.Found, due.Age = true, time.Duration(max(*age, 0)*float64(time.Second))
	}
	return due, nil
}
