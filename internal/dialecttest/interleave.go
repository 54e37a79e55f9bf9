package dialecttest

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds the forced interleavings of ordered delivery: every
// pair of operations (claim, settle done / retry / dead / held, renewal,
// lease lapse and reclaim, redrive, skip, delete, purge, a publish whose
// transaction is held open), one parked after each of its statements while
// the other runs, then resumed; after each schedule the invariants of
// docs/internals.md ("Ordered delivery: states and invariants") are
// checked on the table (checkInvariants), then every key is drained and
// must deliver in key order without a key left stuck.

// world is the state a schedule starts from and the claims live in it.
//
//	K: k1 (head, claimed by relay R1: fence (k1, 1), run k2 k3), k2, k3
//	   (blocked); in the lapsed variant R1's lease has already lapsed.
//	J: j1 dead under Halt (the key's halted head), j2 blocked.
//	L: l1 dead under Continue, l2 the key's head (pending).
type world struct {
	e      *env
	g      *Gate
	db     outbox.DB
	lapsed bool
	k, j   []outbox.ID
	l      []outbox.ID
	r1     outboxdriver.Fence

	od   outboxdriver.OrderedDialect
	mu   sync.Mutex
	live map[outboxdriver.Fence]heldRun // claims held, with their runs
	// r1Ended: R1's claim was settled or reclaimed. A renewal cannot
	// apply after either in the database, but its bookkeeping may run
	// after theirs (both resume together): it must not revive the claim.
	r1Ended bool
}

// heldRun is a claimed head's key and the ids of the head and its run.
type heldRun struct {
	key string
	ids []outbox.ID
}

const (
	topicX = "x"
	topicK = "k"
)

// allTopics are the topics of the world's claims.
var allTopics = []string{topicX, topicK}

func newWorld(t *testing.T, e *env, lapsed bool) *world {
	t.Helper()
	w := &world{e: e, lapsed: lapsed, od: e.od(t), live: map[outboxdriver.Fence]heldRun{}}
	w.g = NewGate(e.DB)
	w.db = w.g.DB()
	msg := func(k string) outbox.Message { return outbox.Message{Topic: topicX, Key: k} }
	w.j = resIDs(e.publish(t, msg("J"), msg("J")))
	w.l = resIDs(e.publish(t, msg("L"), msg("L")))
	if cs := e.claimOrdered(t, 10, 10, time.Minute); len(cs) != 2 {
		t.Fatalf("setup: claimed %v", cs)
	}
	j1 := outboxdriver.Fence{ID: w.j[0], Attempts: 1}
	l1 := outboxdriver.Fence{ID: w.l[0], Attempts: 1}
	e.settleRuns(t,
		outboxdriver.RunOutcome{Head: j1, Key: "J", Failed: outboxdriver.Settlement{Fence: j1, Kind: outboxdriver.SettleDead, Error: "halt"}, Halt: true},
		outboxdriver.RunOutcome{Head: l1, Key: "L", Failed: outboxdriver.Settlement{Fence: l1, Kind: outboxdriver.SettleDead, Error: "continue"}})
	// K on a topic of its own, so that this claim takes k1 and not l2.
	k := outbox.Message{Topic: topicK, Key: "K"}
	w.k = resIDs(e.publish(t, k, k, k))
	lease := time.Minute
	if lapsed {
		lease = time.Microsecond
	}
	cs, _, err := w.od.ClaimOrdered(context.Background(), e.DB, e.ob.Table(), outboxdriver.ClaimParams{
		Topics: []string{topicK}, Limit: 1, Lease: lease, MaxAttempts: 100}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].ID != w.k[0] || len(cs[0].Run) != 2 {
		t.Fatalf("setup: claimed %v, want k1 with k2 k3", cs)
	}
	w.r1 = outboxdriver.Fence{ID: w.k[0], Attempts: 1}
	if !lapsed {
		w.live[w.r1] = heldRun{"K", w.k}
	}
	return w
}

// op is one operation of a schedule.
type op struct {
	name string
	run  func(ctx context.Context, w *world) error
}

// settleR1 writes an outcome of relay R1's claim of K: done are how many
// of k1 k2 k3 succeeded, then the next one failed with kind (0: none).
func settleR1(done int, kind outboxdriver.SettleKind, halt bool) func(ctx context.Context, w *world) error {
	return func(ctx context.Context, w *world) error {
		out := outboxdriver.RunOutcome{Head: w.r1, Key: "K", Done: w.k[:done], Halt: halt}
		if kind != 0 {
			att := 2 // a run member's stored attempts + 1
			if done == 0 {
				att = w.r1.Attempts
			}
			out.Failed = outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: w.k[done], Attempts: att}, Kind: kind, Error: "failed"}
		}
		applied, busy, err := w.od.SettleRuns(ctx, w.db, w.e.ob.Table(), outboxdriver.SettleParams{}, []outboxdriver.RunOutcome{out})
		if err != nil {
			return err
		}
		if len(busy) > 0 {
			return nil // the key was held: the relay writes it later
		}
		if len(applied) > 0 {
			w.mu.Lock()
			delete(w.live, w.r1)
			w.r1Ended = true
			w.mu.Unlock()
		}
		return nil
	}
}

// ops are the operations every pair is drawn from.
var ops = []op{
	{"claim", func(ctx context.Context, w *world) error {
		cs, _, err := w.od.ClaimOrdered(ctx, w.db, w.e.ob.Table(), outboxdriver.ClaimParams{
			Topics: allTopics, Limit: 10, Lease: time.Minute, MaxAttempts: 100}, 10)
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, c := range cs {
			ids := []outbox.ID{c.ID}
			for _, m := range c.Run {
				ids = append(ids, m.ID)
			}
			w.live[outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}] = heldRun{c.Key, ids}
			if c.ID == w.r1.ID {
				delete(w.live, w.r1) // reclaimed after its lease lapsed
				w.r1Ended = true
			}
		}
		return err
	}},
	{"settle-done", settleR1(3, 0, false)},
	{"settle-retry", settleR1(1, outboxdriver.SettleRetry, false)},
	{"settle-dead-halt", settleR1(1, outboxdriver.SettleDead, true)},
	{"settle-dead-continue", settleR1(0, outboxdriver.SettleDead, false)},
	{"renew", func(ctx context.Context, w *world) error {
		applied, err := w.e.rd.Renew(ctx, w.db, w.e.ob.Table(), time.Minute, []outboxdriver.Fence{w.r1})
		if len(applied) > 0 {
			// R1 holds K again, even after its lease had lapsed: no
			// claim had taken k1 since (the fence held).
			w.mu.Lock()
			if !w.r1Ended {
				w.live[w.r1] = heldRun{"K", w.k}
			}
			w.mu.Unlock()
		}
		return err
	}},
	{"redrive", func(ctx context.Context, w *world) error {
		_, err := w.e.ob.Redrive(ctx, w.db, "")
		return err
	}},
	{"skip", func(ctx context.Context, w *world) error {
		_, _, err := w.e.ob.SkipHead(ctx, w.db, "J")
		return err
	}},
	{"delete", func(ctx context.Context, w *world) error {
		_, err := w.e.ob.Act(ctx, w.db, outbox.ActDelete, outbox.Filter{Key: "L"}, quietAct)
		return err
	}},
	{"purge", func(ctx context.Context, w *world) error {
		_, err := w.e.ob.Purge(ctx, w.db, outbox.PurgeOptions{States: []outbox.State{outbox.StateDead}})
		return err
	}},
}

var quietAct = &outbox.ActOptions{Logger: slog.New(slog.DiscardHandler)}

// publishOp is the publish of one message to K and one to L in a
// business transaction; parked, it is held open (uncommitted) while the
// other operation runs.
const publishOp = "publish"

func (w *world) publish(t *testing.T) (commit func() error) {
	t.Helper()
	tx := w.e.Begin(t)
	if _, err := w.e.ob.PublishBatch(context.Background(), tx.Tx, []outbox.Message{{Topic: topicX, Key: "K"}, {Topic: topicX, Key: "L"}}); err != nil {
		t.Fatal(err)
	}
	return tx.Commit
}

// orderedInterleavings runs every schedule of every pair on both
// variants: the short form parks after the first statement only; under
// OUTBOX_RELIABILITY=long, after each of the first four.
func orderedInterleavings(t *testing.T, e *env) {
	parks := []int{1}
	if os.Getenv("OUTBOX_RELIABILITY") == "long" {
		parks = []int{1, 2, 3, 4}
	}
	names := []string{publishOp}
	for _, o := range ops {
		names = append(names, o.name)
	}
	schedules := 0
	for _, lapsed := range []bool{false, true} {
		for _, a := range names {
			for _, b := range names {
				if b == publishOp {
					continue // a publisher runs alone; parked as A, it is held open
				}
				for _, n := range parks {
					if a == publishOp && n > 1 {
						continue
					}
					name := fmt.Sprintf("lapsed=%v/%s@%d/%s", lapsed, a, n, b)
					if !runSchedule(t, e, name, lapsed, a, n, b) {
						break // a has fewer statements
					}
					schedules++
					if t.Failed() {
						t.Fatalf("schedule %s broke an invariant (above)", name)
					}
				}
			}
		}
	}
	t.Logf("%d schedules", schedules)
}

func opNamed(name string) op {
	for _, o := range ops {
		if o.name == name {
			return o
		}
	}
	panic("no op " + name)
}

// runSchedule runs one schedule on a fresh world: a parked after its n-th
// statement, b run to its end (or until it has waited 300ms on a lock a
// holds, then a resumed), a's end; then the invariants and a drain. It
// reports false, running nothing more, when a ends before statement n.
func runSchedule(t *testing.T, e *env, name string, lapsed bool, a string, n int, b string) bool {
	t.Helper()
	resetTables(t, e)
	w := newWorld(t, e, lapsed)
	var resume func() error
	if a == publishOp {
		resume = w.publish(t)
	} else {
		var ok bool
		resume, ok = runParked(t, w.g, "A", n, func(ctx context.Context) error { return opNamed(a).run(ctx, w) })
		if !ok {
			return false
		}
	}
	errA, errB, _ := runBlocked(w.g, "B", 100*time.Millisecond, func(ctx context.Context) error { return opNamed(b).run(ctx, w) }, resume)
	for _, err := range []error{errA, errB} {
		if err != nil && !retryable(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	checkInvariants(t, e, name, w.liveClaims())
	w.drain(t, name)
	return true
}

// retryable reports whether err is one a relay or an operator tries again
// (a deadlock or lock wait chosen as the victim, SQLite busy): not a
// broken invariant.
func retryable(err error) bool {
	s := strings.ToLower(err.Error())
	for _, m := range []string{"deadlock", "40p01", "40001", "1213", "1205", "busy", "locked"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

func (w *world) liveClaims() map[outboxdriver.Fence]heldRun {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.live)
}

// resetTables empties the outbox and keys tables of e.
func resetTables(t *testing.T, e *env) {
	t.Helper()
	for _, tbl := range []string{e.Table, e.Table + "_keys"} {
		rows, err := e.DB.QueryDB(context.Background(), `DELETE FROM `+tbl)
		if err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
}

// orderedRow is an ordered message as stored.
type orderedRow struct {
	key      string
	seq      int64
	state    string
	attempts int
}

// keyRow is a row of the keys table.
type keyRow struct {
	live, last int64
	halted     *int64
}

// readOrdered reads the ordered messages and the key rows of e's table.
func readOrdered(t *testing.T, e *env) ([]orderedRow, map[string]keyRow) {
	t.Helper()
	ctx := context.Background()
	rows, err := e.DB.QueryDB(ctx, `SELECT message_key, key_seq, state, attempts FROM `+e.Table+` WHERE key_seq IS NOT NULL ORDER BY message_key, key_seq`)
	if err != nil {
		t.Fatal(err)
	}
	var ms []orderedRow
	for rows.Next() {
		var r orderedRow
		if err := rows.Scan(&r.key, &r.seq, &r.state, &r.attempts); err != nil {
			t.Fatal(err)
		}
		r.key = strings.TrimRight(r.key, " ")
		ms = append(ms, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	rows, err = e.DB.QueryDB(ctx, `SELECT message_key, live, last_seq, halted_seq FROM `+e.Table+`_keys`)
	if err != nil {
		t.Fatal(err)
	}
	ks := map[string]keyRow{}
	for rows.Next() {
		var k string
		var r keyRow
		if err := rows.Scan(&k, &r.live, &r.last, &r.halted); err != nil {
			t.Fatal(err)
		}
		ks[strings.TrimRight(k, " ")] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	return ms, ks
}

// checkInvariants checks I1-I4 on e's table: at most one head (pending or
// processing) per key, none beside a halted head; a key with undelivered
// messages has its head or is halted by a dead message at halted_seq;
// every blocked message comes after its key's head; live counts the
// undelivered messages and the halted head; last_seq is at least every
// key_seq; and every claim a relay still holds (live) is intact: its head
// processing with the claimed attempts, its run blocked (I2: nothing else
// wrote under it).
func checkInvariants(t *testing.T, e *env, name string, live map[outboxdriver.Fence]heldRun) {
	t.Helper()
	ms, ks := readOrdered(t, e)
	type keyState struct {
		heads, undelivered  int
		headSeq, minBlocked int64
		haltedDead          bool
		maxSeq              int64
	}
	per := map[string]*keyState{}
	for _, m := range ms {
		s := per[m.key]
		if s == nil {
			s = &keyState{minBlocked: -1}
			per[m.key] = s
		}
		s.maxSeq = max(s.maxSeq, m.seq)
		switch m.state {
		case "pending", "processing":
			s.heads++
			s.undelivered++
			s.headSeq = m.seq
		case "blocked":
			s.undelivered++
			if s.minBlocked < 0 || m.seq < s.minBlocked {
				s.minBlocked = m.seq
			}
		case "dead":
			if k, ok := ks[m.key]; ok && k.halted != nil && *k.halted == m.seq {
				s.haltedDead = true
				s.headSeq = m.seq
			}
		}
	}
	for key, s := range per {
		k, ok := ks[key]
		halted := ok && k.halted != nil
		switch {
		case !ok && s.undelivered > 0:
			t.Errorf("%s: key %s has undelivered messages and no key row", name, key)
		case s.heads > 1:
			t.Errorf("%s: I1/I3: key %s has %d heads", name, key, s.heads)
		case halted && !s.haltedDead:
			t.Errorf("%s: I3: key %s is halted at %d by no dead message", name, key, *k.halted)
		case halted && s.heads > 0:
			t.Errorf("%s: I3: key %s is halted and has a head", name, key)
		case s.undelivered > 0 && s.heads == 0 && !halted:
			t.Errorf("%s: I3: key %s has %d undelivered messages, no head and is not halted", name, key, s.undelivered)
		case s.minBlocked >= 0 && (s.heads > 0 || halted) && s.minBlocked < s.headSeq:
			t.Errorf("%s: I4: key %s has a blocked message (%d) before its head (%d)", name, key, s.minBlocked, s.headSeq)
		}
		if ok {
			want := int64(s.undelivered)
			if halted {
				want++
			}
			if k.live != want {
				t.Errorf("%s: key %s counts %d live, has %d", name, key, k.live, want)
			}
			if k.last < s.maxSeq {
				t.Errorf("%s: key %s last_seq %d below a key_seq %d", name, key, k.last, s.maxSeq)
			}
		}
	}
	for f, run := range live {
		if e.count(t, idIs(f.ID)+fmt.Sprintf(" AND state = 'processing' AND attempts = %d", f.Attempts)) != 1 {
			t.Errorf("%s: I1/I2: the live claim %v was changed under its holder (%s)", name, f, e.states(t, f.ID))
		}
		for _, id := range run.ids[1:] {
			if e.count(t, idIs(id)+" AND state = 'blocked'") != 1 {
				t.Errorf("%s: I2: run member %s of the live claim %v is %s", name, id, f, e.states(t, id))
			}
		}
	}
}

// drain settles the live claims as their relays would (all done), then
// claims and settles everything due until nothing moves, skipping halted
// heads: no key may be left with undelivered messages, and each key's
// messages are delivered in key_seq order.
func (w *world) drain(t *testing.T, name string) {
	t.Helper()
	e := w.e
	var runs []outboxdriver.RunOutcome
	for f, h := range w.liveClaims() {
		runs = append(runs, outboxdriver.RunOutcome{Head: f, Key: h.key, Done: h.ids})
	}
	if len(runs) > 0 {
		e.settleRuns(t, runs...)
	}
	lastSeq := map[string]int64{}
	for round := 0; round < 50; round++ {
		for _, k := range []string{"J", "K", "L"} {
			if _, _, err := e.ob.SkipHead(context.Background(), e.DB, k); err != nil {
				t.Fatal(err)
			}
		}
		cs, _, err := e.od(t).ClaimOrdered(context.Background(), e.DB, e.ob.Table(), outboxdriver.ClaimParams{
			Topics: allTopics, Limit: 10, Lease: time.Minute, MaxAttempts: 100}, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) == 0 {
			ms, _ := readOrdered(t, e)
			for _, m := range ms {
				if m.state != "dead" {
					t.Errorf("%s: drained, but a message of key %s (key_seq %d) is %s", name, m.key, m.seq, m.state)
				}
			}
			return
		}
		runs = runs[:0]
		for _, c := range cs {
			ids := []outbox.ID{c.ID}
			seqs := []int64{c.KeySeq}
			for _, m := range c.Run {
				ids = append(ids, m.ID)
				seqs = append(seqs, m.KeySeq)
			}
			for _, s := range seqs {
				if s <= lastSeq[c.Key] {
					t.Errorf("%s: I4: key %s delivered key_seq %d after %d", name, c.Key, s, lastSeq[c.Key])
				}
				lastSeq[c.Key] = s
			}
			runs = append(runs, outboxdriver.RunOutcome{Head: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}, Key: c.Key, Done: ids})
		}
		e.settleRuns(t, runs...)
	}
	t.Errorf("%s: the drain did not end", name)
}
