package dialecttest

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds the forced interleavings of ordered delivery: every
// pair of operations (claim, settle done / retry / dead / held, a run
// member dead under Continue, renewal, lease lapse and reclaim, redrive,
// skip and delete on a halted key and on the claimed key, purge, publishes
// committed at once, and a publish whose transaction is held open), one
// parked after each of its statements while the other runs, then resumed;
// after each schedule the invariants of docs/internals.md ("Ordered
// delivery: states and invariants") are checked on the table
// (checkInvariants: I1-I4; I5 after a redrive; I6: an operation on keys a
// held publish did not write must not wait for it), then every key is
// drained and must deliver in key order without a key left stuck.

// world is the state a schedule starts from and the claims live in it.
//
//	K: k1 (head, claimed by relay R1: fence (k1, 1), run k2 k3), k2, k3
//	   (blocked); in the lapsed variant R1's lease has already lapsed.
//	J: j1 dead under Halt (the key's halted head), j2 blocked.
//	L: l1 dead under Continue, l2 the key's head (pending).
type world struct {
	t      *testing.T
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
	w := &world{t: t, e: e, lapsed: lapsed, od: e.od(t), live: map[outboxdriver.Fence]heldRun{}}
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

// op is one operation of a schedule. keys are the keys it writes: it may
// wait for a business transaction that holds one of them, never for one
// that holds only others (I6). bOnly marks an operation that is never the
// parked one (a publish in a transaction of its own, which the Gate does
// not see).
type op struct {
	name  string
	keys  []string
	run   func(ctx context.Context, w *world) error
	bOnly bool
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
	{"claim", nil, func(ctx context.Context, w *world) error {
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
	}, false},
	{"settle-done", []string{"K"}, settleR1(3, 0, false), false},
	{"settle-retry", []string{"K"}, settleR1(1, outboxdriver.SettleRetry, false), false},
	{"settle-dead-halt", []string{"K"}, settleR1(1, outboxdriver.SettleDead, true), false},
	{"settle-dead-continue", []string{"K"}, settleR1(0, outboxdriver.SettleDead, false), false},
	// A run member (k2) dies under Continue after the head succeeded.
	{"settle-member-dead-continue", []string{"K"}, settleR1(1, outboxdriver.SettleDead, false), false},
	{"renew", []string{"K"}, func(ctx context.Context, w *world) error {
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
	}, false},
	{"redrive", []string{"J", "L"}, func(ctx context.Context, w *world) error {
		_, err := w.e.ob.Redrive(ctx, w.db, "")
		return err
	}, false},
	{"skip", []string{"J"}, func(ctx context.Context, w *world) error {
		_, _, err := w.e.ob.SkipHead(ctx, w.db, "J")
		return err
	}, false},
	// Skip on the key whose head a relay holds: K has no halted head, so
	// nothing changes.
	{"skip-K", []string{"K"}, func(ctx context.Context, w *world) error {
		_, _, err := w.e.ob.SkipHead(ctx, w.db, "K")
		return err
	}, false},
	{"delete", []string{"L"}, func(ctx context.Context, w *world) error {
		_, err := w.e.ob.Act(ctx, w.db, outbox.ActDelete, outbox.Filter{Key: "L"}, quietAct)
		return err
	}, false},
	// Delete on the key whose head a relay holds: the claimed head and its
	// run stay (never deleted under a live claim).
	{"delete-K", []string{"K"}, func(ctx context.Context, w *world) error {
		_, err := w.e.ob.Act(ctx, w.db, outbox.ActDelete, outbox.Filter{Key: "K"}, quietAct)
		return err
	}, false},
	{"purge", []string{"J", "L"}, func(ctx context.Context, w *world) error {
		_, err := w.e.ob.Purge(ctx, w.db, outbox.PurgeOptions{States: []outbox.State{outbox.StateDead}})
		return err
	}, false},
	// Publishes in transactions of their own, committed at once: on K (the
	// claimed key), and on J (the halted key).
	{"publish-now-K", []string{"K"}, publishNow("K"), true},
	{"publish-now-J", []string{"J"}, publishNow("J"), true},
}

// publishNow publishes one message to key in a transaction of its own
// and commits.
func publishNow(key string) func(ctx context.Context, w *world) error {
	return func(ctx context.Context, w *world) error {
		tx := w.e.Begin(w.t)
		if _, err := w.e.ob.Publish(ctx, tx.Tx, outbox.Message{Topic: topicX, Key: key}); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
}

var quietAct = &outbox.ActOptions{Logger: slog.New(slog.DiscardHandler)}

// heldPublishes are the publishes a schedule holds open as its parked
// operation: a business transaction that published one message on each
// of its keys and is not committed while the other operation runs.
var heldPublishes = []struct {
	name string
	keys []string
}{
	{"publish", []string{"K", "L"}},
	{"publish-held-K", []string{"K"}},
}

func heldKeys(name string) ([]string, bool) {
	for _, p := range heldPublishes {
		if p.name == name {
			return p.keys, true
		}
	}
	return nil, false
}

func (w *world) publish(t *testing.T, keys []string) (commit func() error) {
	t.Helper()
	tx := w.e.Begin(t)
	msgs := make([]outbox.Message, len(keys))
	for i, k := range keys {
		msgs[i] = outbox.Message{Topic: topicX, Key: k}
	}
	if _, err := w.e.ob.PublishBatch(context.Background(), tx.Tx, msgs); err != nil {
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
	var names []string
	for _, p := range heldPublishes {
		names = append(names, p.name)
	}
	for _, o := range ops {
		if !o.bOnly {
			names = append(names, o.name)
		}
	}
	schedules := 0
	for _, lapsed := range []bool{false, true} {
		for _, a := range names {
			_, held := heldKeys(a)
			for _, b := range ops {
				for _, n := range parks {
					if held && n > 1 {
						continue
					}
					name := fmt.Sprintf("lapsed=%v/%s@%d/%s", lapsed, a, n, b.name)
					if !runSchedule(t, e, name, lapsed, a, n, b.name) {
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
// statement, b run to its end (or until it has waited 100ms on a lock a
// holds, then a resumed), a's end; then the invariants and a drain. It
// reports false, running nothing more, when a ends before statement n.
// When a is a publish held open and b writes none of its keys, b must not
// wait for it (I6; not on SQLite, whose one writer waits for any open
// write transaction): b then gets 2s, far more than it takes, before it
// counts as waiting.
func runSchedule(t *testing.T, e *env, name string, lapsed bool, a string, n int, b string) bool {
	t.Helper()
	resetTables(t, e)
	w := newWorld(t, e, lapsed)
	var resume func() error
	within := 100 * time.Millisecond
	mustNotWait := false
	if keys, held := heldKeys(a); held {
		resume = w.publish(t, keys)
		if e.ob.Dialect().Name() != "sqlite" && !slices.ContainsFunc(opNamed(b).keys, func(k string) bool { return slices.Contains(keys, k) }) {
			mustNotWait, within = true, 2*time.Second
		}
	} else {
		var ok bool
		resume, ok = runParked(t, w.g, "A", n, func(ctx context.Context) error { return opNamed(a).run(ctx, w) })
		if !ok {
			return false
		}
	}
	errA, errB, waited := runBlocked(w.g, "B", within, func(ctx context.Context) error { return opNamed(b).run(ctx, w) }, resume)
	for _, err := range []error{errA, errB} {
		if err != nil && !retryable(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if mustNotWait && waited {
		t.Errorf("%s: I6: %s waited for a transaction that published only on other keys", name, b)
	}
	checkInvariants(t, e, name, w.liveClaims())
	if a == "redrive" || b == "redrive" {
		w.checkRedrivePlace(t, name, a == "skip" || b == "skip")
	}
	w.drain(t, name)
	return true
}

// checkRedrivePlace checks I5 after a schedule with a redrive: L's l1,
// dead under Continue, once redriven comes after l2, published before the
// redrive; J's halted head j1, once redriven, keeps its place before j2
// (unless a skip of J may have run first: then the skipped j1 is redriven
// after j2, which drain's order check covers).
func (w *world) checkRedrivePlace(t *testing.T, name string, skipped bool) {
	t.Helper()
	seq := func(id outbox.ID) (int64, string, bool) {
		rows, err := w.e.DB.QueryDB(context.Background(), `SELECT key_seq, state FROM `+w.e.Table+` WHERE `+idIs(id))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var s int64
		var st string
		if !rows.Next() {
			return 0, "", false
		}
		if err := rows.Scan(&s, &st); err != nil {
			t.Fatal(err)
		}
		return s, st, true
	}
	if s1, st1, ok1 := seq(w.l[0]); ok1 && st1 != "dead" {
		if s2, _, ok2 := seq(w.l[1]); ok2 && s1 <= s2 {
			t.Errorf("%s: I5: redriven l1 (dead under Continue) at key_seq %d, not after l2 (%d), published before the redrive", name, s1, s2)
		}
	}
	if skipped {
		return
	}
	if s1, st1, ok1 := seq(w.j[0]); ok1 && st1 != "dead" {
		if s2, _, ok2 := seq(w.j[1]); ok2 && s1 >= s2 {
			t.Errorf("%s: I5: redriven halted head j1 at key_seq %d, not before j2 (%d)", name, s1, s2)
		}
	}
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
