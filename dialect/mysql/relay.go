package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/oncommit/oncommit/internal/backoff"
	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// lockBackoff spaces the reruns of a relay transaction after a deadlock or
// a lock wait timeout.
var lockBackoff = backoff.Policy{Base: 5 * time.Millisecond, Cap: 200 * time.Millisecond, Jitter: 1}

// inTx runs f in one transaction of db, again (up to Config.LockRetries
// times) when it fails on a deadlock or a lock wait timeout: InnoDB has
// then rolled back the statement or the whole transaction, and InTx has
// rolled back the rest, so nothing of the failed run is committed. f must
// set its results afresh on each run.
func (d *dialect) inTx(ctx context.Context, db outboxdriver.DB, op string, f func(tx outboxdriver.DB) error) error {
	tdb, ok := db.(outboxdriver.TxDB)
	if !ok {
		return fmt.Errorf("%w: the MySQL dialect needs a DB that implements outboxdriver.TxDB (such as sqltx.FromDB), not %T", outboxdriver.ErrUnsupported, db)
	}
	for retry := 1; ; retry++ {
		err := tdb.InTx(ctx, f)
		if err == nil || !lockConflict(err) || retry > d.cfg.LockRetries || ctx.Err() != nil {
			return err
		}
		if d.cfg.OnLockRetry != nil {
			d.cfg.OnLockRetry(op, retry, err)
		}
		wait := time.NewTimer(lockBackoff.Delay(retry))
		select {
		case <-ctx.Done():
			wait.Stop()
			return err
		case <-wait.C:
		}
	}
}

// claimRounds bounds the rounds of one claim: each round reads the next
// due rows without locking them and locks those no other claim holds.
const claimRounds = 4

// candidatesText returns the claim's first read: the ids of at most limit
// due rows of topics after the cursor (after.ID zero: from the start), in
// (claim_at, id) order, with claim_at in microseconds since 1970. It is a
// plain read (a consistent read, which takes no locks), so it neither
// locks other topics' rows nor gap locks that publishers' inserts would
// wait on. The claim index (topic, claim_at, id) is forced and read once
// per topic, so a claim walks only its own topics' rows, in order, and
// stops after limit rows of each. topic = ... finds the index range (the
// collation ignores trailing spaces); CAST(topic AS BINARY) keeps only the
// topic's exact bytes.
func candidatesText(t outboxdriver.Table, topics []string, after claimCursor, limit int) string {
	return candidatesSQL(t, topics, true, after, limit)
}

// candidatesAllSQL is candidatesText for a claim of every topic: topics
// are those topicsSQL found, each read as the index range of every topic
// the collation takes as equal to it (so no byte-exact comparison:
// topicsSQL returns one topic of each such group).
func candidatesAllSQL(t outboxdriver.Table, topics []string, after claimCursor, limit int) string {
	return candidatesSQL(t, topics, false, after, limit)
}

// topicsSQL returns the first read of a claim of every topic (a relay
// with a catch-all handler): the distinct topics of the claim index, a
// loose index scan (one probe per topic, whatever the rows per topic).
// MySQL has no partial index, so topics that have only delivered or dead
// rows are among them: each costs its claim one more empty index probe.
func topicsSQL(t outboxdriver.Table) string {
	return "SELECT DISTINCT topic FROM " + quoteTable(t) + " FORCE INDEX (`" + t.Name + "_claim_idx`)"
}

func candidatesSQL(t outboxdriver.Table, topics []string, exact bool, after claimCursor, limit int) string {
	one := func(b *strings.Builder, topic string) {
		b.WriteString("SELECT id, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', claim_at) AS at FROM ")
		b.WriteString(quoteTable(t))
		b.WriteString(" FORCE INDEX (`" + t.Name + "_claim_idx`)\nWHERE topic = ")
		text(b, topic)
		if exact {
			b.WriteString(" AND " + topicIs + "= ")
			binary(b, topic)
		}
		b.WriteString(" AND claim_at <= " + now)
		if !after.ID.IsZero() {
			at := "'1970-01-01' + INTERVAL " + strconv.FormatInt(after.At, 10) + " MICROSECOND"
			b.WriteString(" AND claim_at >= " + at + " AND (claim_at > " + at + " OR id > '" + after.ID.String() + "')")
		}
		b.WriteString("\nORDER BY claim_at, id LIMIT " + strconv.Itoa(limit))
	}
	var b strings.Builder
	if len(topics) == 1 {
		one(&b, topics[0])
		return b.String()
	}
	b.WriteString("SELECT id, at FROM (")
	for i, topic := range topics {
		if i > 0 {
			b.WriteString("\nUNION ALL ")
		}
		b.WriteByte('(')
		one(&b, topic)
		b.WriteByte(')')
	}
	b.WriteString(") AS c\nORDER BY at, id LIMIT " + strconv.Itoa(limit))
	return b.String()
}

// claimCursor is a position in claim order: a row's claim_at in microseconds
// since 1970 and its id.
type claimCursor struct {
	At int64
	ID outboxdriver.ID
}

// claimText returns the claim's locking read: at most limit of the
// candidate rows ids that are still due and of topics (of any topic when
// topics is nil: a claim of every topic), locked by primary key (see
// [keys]), skipping rows other transactions hold. It locks only rows
// it takes, and rows another claim has taken since the candidates were
// read (it reads them to see that they are no longer due).
func claimText(t outboxdriver.Table, topics []string, ids []outboxdriver.ID, limit int) string {
	return claimSQL(t, topics, ids, limit, false)
}

// claimSQL is claimText, with each row's key_seq (0 for none) last when seq.
func claimSQL(t outboxdriver.Table, topics []string, ids []outboxdriver.ID, limit int, seq bool) string {
	var b strings.Builder
	b.WriteString("SELECT o.id, o.topic, o.message_key, o.payload, o.headers, o.attempts, o.attempts_base, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', o.created_at)")
	if seq {
		b.WriteString(", COALESCE(o.key_seq, 0)")
	}
	b.WriteString("\nFROM ")
	keys(&b, t, ids)
	b.WriteString("\nWHERE o.claim_at <= " + now)
	if topics != nil {
		b.WriteString(" AND CAST(o.topic AS BINARY) IN (")
		for i, topic := range topics {
			if i > 0 {
				b.WriteString(", ")
			}
			binary(&b, topic)
		}
		b.WriteByte(')')
	}
	b.WriteString(" LIMIT " + strconv.Itoa(limit) + " FOR UPDATE SKIP LOCKED")
	return b.String()
}

// claimUpdateSQL returns the claim's updates of the rows its read locked:
// live rows get attempts + 1, state processing and a lease on the database
// clock; dead rows (those that already had max attempts) are dead-lettered,
// their attempts unchanged. An empty group has no statement. Each
// assignment reads only the row's old values: MySQL does not promise an
// order of assignments in a multiple-table UPDATE.
func claimUpdateSQL(t outboxdriver.Table, live, dead []outboxdriver.ID, lease time.Duration) []string {
	var out []string
	if len(live) > 0 {
		var b strings.Builder
		b.WriteString("UPDATE ")
		keys(&b, t, live)
		b.WriteString("\nSET o.state = 'processing', o.attempts = o.attempts + 1, o.available_at = " + now + " + ")
		micros(&b, lease)
		out = append(out, b.String())
	}
	if len(dead) > 0 {
		var b strings.Builder
		b.WriteString("UPDATE ")
		keys(&b, t, dead)
		b.WriteString("\nSET o.state = 'dead', o.last_error = 'max attempts reached', o.settled_at = " + now)
		out = append(out, b.String())
	}
	return out
}

// keys writes how every relay statement that reads or changes given
// rows reaches them: a derived table k of their ids joined, first, to the
// table (as o) by primary key,
//
//	(SELECT _ascii'<id>' COLLATE ascii_bin AS id UNION ALL SELECT _ascii'<id>' ...) AS k
//	STRAIGHT_JOIN `outbox` AS o FORCE INDEX (PRIMARY) ON o.id = k.id
//
// so each row is one unique lookup (eq_ref) and no other row is read or
// locked. A plain WHERE id IN (...) does not promise this: on a small
// table, or when the list is most of it, MariaDB scans the table, and a
// locking scan locks (and waits for) every row it passes, such as a row a
// publisher has just inserted or a duplicate publish holds.
func keys(b *strings.Builder, t outboxdriver.Table, ids []outboxdriver.ID) {
	b.WriteByte('(')
	for i, id := range ids {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString("SELECT _ascii'")
		b.WriteString(id.String())
		b.WriteByte('\'')
		if i == 0 {
			b.WriteString(" COLLATE ascii_bin AS id")
		}
	}
	b.WriteString(") AS k STRAIGHT_JOIN " + quoteTable(t) + " AS o FORCE INDEX (PRIMARY) ON o.id = k.id")
}

// Claim runs one short transaction: it settles p.Done (fenced, as in
// Settle), then claims, then commits. Successes are settled first, so a
// success whose lease lapsed is not claimed again by the same transaction.
// The claim reads twice as many of the next due rows as it still needs
// with candidatesText (no locks), locks those still due that no one holds
// with claimText, up to the number it needs, and repeats from after the
// last candidate while it has fewer than p.Limit rows and more may be due
// (at most claimRounds rounds); then claimUpdateSQL marks the rows it
// locked. It locks only the rows it takes (and rows another claim took
// since its read, which it leaves as they are), so claims of one topic
// never hold up claims of another, and publishers never wait for a claim.
func (d *dialect) Claim(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	return d.claimTx(ctx, db, t, p, false)
}

// claimTx is Claim, with each claimed row's key_seq when seq.
func (d *dialect) claimTx(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.ClaimParams, seq bool) ([]outboxdriver.Claimed, []outboxdriver.Fence, error) {
	var claimed []outboxdriver.Claimed
	var done []outboxdriver.Fence
	s := sqlbuild.Successes(p.Done)
	err := d.fenced(ctx, db, "claim", func(tx outboxdriver.DB, exact bool) error {
		claimed, done = nil, nil
		if len(s) > 0 {
			var err error
			if done, err = settle(ctx, tx, t, outboxdriver.SettleParams{KeepDelivered: p.KeepDelivered}, s, exact); err != nil {
				return err
			}
		}
		var err error
		claimed, err = claim(ctx, tx, t, p, seq)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return claimed, done, nil
}

// errStaleFence reports that a fenced write changed fewer rows than it had
// settlements: some fence did not hold, and the transaction is run again
// the exact way to learn which.
var errStaleFence = errors.New("mysql: a fence did not hold")

// fenced runs f in a transaction (see inTx), first with exact false: f
// writes settlements with fenced statements and checks only the count of
// rows they changed, one statement per kind. When a fence did not hold (f
// returns errStaleFence), it runs f again with exact true: f then locks the
// rows and checks each fence before writing.
func (d *dialect) fenced(ctx context.Context, db outboxdriver.DB, op string, f func(tx outboxdriver.DB, exact bool) error) error {
	err := d.inTx(ctx, db, op, func(tx outboxdriver.DB) error { return f(tx, false) })
	if errors.Is(err, errStaleFence) {
		err = d.inTx(ctx, db, op, func(tx outboxdriver.DB) error { return f(tx, true) })
	}
	return err
}

// claim claims up to p.Limit rows in tx (see Claim), with their key_seq
// when seq.
func claim(ctx context.Context, tx outboxdriver.DB, t outboxdriver.Table, p outboxdriver.ClaimParams, seq bool) ([]outboxdriver.Claimed, error) {
	var out []outboxdriver.Claimed
	var after claimCursor
	topics, candSQL := p.Topics, candidatesText
	if p.AllTopics {
		var err error
		if topics, err = allTopics(ctx, tx, t); err != nil || len(topics) == 0 {
			return nil, err
		}
		candSQL = candidatesAllSQL
		p.Topics = nil // the locking read takes any topic
	}
	for range claimRounds {
		need := p.Limit - len(out)
		// Twice as many candidates as rows wanted: concurrent claims read
		// the same first candidates, and each locks those left free.
		cands, err := candidates(ctx, tx, candSQL(t, topics, after, 2*need))
		if err != nil || len(cands) == 0 {
			if err != nil {
				return nil, err
			}
			break
		}
		ids := make([]outboxdriver.ID, len(cands))
		order := make(map[outboxdriver.ID]int, len(cands))
		for i, c := range cands {
			ids[i], order[c.ID] = c.ID, i
		}
		got, err := lockDue(ctx, tx, t, p, ids, need, seq)
		if err != nil {
			return nil, err
		}
		slices.SortFunc(got, func(a, b outboxdriver.Claimed) int { return order[a.ID] - order[b.ID] })
		out = append(out, got...)
		if len(out) >= p.Limit || len(cands) < 2*need {
			break
		}
		after = cands[len(cands)-1]
	}
	if len(out) == 0 {
		return nil, nil
	}
	var live, dead []outboxdriver.ID
	for i := range out {
		if out[i].Dead {
			dead = append(dead, out[i].ID)
		} else {
			live = append(live, out[i].ID)
		}
	}
	for _, q := range claimUpdateSQL(t, live, dead, p.Lease) {
		if err := exec(ctx, tx, q); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// allTopics runs topicsSQL.
func allTopics(ctx context.Context, tx outboxdriver.DB, t outboxdriver.Table) ([]string, error) {
	rows, err := tx.QueryDB(ctx, topicsSQL(t))
	if err != nil {
		return nil, err
	}
	var out []string
	for rows.Next() {
		var topic string
		if err := rows.Scan(&topic); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, topic)
	}
	return out, closeRows(rows)
}

// candidates runs a candidatesText read.
func candidates(ctx context.Context, tx outboxdriver.DB, q string) ([]claimCursor, error) {
	rows, err := tx.QueryDB(ctx, q)
	if err != nil {
		return nil, err
	}
	var out []claimCursor
	for rows.Next() {
		var c claimCursor
		var id string
		if err := rows.Scan(&id, &c.At); err != nil {
			rows.Close()
			return nil, err
		}
		if c.ID, err = outboxdriver.ParseID(id); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, c)
	}
	return out, closeRows(rows)
}

// lockDue runs claimText on the candidates ids and returns the rows it
// locked (at most limit), attempts as the claim's update will leave them,
// with their key_seq when seq.
func lockDue(ctx context.Context, tx outboxdriver.DB, t outboxdriver.Table, p outboxdriver.ClaimParams, ids []outboxdriver.ID, limit int, seq bool) ([]outboxdriver.Claimed, error) {
	rows, err := tx.QueryDB(ctx, claimSQL(t, p.Topics, ids, limit, seq))
	if err != nil {
		return nil, err
	}
	var out []outboxdriver.Claimed
	for rows.Next() {
		var c outboxdriver.Claimed
		var id string
		var key sql.NullString
		var created int64
		dest := []any{&id, &c.Topic, &key, &c.Payload, &c.Headers, &c.Attempts, &c.AttemptsBase, &created}
		if seq {
			dest = append(dest, &c.KeySeq)
		}
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return nil, err
		}
		if c.ID, err = outboxdriver.ParseID(id); err != nil {
			rows.Close()
			return nil, err
		}
		c.Key = key.String
		c.CreatedAt = time.UnixMicro(created).UTC()
		// The rows are locked: the update sees these attempts. A row
		// that had its p.MaxAttempts since its last redrive is dead.
		if c.Attempts-c.AttemptsBase >= p.MaxAttempts {
			c.Dead = true
		} else {
			c.Attempts++
		}
		out = append(out, c)
	}
	if err := closeRows(rows); err != nil {
		return nil, err
	}
	return out, nil
}

// closeRows closes rows and returns the first error of the iteration.
func closeRows(rows outboxdriver.Rows) error {
	cerr := rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	return cerr
}

// exec runs a statement that returns no rows.
func exec(ctx context.Context, db outboxdriver.DB, q string) error {
	rows, err := db.QueryDB(ctx, q)
	if err != nil {
		return err
	}
	return closeRows(rows)
}

// lockSQL returns the locking read that fences settles and renewals: the
// current attempts and state of the rows ids, locked until the commit,
// reached by primary key (see [keys]).
func lockSQL(t outboxdriver.Table, ids []outboxdriver.ID) string {
	var b strings.Builder
	b.WriteString("SELECT o.id, o.attempts, o.state FROM ")
	keys(&b, t, ids)
	b.WriteString(" WHERE o.state IN ('processing', 'dead') FOR UPDATE")
	return b.String()
}

// held locks the rows of fences and returns, for each fence that holds, its
// index in fences. A fence holds when its row has its attempts and state
// processing, or state dead when deadOK says so for that fence (a row
// dead-lettered at claim that the relay then deletes).
func held(ctx context.Context, tx outboxdriver.DB, t outboxdriver.Table, fences []outboxdriver.Fence, deadOK func(i int) bool) ([]int, error) {
	ids := make([]outboxdriver.ID, len(fences))
	for i, f := range fences {
		ids[i] = f.ID
	}
	rows, err := tx.QueryDB(ctx, lockSQL(t, ids))
	if err != nil {
		return nil, err
	}
	type row struct {
		attempts int
		dead     bool
	}
	cur := make(map[outboxdriver.ID]row, len(fences))
	for rows.Next() {
		var id, state string
		var r row
		if err := rows.Scan(&id, &r.attempts, &state); err != nil {
			rows.Close()
			return nil, err
		}
		pid, err := outboxdriver.ParseID(id)
		if err != nil {
			rows.Close()
			return nil, err
		}
		r.dead = state == string(outboxdriver.StateDead)
		cur[pid] = r
	}
	if err := closeRows(rows); err != nil {
		return nil, err
	}
	var out []int
	for i, f := range fences {
		r, ok := cur[f.ID]
		if !ok || r.attempts != f.Attempts || (r.dead && (deadOK == nil || !deadOK(i))) {
			continue
		}
		delete(cur, f.ID) // one settle per row
		out = append(out, i)
	}
	return out, nil
}

func (d *dialect) Settle(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, p outboxdriver.SettleParams, s []outboxdriver.Settlement) ([]outboxdriver.Fence, error) {
	var applied []outboxdriver.Fence
	err := d.fenced(ctx, db, "settle", func(tx outboxdriver.DB, exact bool) error {
		var err error
		applied, err = settle(ctx, tx, t, p, s, exact)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("settle: %w", err)
	}
	return applied, nil
}

// settle writes s inside tx with at most one fenced statement per kind.
// Unless exact, it trusts the counts of rows changed (tx must be an
// outboxdriver.ExecDB): all of s applied when they add up to len(s), else it
// returns errStaleFence. When exact, it first locks the rows and keeps the
// settlements whose fence holds, so it knows which applied.
func settle(ctx context.Context, tx outboxdriver.DB, t outboxdriver.Table, p outboxdriver.SettleParams, s []outboxdriver.Settlement, exact bool) ([]outboxdriver.Fence, error) {
	if ex, ok := tx.(outboxdriver.ExecDB); ok && !exact {
		done, retry, dead := sqlbuild.ByKind(s)
		var changed int64
		for _, q := range settleSQL(t, p, done, retry, dead) {
			n, err := ex.ExecDB(ctx, q)
			if err != nil {
				return nil, err
			}
			changed += n
		}
		if changed != int64(len(s)) {
			return nil, errStaleFence
		}
		return sqlbuild.FencesOf(s), nil
	}
	idx, err := held(ctx, tx, t, sqlbuild.FencesOf(s), func(i int) bool { return s[i].Kind == outboxdriver.SettleDead && p.DiscardDead })
	if err != nil {
		return nil, err
	}
	holding := make([]outboxdriver.Settlement, len(idx))
	for k, i := range idx {
		holding[k] = s[i]
	}
	done, retry, dead := sqlbuild.ByKind(holding)
	for _, q := range settleSQL(t, p, done, retry, dead) {
		if err := exec(ctx, tx, q); err != nil {
			return nil, err
		}
	}
	return sqlbuild.FencesOf(holding), nil
}

// settleSQL returns the fenced statements that write settlements: done
// rows deleted (or marked delivered with p.KeepDelivered), retry rows made
// pending again at their new time, dead rows marked dead (or deleted with
// p.DiscardDead), each only where the row still has the settlement's
// attempts and state processing (or dead, for a dead-lettered row deleted
// with p.DiscardDead). An empty group has no statement. Each reaches its
// rows by primary key (see [keys]), so it never waits for a lock on
// another row, and reads only old values in its assignments.
func settleSQL(t outboxdriver.Table, p outboxdriver.SettleParams, done, retry, dead []outboxdriver.Settlement) []string {
	var out []string
	// from starts a statement on the rows of s, by primary key.
	from := func(b *strings.Builder, s []outboxdriver.Settlement, verb string) {
		b.WriteString(verb)
		keys(b, t, settlementIDs(s))
	}
	where := func(b *strings.Builder, s []outboxdriver.Settlement, states string) {
		b.WriteString(" WHERE o.state IN (" + states + ") AND ")
		if same := sameAttempts(s); same >= 0 {
			b.WriteString("o.attempts = " + strconv.Itoa(same))
		} else {
			b.WriteString("(o.id, o.attempts) IN (")
			for i := range s {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString("('" + s[i].ID.String() + "'," + strconv.Itoa(s[i].Attempts) + ")")
			}
			b.WriteByte(')')
		}
		out = append(out, b.String())
	}
	// Successes, the common case, are written one statement per attempts
	// value: the fence is then an integer compare per row instead of a
	// row-value IN over every pair.
	for _, group := range sqlbuild.ByAttempts(done) {
		var b strings.Builder
		if p.KeepDelivered {
			from(&b, group, "UPDATE ")
			b.WriteString(" SET o.settled_at = " + now + ", o.last_error = NULL, o.state = 'delivered'")
		} else {
			from(&b, group, "DELETE o FROM ")
		}
		where(&b, group, "'processing'")
	}
	if len(retry) > 0 {
		var b strings.Builder
		from(&b, retry, "UPDATE ")
		b.WriteString(" SET\n    o.last_error = ")
		byID(&b, retry, func(b *strings.Builder, x *outboxdriver.Settlement) { text(b, x.Error) })
		b.WriteString(",\n    o.available_at = ")
		byID(&b, retry, func(b *strings.Builder, x *outboxdriver.Settlement) {
			if x.At.IsZero() {
				b.WriteString(now + " + ")
				micros(b, x.Delay)
				return
			}
			b.WriteString("GREATEST(" + now + ", '")
			b.WriteString(clampTime(x.At).Format(datetime))
			b.WriteString("')")
		})
		b.WriteString(",\n    o.state = 'pending'\n")
		where(&b, retry, "'processing'")
	}
	if len(dead) > 0 {
		var b strings.Builder
		states := "'processing'"
		if p.DiscardDead {
			// A row dead-lettered at claim is deleted from state dead.
			states = "'processing', 'dead'"
			from(&b, dead, "DELETE o FROM ")
		} else {
			from(&b, dead, "UPDATE ")
			b.WriteString(" SET\n    o.last_error = ")
			byID(&b, dead, func(b *strings.Builder, x *outboxdriver.Settlement) { text(b, x.Error) })
			b.WriteString(",\n    o.settled_at = " + now + ",\n    o.state = 'dead'\n")
		}
		where(&b, dead, states)
	}
	return out
}

// sameAttempts returns the attempts all of s share, or -1.
func sameAttempts(s []outboxdriver.Settlement) int {
	for i := range s {
		if s[i].Attempts != s[0].Attempts {
			return -1
		}
	}
	return s[0].Attempts
}

// byID writes a CASE on id giving each settlement's value.
func byID(b *strings.Builder, s []outboxdriver.Settlement, value func(b *strings.Builder, x *outboxdriver.Settlement)) {
	b.WriteString("CASE o.id")
	for i := range s {
		b.WriteString(" WHEN '")
		b.WriteString(s[i].ID.String())
		b.WriteString("' THEN ")
		value(b, &s[i])
	}
	b.WriteString(" END")
}

func settlementIDs(s []outboxdriver.Settlement) []outboxdriver.ID {
	ids := make([]outboxdriver.ID, len(s))
	for i := range s {
		ids[i] = s[i].ID
	}
	return ids
}

// clampTime keeps t within what DATETIME(6) stores.
func clampTime(t time.Time) time.Time {
	t = t.UTC()
	if lo := time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC); t.Before(lo) {
		return lo
	}
	if hi := time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC); t.After(hi) {
		return hi
	}
	return t
}

// renewSQL returns the lease renewal of locked rows whose fences hold, by
// primary key (see [keys]).
func renewSQL(t outboxdriver.Table, ids []outboxdriver.ID, lease time.Duration) string {
	var b strings.Builder
	b.WriteString("UPDATE ")
	keys(&b, t, ids)
	b.WriteString(" SET o.available_at = " + now + " + ")
	micros(&b, lease)
	return b.String()
}

func (d *dialect) Renew(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, lease time.Duration, fences []outboxdriver.Fence) ([]outboxdriver.Fence, error) {
	var kept []outboxdriver.Fence
	err := d.inTx(ctx, db, "renew", func(tx outboxdriver.DB) error {
		kept = nil
		idx, err := held(ctx, tx, t, fences, nil)
		if err != nil || len(idx) == 0 {
			return err
		}
		ids := make([]outboxdriver.ID, len(idx))
		for j, i := range idx {
			ids[j] = fences[i].ID
			kept = append(kept, fences[i])
		}
		return exec(ctx, tx, renewSQL(t, ids, lease))
	})
	if err != nil {
		return nil, err
	}
	return kept, nil
}

// opBatch is the most rows one transaction of Redrive or Purge changes.
const opBatch = 1000

// batched runs an operation on many rows without locking a range: find, a
// plain read (a consistent read, which takes no locks), lists up to
// opBatch ids; write(ids) changes those that still qualify, by primary key,
// in a short transaction of its own. It repeats until find comes back short
// or a round changes nothing, and returns how many rows it changed
// (ROW_COUNT() on the transaction's connection).
func (d *dialect) batched(ctx context.Context, db outboxdriver.DB, op, find string, write func(ids []outboxdriver.ID) string) (int64, error) {
	var total int64
	for {
		rows, err := db.QueryDB(ctx, find)
		if err != nil {
			return total, err
		}
		var ids []outboxdriver.ID
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				rows.Close()
				return total, err
			}
			id, err := outboxdriver.ParseID(s)
			if err != nil {
				rows.Close()
				return total, err
			}
			ids = append(ids, id)
		}
		if err := closeRows(rows); err != nil || len(ids) == 0 {
			return total, err
		}
		var n int64
		err = d.inTx(ctx, db, op, func(tx outboxdriver.DB) error {
			if err := exec(ctx, tx, write(ids)); err != nil {
				return err
			}
			rows, err := tx.QueryDB(ctx, "SELECT ROW_COUNT()")
			if err != nil {
				return err
			}
			for rows.Next() {
				if err := rows.Scan(&n); err != nil {
					rows.Close()
					return err
				}
			}
			return closeRows(rows)
		})
		total += n
		if err != nil || len(ids) < opBatch || n == 0 {
			return total, err
		}
	}
}

// redriveText returns the redrive of dead rows of topic ("" for all): find
// lists dead rows (dead rows have settled_at set, so the settled_at index
// can find them), revive makes those of ids still dead pending again, due
// now, with attempts_base = attempts (attempts stays: (id, attempts) fences
// one claim and must never repeat), by primary key (see [keys]).
func redriveText(t outboxdriver.Table, topic string) (find string, revive func(ids []outboxdriver.ID) string) {
	return redriveSQL(t, topic, "")
}

// redriveSQL is redriveText of the dead rows that also match extra (" AND
// ..." or empty).
func redriveSQL(t outboxdriver.Table, topic, extra string) (find string, revive func(ids []outboxdriver.ID) string) {
	var cond strings.Builder
	cond.WriteString("settled_at IS NOT NULL AND state = 'dead'" + extra)
	if topic != "" {
		cond.WriteString(" AND " + topicIs + "= ")
		binary(&cond, topic)
	}
	find = "SELECT id FROM " + quoteTable(t) + " WHERE " + cond.String() + " LIMIT " + strconv.Itoa(opBatch)
	return find, func(ids []outboxdriver.ID) string {
		var b strings.Builder
		b.WriteString("UPDATE ")
		keys(&b, t, ids)
		b.WriteString("\nSET o.state = 'pending', o.attempts_base = o.attempts, o.available_at = " + now + ", o.settled_at = NULL, o.last_error = NULL\nWHERE " + cond.String())
		return b.String()
	}
}

func (d *dialect) Redrive(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, topic string) (int64, error) {
	find, revive := redriveText(t, topic)
	return d.batched(ctx, db, "redrive", find, revive)
}

// maxAge bounds the ages written into SQL: 200 years before now is still a
// DATETIME.
const maxAge = 200 * 365 * 24 * time.Hour

// purgeSQL returns the purge of rows in states settled more than olderThan
// ago: find lists such rows (through the settled_at index when they are
// few), remove deletes those of ids that still qualify, by primary key
// (see [keys]).
func purgeSQL(t outboxdriver.Table, states []outboxdriver.State, olderThan time.Duration) (find string, remove func(ids []outboxdriver.ID) string) {
	var cond strings.Builder
	cond.WriteString("state IN (")
	n := 0
	for _, s := range states {
		if s != outboxdriver.StateDelivered && s != outboxdriver.StateDead {
			continue // only terminal states are ever purged
		}
		if n > 0 {
			cond.WriteString(", ")
		}
		n++
		cond.WriteString("'" + string(s) + "'")
	}
	if n == 0 {
		cond.WriteString("NULL")
	}
	cond.WriteString(") AND settled_at < " + now + " - ")
	// Forever and other huge ages: keep the date within DATETIME's range.
	micros(&cond, min(olderThan, maxAge))
	find = "SELECT id FROM " + quoteTable(t) + " WHERE " + cond.String() + " LIMIT " + strconv.Itoa(opBatch)
	return find, func(ids []outboxdriver.ID) string {
		var b strings.Builder
		b.WriteString("DELETE o FROM ")
		keys(&b, t, ids)
		b.WriteString(" WHERE " + cond.String())
		return b.String()
	}
}

func (d *dialect) Purge(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, states []outboxdriver.State, olderThan time.Duration) (int64, error) {
	find, remove := purgeSQL(t, states, olderThan)
	return d.batched(ctx, db, "purge", find, remove)
}

func (*dialect) Stats(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) ([]outboxdriver.TopicStats, error) {
	// Grouped by the topic's bytes: utf8mb4_bin would merge "t" and "t ".
	return sqlbuild.Stats(ctx, db, `SELECT `+topicIs+`, `+subscriberOf("message_key")+`,
    SUM(state = 'pending'), SUM(state = 'processing'), SUM(state = 'delivered'), SUM(state = 'dead'),
    SUM(state = 'pending' AND available_at <= `+now+`),
    COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN state = 'pending' AND available_at <= `+now+` THEN available_at END), `+now+`), 0)
FROM `+quoteTable(t)+` GROUP BY 1, 2 ORDER BY 1, 2`, time.Microsecond)
}

// subscriberOf is the subscriber of a copy whose stored key is column
// col (see outboxdriver.SubscriberKey), empty for another message: ASCII,
// as bytes.
func subscriberOf(col string) string {
	return `CAST(CASE WHEN INSTR(` + col + `, CHAR(31 USING utf8mb4)) > 0 THEN SUBSTRING_INDEX(` + col + `, CHAR(31 USING utf8mb4), 1) ELSE '' END AS BINARY)`
}

// ListenSQL returns "": MySQL has no notifications; relays poll.
func (*dialect) ListenSQL(outboxdriver.Table) string { return "" }
