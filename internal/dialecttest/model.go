package dialecttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds the reference model of ordered delivery: the state
// machine of docs/internals.md ("Ordered delivery: states and
// invariants") in memory, and the conformance case that drives a dialect
// and the model side by side with seeded random sequences of operations
// of three relays (claims with small limits and runs, some with a lease
// that lapses at once; settles with random outcomes; renewals), an
// operator (redrive, skip, delete, purge) and publishers (some
// transactions held open across steps, then committed or rolled back).
// A step runs one operation, or two at once: one parked by a Gate after
// a random statement while the other runs. After each step the table
// must hold the model's state after one of the serial orders of the step's
// operations, each operation's result (claims, fences applied, busy
// runs, counts) being one the model allows in that order; then
// checkInvariants must pass. A sequence ends with a drain that must
// settle every message.

// modelSeeds are sequences that once failed, run first every time, with
// the long run's steps.
var modelSeeds = []uint64{
	// Step 18, with the settle's fence read on the statement's snapshot
	// only (issue 31, finding 1): a relay's stale settle of a head whose
	// lease had lapsed applied while another relay's claim of that head
	// waited to commit.
	4923445484993150725,
}

// modelKeys are the keys the sequences publish on, all on topic x.
var modelKeys = []string{"A", "B", "C"}

// mMsg is an ordered message as the model holds it.
type mMsg struct {
	id       outbox.ID
	key      string
	seq      int64
	state    string // pending, processing, blocked or dead
	attempts int
	settled  bool // settled_at set: dead under Continue, or skipped
	lapsed   bool // processing whose lease has lapsed: a claim may take it again
}

func (x *mMsg) String() string {
	if x == nil {
		return "gone"
	}
	return fmt.Sprintf("%s %s/%d %s attempts %d", x.id, x.key, x.seq, x.state, x.attempts)
}

// mKey is a row of the keys table.
type mKey struct {
	last, live, halted int64 // halted 0: not halted
}

// model is the state of the ordered messages and their keys.
type model struct {
	msgs map[outbox.ID]*mMsg
	keys map[string]*mKey
	// purged are the messages the last purge deleted: a purge deletes
	// rows settled before its clock, so one settled within the same
	// step may still be there.
	purged map[outbox.ID]mMsg
}

func newModel() *model {
	return &model{msgs: map[outbox.ID]*mMsg{}, keys: map[string]*mKey{}}
}

func (m *model) clone() *model {
	c := &model{msgs: make(map[outbox.ID]*mMsg, len(m.msgs)), keys: make(map[string]*mKey, len(m.keys))}
	for id, x := range m.msgs {
		y := *x
		c.msgs[id] = &y
	}
	for k, x := range m.keys {
		y := *x
		c.keys[k] = &y
	}
	return c
}

// ofKey returns key's messages in state (any state when empty), in
// key_seq order.
func (m *model) ofKey(key, state string) []*mMsg {
	var out []*mMsg
	for _, x := range m.msgs {
		if x.key == key && (state == "" || x.state == state) {
			out = append(out, x)
		}
	}
	slices.SortFunc(out, func(a, b *mMsg) int { return int(a.seq - b.seq) })
	return out
}

// head returns key's head (pending or processing), nil for none.
func (m *model) head(key string) *mMsg {
	for _, x := range m.ofKey(key, "") {
		if x.state == "pending" || x.state == "processing" {
			return x
		}
	}
	return nil
}

// promote makes the first blocked message of key pending when the key has
// no head and is not halted.
func (m *model) promote(key string) {
	if m.head(key) != nil || m.keys[key].halted != 0 {
		return
	}
	if b := m.ofKey(key, "blocked"); len(b) > 0 {
		b[0].state = "pending"
	}
}

// publish commits a batch: a key's messages are numbered after its
// last_seq in batch order, the first one the key's head when the key had
// no live message, the others blocked.
func (m *model) publish(keys []string, ids []outbox.ID) {
	live := map[string]int64{}
	for i, key := range keys {
		k := m.keys[key]
		if k == nil {
			k = &mKey{}
			m.keys[key] = k
		}
		if _, ok := live[key]; !ok {
			live[key] = k.live
		}
		k.last++
		st := "blocked"
		if live[key] == 0 && k.live == live[key] {
			st = "pending"
		}
		k.live++
		m.msgs[ids[i]] = &mMsg{id: ids[i], key: key, seq: k.last, state: st}
	}
}

// claim checks one claim's result against the model and applies it: each
// head pending, or processing with a lapsed lease, its attempts one more,
// its run a prefix of the blocked messages after it, the runs within
// runLimit and each complete when the budget was not spent; alone (no
// other operation at once), a claim that took fewer heads than limit took
// every pending one.
func (m *model) claim(cs []outboxdriver.Claimed, limit, runLimit int, lapse, alone bool) error {
	members := 0
	short := false
	for _, c := range cs {
		x := m.msgs[c.ID]
		switch {
		case x == nil:
			return fmt.Errorf("claimed %s, which the model does not hold", c.ID)
		case x.state != "pending" && !(x.state == "processing" && x.lapsed):
			return fmt.Errorf("claimed %s of key %s (key_seq %d), which is %s (lapsed %v)", c.ID, x.key, x.seq, x.state, x.lapsed)
		case c.Attempts != x.attempts+1 || c.KeySeq != x.seq || c.Key != x.key:
			return fmt.Errorf("claimed %s as %s/%d attempts %d, model %s/%d attempts %d+1", c.ID, c.Key, c.KeySeq, c.Attempts, x.key, x.seq, x.attempts)
		}
		var after []*mMsg
		for _, b := range m.ofKey(x.key, "blocked") {
			if b.seq > x.seq {
				after = append(after, b)
			}
		}
		if len(c.Run) > len(after) {
			return fmt.Errorf("claim of %s carries a run of %d, the key has %d blocked after it", c.ID, len(c.Run), len(after))
		}
		for i, r := range c.Run {
			if r.ID != after[i].id || r.Attempts != after[i].attempts {
				return fmt.Errorf("run of %s: member %d is %s (attempts %d), want %s (attempts %d)", c.ID, i, r.ID, r.Attempts, after[i].id, after[i].attempts)
			}
		}
		members += len(c.Run)
		short = short || len(c.Run) < len(after)
	}
	if members > runLimit {
		return fmt.Errorf("claim carries %d run members, limit %d", members, runLimit)
	}
	if short && members < runLimit {
		return fmt.Errorf("claim cut a run with %d of its %d run members left", members, runLimit)
	}
	if alone && len(cs) < limit {
		for _, x := range m.msgs {
			if x.state == "pending" && !slices.ContainsFunc(cs, func(c outboxdriver.Claimed) bool { return c.ID == x.id }) {
				return fmt.Errorf("claimed %d of limit %d, and left the pending head %s of key %s", len(cs), limit, x.id, x.key)
			}
		}
	}
	for _, c := range cs {
		x := m.msgs[c.ID]
		x.state, x.attempts, x.lapsed = "processing", c.Attempts, lapse
	}
	return nil
}

// held reports whether f is the live claim of its head.
func (m *model) held(f outboxdriver.Fence) bool {
	x := m.msgs[f.ID]
	return x != nil && x.state == "processing" && x.attempts == f.Attempts
}

// settle applies a run's outcome when its head still holds its fence, and
// reports whether it did (SettleRuns' applied).
func (m *model) settle(out outboxdriver.RunOutcome) (bool, error) {
	if !m.held(out.Head) {
		return false, nil
	}
	for _, id := range append(slices.Clone(out.Done), out.Failed.ID) {
		if x := m.msgs[id]; x == nil && (id != out.Failed.ID || out.Failed.Kind != 0) {
			return false, fmt.Errorf("the run of the held head %s has %s, which the model does not hold", out.Head.ID, id)
		}
	}
	k := m.keys[out.Key]
	for _, id := range out.Done {
		delete(m.msgs, id)
	}
	k.live -= int64(len(out.Done))
	if f := out.Failed; f.Kind != 0 {
		x := m.msgs[f.ID]
		if x.id != out.Head.ID {
			x.attempts++
		}
		x.lapsed = false
		if f.Kind == outboxdriver.SettleRetry {
			x.state = "pending"
		} else {
			x.state = "dead"
			if out.Halt {
				k.halted = x.seq
			} else {
				x.settled = true
				k.live--
			}
		}
	}
	m.promote(out.Key)
	return true, nil
}

// renew returns the fences of held that still hold, their leases renewed.
func (m *model) renew(held []outboxdriver.Fence) []outboxdriver.Fence {
	var out []outboxdriver.Fence
	for _, f := range held {
		if m.held(f) {
			m.msgs[f.ID].lapsed = false
			out = append(out, f)
		}
	}
	return out
}

// redrive re-enters every dead message in its key at I5's place: a
// halted head keeps its key_seq and its key is no longer halted; any
// other takes a new key_seq after the key's last_seq, several of one key
// in their old order. Then a key without a head takes its first blocked
// message as head. It returns how many it redrove.
func (m *model) redrive() int64 {
	var n int64
	for key, k := range m.keys {
		dead := m.ofKey(key, "dead")
		for _, x := range dead {
			if k.halted != 0 && x.seq == k.halted {
				k.halted = 0
			} else {
				k.last++
				k.live++
				x.seq = k.last
			}
			x.state, x.settled, x.lapsed = "blocked", false, false
			n++
		}
		if len(dead) > 0 {
			m.promote(key)
		}
	}
	return n
}

// skip skips key's halted head: it stays dead, settled, and the key's
// first blocked message becomes its head.
func (m *model) skip(key string) (outbox.ID, bool) {
	k := m.keys[key]
	if k == nil || k.halted == 0 {
		return outbox.ID{}, false
	}
	var id outbox.ID
	for _, x := range m.ofKey(key, "dead") {
		if x.seq == k.halted {
			x.settled, id = true, x.id
		}
	}
	k.halted = 0
	k.live--
	m.promote(key)
	return id, true
}

// deleteDead deletes the settled dead messages of key ("" for every key)
// and returns how many: what Act's delete and Purge may delete of ordered
// messages (a halted head is not settled).
func (m *model) deleteDead(key string) map[outbox.ID]mMsg {
	gone := map[outbox.ID]mMsg{}
	for id, x := range m.msgs {
		if x.state == "dead" && x.settled && (key == "" || x.key == key) {
			gone[id] = *x
			delete(m.msgs, id)
		}
	}
	return gone
}

// dbRow is an ordered message as stored.
type dbRow struct {
	key      string
	seq      int64
	state    string
	attempts int
	settled  bool
}

// readRows reads the ordered messages of e's table by id, and its key
// rows.
func readRows(t *testing.T, e *env) (map[outbox.ID]dbRow, map[string]keyRow) {
	t.Helper()
	rows, err := e.DB.QueryDB(context.Background(), `SELECT CAST(id AS CHAR(36)), message_key, key_seq, state, attempts,
    CASE WHEN settled_at IS NULL THEN 0 ELSE 1 END FROM `+e.Table+` WHERE key_seq IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[outbox.ID]dbRow{}
	for rows.Next() {
		var s string
		var r dbRow
		var settled int
		if err := rows.Scan(&s, &r.key, &r.seq, &r.state, &r.attempts, &settled); err != nil {
			t.Fatal(err)
		}
		id, err := outboxdriver.ParseID(strings.TrimSpace(s))
		if err != nil {
			t.Fatal(err)
		}
		r.key, r.settled = strings.TrimRight(r.key, " "), settled == 1
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	_, ks := readOrdered(t, e)
	return out, ks
}

// diff returns how the table differs from m, "" when it holds m's state.
// A message m's last purge deleted may still be there, unchanged.
func (m *model) diff(rows map[outbox.ID]dbRow, ks map[string]keyRow) string {
	var d []string
	for id, x := range m.msgs {
		r, ok := rows[id]
		want := dbRow{x.key, x.seq, x.state, x.attempts, x.settled}
		switch {
		case !ok:
			d = append(d, fmt.Sprintf("%s %s/%d: model %+v, table: gone", id, x.key, x.seq, want))
		case r != want:
			d = append(d, fmt.Sprintf("%s %s/%d: model %+v, table %+v", id, x.key, x.seq, want, r))
		}
	}
	for id, r := range rows {
		if _, ok := m.msgs[id]; ok {
			continue
		}
		if p, ok := m.purged[id]; ok && r == (dbRow{p.key, p.seq, p.state, p.attempts, p.settled}) {
			continue
		}
		d = append(d, fmt.Sprintf("%s %s/%d: model: gone, table %+v", id, r.key, r.seq, r))
	}
	for key, k := range m.keys {
		r, ok := ks[key]
		var halted int64
		if ok && r.halted != nil {
			halted = *r.halted
		}
		if !ok || r.live != k.live || r.last != k.last || halted != k.halted {
			d = append(d, fmt.Sprintf("key %s: model live %d last %d halted %d, table %+v (halted %d, row %v)", key, k.live, k.last, k.halted, r, halted, ok))
		}
	}
	for key := range ks {
		if m.keys[key] == nil {
			d = append(d, fmt.Sprintf("key %s: no row in the model, one in the table", key))
		}
	}
	slices.Sort(d)
	return strings.Join(d, "\n")
}

// adopt takes, of the messages m's last purge deleted, those still in the
// table back into m.
func (m *model) adopt(rows map[outbox.ID]dbRow) {
	for id, p := range m.purged {
		if _, ok := rows[id]; ok {
			m.msgs[id] = &p
		}
	}
	m.purged = nil
}

// rclaim is a claim a relay holds: its head's fence and the ids and
// stored attempts of the head and its run.
type rclaim struct {
	key   string
	fence outboxdriver.Fence
	ids   []outbox.ID
	att   []int
}

// mop is one operation of a step: run calls the dialect and keeps what it
// returned, apply checks that against the model and applies it (it is
// called once per serial order tried, on a copy of the model; alone is
// false when another operation ran at once), after changes the relays'
// state once the step is accepted.
type mop struct {
	name  string
	run   func(ctx context.Context) error
	apply func(m *model, alone bool) error
	after func()
	err   error // run's error, retryable: the operation changed nothing
}

// modelRun is one sequence.
type modelRun struct {
	t      *testing.T
	e      *env
	od     outboxdriver.OrderedDialect
	g      *Gate
	db     outbox.DB
	r      *rand.Rand
	m      *model
	relays [3][]*rclaim
	// open is a publish whose transaction is held open across steps (on
	// dialects where writers do not wait for each other's commits).
	open *openPublish
	log  []string
	seed uint64
	ops  int // operations labelled for the Gate
}

// openPublish is a business transaction that published and is not yet
// committed.
type openPublish struct {
	keys []string
	ids  []outbox.ID
	txn  Txn
}

// opTimeout bounds one operation: one that waits longer is stuck behind a
// lock it should not wait for.
const opTimeout = 20 * time.Second

func (s *modelRun) keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = modelKeys[s.r.IntN(len(modelKeys))]
	}
	return ks
}

// heldKey reports whether key has a publish held open.
func (s *modelRun) heldKey(key string) bool {
	return s.open != nil && slices.Contains(s.open.keys, key)
}

// publishOp publishes one to three messages on random keys and commits.
func (s *modelRun) publishOp() *mop {
	var keys []string
	for _, k := range s.keys(1 + s.r.IntN(3)) {
		if !s.heldKey(k) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	var ids []outbox.ID
	return &mop{
		name: "publish" + fmt.Sprint(keys),
		run: func(ctx context.Context) error {
			p, err := s.publishTx(ctx, keys)
			if err != nil {
				return err
			}
			ids = p.ids
			return p.txn.Commit()
		},
		apply: func(m *model, _ bool) error { m.publish(keys, ids); return nil },
	}
}

// publishTx opens a business transaction and publishes a message on each
// of keys in it.
func (s *modelRun) publishTx(ctx context.Context, keys []string) (*openPublish, error) {
	msgs := make([]outbox.Message, len(keys))
	for i, k := range keys {
		msgs[i] = outbox.Message{Topic: topicX, Key: k}
	}
	txn := s.e.Begin(s.t)
	res, err := s.e.ob.PublishBatch(ctx, txn.Tx, msgs)
	if err != nil {
		txn.Rollback()
		return nil, err
	}
	return &openPublish{keys: keys, ids: resIDs(res), txn: txn}, nil
}

// claimOp claims for relay i with a small limit and run budget, one time
// in four with a lease that lapses at once.
func (s *modelRun) claimOp(i int) *mop {
	return s.claimWith(i, 1+s.r.IntN(3), s.r.IntN(4), s.r.IntN(4) == 0)
}

// claimWith claims for relay i.
func (s *modelRun) claimWith(i, limit, runLimit int, lapse bool) *mop {
	lease := time.Minute
	if lapse {
		lease = time.Microsecond
	}
	var cs []outboxdriver.Claimed
	return &mop{
		name: fmt.Sprintf("claim(R%d limit %d run %d lapse %v)", i, limit, runLimit, lapse),
		run: func(ctx context.Context) error {
			var err error
			cs, _, err = s.od.ClaimOrdered(ctx, s.db, s.e.ob.Table(), outboxdriver.ClaimParams{
				Topics: []string{topicX}, Limit: limit, Lease: lease, MaxAttempts: 100}, runLimit)
			return err
		},
		apply: func(m *model, alone bool) error { return m.claim(cs, limit, runLimit, lapse, alone) },
		after: func() {
			for _, c := range cs {
				rc := &rclaim{key: c.Key, fence: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}, ids: []outbox.ID{c.ID}, att: []int{c.Attempts}}
				for _, r := range c.Run {
					rc.ids, rc.att = append(rc.ids, r.ID), append(rc.att, r.Attempts)
				}
				s.relays[i] = append(s.relays[i], rc)
			}
		},
	}
}

// settleOp settles one of relay i's claims with a random outcome: a
// prefix done, then the next message retried, dead under Halt or
// Continue, or nothing more.
func (s *modelRun) settleOp(i int) *mop {
	if len(s.relays[i]) == 0 {
		return nil
	}
	c := s.relays[i][s.r.IntN(len(s.relays[i]))]
	done := s.r.IntN(len(c.ids) + 1)
	out := outboxdriver.RunOutcome{Head: c.fence, Key: c.key, Done: c.ids[:done]}
	what := "done"
	if done < len(c.ids) {
		kind := s.r.IntN(4)
		if done == 0 && kind == 0 {
			kind = 1 // a relay settles at least one message
		}
		if kind > 0 {
			att := c.att[done] + 1
			if done == 0 {
				att = c.fence.Attempts
			}
			out.Failed = outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: c.ids[done], Attempts: att}, Error: "failed"}
			out.Failed.Kind, what = outboxdriver.SettleRetry, "retry"
			if kind > 1 {
				out.Failed.Kind, out.Halt, what = outboxdriver.SettleDead, kind == 2, "dead-continue"
				if out.Halt {
					what = "dead-halt"
				}
			}
		}
	}
	return s.settleWith(i, c, out, fmt.Sprintf("%d done, %s", done, what))
}

// settleWith writes out, the outcome of relay i's claim c.
func (s *modelRun) settleWith(i int, c *rclaim, out outboxdriver.RunOutcome, what string) *mop {
	var applied []outboxdriver.Fence
	var busy []int
	return &mop{
		name: fmt.Sprintf("settle(R%d %s/%s#%d: %s)", i, c.key, c.fence.ID, c.fence.Attempts, what),
		run: func(ctx context.Context) error {
			var err error
			applied, busy, err = s.od.SettleRuns(ctx, s.db, s.e.ob.Table(), outboxdriver.SettleParams{}, []outboxdriver.RunOutcome{out})
			return err
		},
		apply: func(m *model, alone bool) error {
			if len(busy) > 0 {
				if alone && !s.heldKey(c.key) {
					return fmt.Errorf("busy, with no other writer of key %s", c.key)
				}
				return nil
			}
			want, err := m.settle(out)
			if err != nil {
				return err
			}
			if got := len(applied) == 1; got != want {
				return fmt.Errorf("applied %v, the model's head: %v", applied, m.msgs[c.fence.ID])
			}
			return nil
		},
		after: func() {
			if len(busy) == 0 {
				s.relays[i] = slices.DeleteFunc(s.relays[i], func(x *rclaim) bool { return x == c })
			}
		},
	}
}

// renewOp renews relay i's claims.
func (s *modelRun) renewOp(i int) *mop {
	if len(s.relays[i]) == 0 {
		return nil
	}
	var held []outboxdriver.Fence
	for _, c := range s.relays[i] {
		held = append(held, c.fence)
	}
	var applied []outboxdriver.Fence
	return &mop{
		name: fmt.Sprintf("renew(R%d %d)", i, len(held)),
		run: func(ctx context.Context) error {
			var err error
			applied, err = s.e.rd.Renew(ctx, s.db, s.e.ob.Table(), time.Minute, held)
			return err
		},
		apply: func(m *model, _ bool) error {
			want := m.renew(held)
			if !sameFences(applied, want) {
				return fmt.Errorf("renewed %v, the model %v", applied, want)
			}
			return nil
		},
	}
}

func sameFences(a, b []outboxdriver.Fence) bool {
	key := func(f outboxdriver.Fence) string { return f.ID.String() + "#" + strconv.Itoa(f.Attempts) }
	as, bs := make([]string, len(a)), make([]string, len(b))
	for i := range a {
		as[i] = key(a[i])
	}
	for i := range b {
		bs[i] = key(b[i])
	}
	slices.Sort(as)
	slices.Sort(bs)
	return slices.Equal(as, bs)
}

// operatorOp is one of the operator's actions: redrive, skip, delete or
// purge. A redrive, or a skip, that would wait for a publish held open
// across steps is not drawn.
func (s *modelRun) operatorOp() *mop {
	ctxOp := func(name string, run func(ctx context.Context) (int64, error), apply func(m *model) int64) *mop {
		var n int64
		return &mop{
			name: name,
			run:  func(ctx context.Context) (err error) { n, err = run(ctx); return err },
			apply: func(m *model, _ bool) error {
				if want := apply(m); n != want {
					return fmt.Errorf("%s changed %d, the model %d", name, n, want)
				}
				return nil
			},
		}
	}
	key := modelKeys[s.r.IntN(len(modelKeys))]
	switch s.r.IntN(4) {
	case 0:
		if s.open != nil {
			for _, k := range s.open.keys {
				if len(s.m.ofKey(k, "dead")) > 0 {
					return nil
				}
			}
		}
		return ctxOp("redrive", func(ctx context.Context) (int64, error) { return s.e.ob.Redrive(ctx, s.db, "") }, (*model).redrive)
	case 1:
		if s.heldKey(key) {
			return nil
		}
		return s.skipOp(key)
	case 2:
		return ctxOp("delete("+key+")", func(ctx context.Context) (int64, error) {
			return s.e.ob.Act(ctx, s.db, outbox.ActDelete, outbox.Filter{Key: key}, quietAct)
		}, func(m *model) int64 { return int64(len(m.deleteDead(key))) })
	}
	var n int64
	return &mop{
		name: "purge",
		run: func(ctx context.Context) (err error) {
			n, err = s.e.ob.Purge(ctx, s.db, outbox.PurgeOptions{States: []outbox.State{outbox.StateDead}})
			return err
		},
		apply: func(m *model, _ bool) error {
			// A row settled at the purge's clock tick is kept: the
			// model's purge may delete more than the table's.
			gone := m.deleteDead("")
			if n > int64(len(gone)) {
				return fmt.Errorf("purge deleted %d, the model at most %d", n, len(gone))
			}
			m.purged = gone
			return nil
		},
	}
}

// skipOp skips key's halted head.
func (s *modelRun) skipOp(key string) *mop {
	var id outbox.ID
	var ok bool
	return &mop{
		name: "skip(" + key + ")",
		run:  func(ctx context.Context) (err error) { id, ok, err = s.e.ob.SkipHead(ctx, s.db, key); return err },
		apply: func(m *model, _ bool) error {
			if wid, wok := m.skip(key); id != wid || ok != wok {
				return fmt.Errorf("skipped %s %v, the model %s %v", id, ok, wid, wok)
			}
			return nil
		},
	}
}

// nextOp draws an operation the state allows (nil when the draw does
// not fit: the caller draws again).
func (s *modelRun) nextOp(not int) (*mop, int) {
	i := s.r.IntN(3)
	if i == not {
		i = (i + 1) % 3
	}
	switch n := s.r.IntN(20); {
	case n < 5:
		return s.publishOp(), -1
	case n < 10:
		return s.claimOp(i), i
	case n < 15:
		return s.settleOp(i), i
	case n < 17:
		return s.renewOp(i), i
	default:
		return s.operatorOp(), -1
	}
}

// draw draws an operation, retrying until one fits.
func (s *modelRun) draw(not int) (*mop, int) {
	for {
		if o, i := s.nextOp(not); o != nil {
			return o, i
		}
	}
}

// label returns a fresh operation name for the Gate: a park set for an
// operation that ended before reaching it never catches another.
func (s *modelRun) label() string {
	s.ops++
	return "op" + strconv.Itoa(s.ops)
}

// timed runs o with its run bounded by opTimeout.
func (s *modelRun) timed(o *mop) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		return o.run(ctx)
	}
}

// exec runs o alone.
func (s *modelRun) exec(o *mop) error {
	return s.timed(o)(s.g.Op(context.Background(), s.label()))
}

// check accepts an error that leaves the operation without effect
// (a deadlock victim, SQLite busy), kept in o.err, and fails on any
// other.
func (s *modelRun) check(o *mop, err error) {
	s.t.Helper()
	if err == nil {
		return
	}
	if !retryable(err) {
		s.fail("%s: %v", o.name, err)
	}
	o.err = err
}

func (s *modelRun) fail(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("seed %d: %s\nsteps:\n  %s", s.seed, fmt.Sprintf(format, args...), strings.Join(s.log, "\n  "))
}

// step runs one step (one operation alone, two at once, a publish held
// open across steps, or its commit or rollback) and compares.
func (s *modelRun) step() {
	var orders [][]*mop
	var name string
	alone := false
	switch n := s.r.IntN(10); {
	case n == 0 && s.open != nil:
		orders, name = s.finishOpen(nil)
		alone = true
	case n == 1 && s.open == nil && s.e.ob.Dialect().Name() != "sqlite":
		// SQLite has one writer: a transaction held open across steps
		// would stop every other; there a publish is held open only
		// within a step (pair).
		s.open = s.begin(s.keys(1))
		s.log = append(s.log, "open publish on "+fmt.Sprint(s.open.keys))
		return
	case n < 5:
		o, _ := s.draw(-1)
		s.check(o, s.exec(o))
		orders, name, alone = [][]*mop{{o}}, o.name, true
	case n < 7 && s.open != nil:
		b, _ := s.draw(-1)
		orders, name = s.finishOpen(b)
	default:
		orders, name, alone = s.pair()
	}
	s.log = append(s.log, name)
	s.compare(orders, alone)
}

// begin opens a business transaction and publishes a message on each of
// keys in it.
func (s *modelRun) begin(keys []string) *openPublish {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	p, err := s.publishTx(ctx, keys)
	if err != nil {
		s.fail("publish %v: %v", keys, err)
	}
	return p
}

// finishOpen commits (three times in four) or rolls back the publish held
// open, while b, if not nil, runs at once (waiting, if it must, until the
// commit).
func (s *modelRun) finishOpen(b *mop) ([][]*mop, string) {
	p := s.open
	s.open = nil
	end := &mop{name: "rollback" + fmt.Sprint(p.keys), apply: func(*model, bool) error { return nil }}
	finish := p.txn.Rollback
	if s.r.IntN(4) != 0 {
		end = &mop{name: "commit" + fmt.Sprint(p.keys), apply: func(m *model, _ bool) error { m.publish(p.keys, p.ids); return nil }}
		finish = p.txn.Commit
	}
	if b == nil {
		if err := finish(); err != nil {
			s.fail("%s: %v", end.name, err)
		}
		return [][]*mop{{end}}, end.name
	}
	errA, errB, _ := runBlocked(s.g, s.label(), 50*time.Millisecond, s.timed(b), finish)
	if errA != nil {
		s.fail("%s: %v", end.name, errA)
	}
	s.check(b, errB)
	return [][]*mop{{end, b}, {b, end}}, end.name + " || " + b.name
}

// pair runs a, parked after a random statement, and b at once: b runs to
// its end, or until it has waited 50ms on a lock a holds, then a goes
// on. One time in five a is a publish, its transaction held open while b
// runs.
func (s *modelRun) pair() ([][]*mop, string, bool) {
	if s.open == nil && s.r.IntN(5) == 0 {
		keys := s.keys(1 + s.r.IntN(2))
		b, _ := s.draw(-1)
		s.open = s.begin(keys)
		orders, name := s.finishOpen(b)
		return orders, name, false
	}
	a, ra := s.draw(-1)
	b, _ := s.draw(ra)
	at := 1 // a claim, a renewal, a purge batch: one statement
	if s.r.IntN(2) == 0 {
		at += s.r.IntN(4)
	}
	la := s.label()
	p := s.g.ParkAfter(la, at)
	done := make(chan error, 1)
	go func() { done <- s.timed(a)(s.g.Op(context.Background(), la)) }()
	select {
	case <-p.reached:
	case err := <-done: // a ended before statement at: a alone, then b
		s.check(a, err)
		s.check(b, s.exec(b))
		return [][]*mop{{a, b}}, a.name + " ; " + b.name, false
	case <-time.After(opTimeout):
		s.fail("%s did not reach its statement %d", a.name, at)
	}
	resume := func() error { p.Resume(); return <-done }
	errA, errB, _ := runBlocked(s.g, s.label(), 50*time.Millisecond, s.timed(b), resume)
	s.check(a, errA)
	s.check(b, errB)
	return [][]*mop{{a, b}, {b, a}}, fmt.Sprintf("%s@%d || %s", a.name, at, b.name), false
}

// compare checks the table against the model after each of orders (the
// serial orders of the step's operations), takes the first that fits,
// then checks the invariants.
func (s *modelRun) compare(orders [][]*mop, alone bool) {
	s.t.Helper()
	rows, ks := readRows(s.t, s.e)
	var why []string
	var next *model
	for _, ord := range orders {
		m := s.m.clone()
		var err error
		for _, o := range ord {
			if o.err != nil {
				continue // it changed nothing
			}
			if err = o.apply(m, alone); err != nil {
				err = fmt.Errorf("%s: %w", o.name, err)
				break
			}
		}
		if err == nil {
			if d := m.diff(rows, ks); d != "" {
				err = fmt.Errorf("the table differs:\n%s", d)
			}
		}
		if err == nil {
			next = m
			break
		}
		names := make([]string, len(ord))
		for i, o := range ord {
			names[i] = o.name
		}
		why = append(why, fmt.Sprintf("in the order %s: %v", strings.Join(names, " ; "), err))
	}
	if next == nil {
		s.fail("no serial order of the step fits:\n%s", strings.Join(why, "\n"))
	}
	next.adopt(rows)
	s.m = next
	for _, o := range orders[0] {
		if o.after != nil && o.err == nil {
			o.after()
		}
	}
	checkInvariants(s.t, s.e, s.log[len(s.log)-1], s.liveClaims())
	if s.t.Failed() {
		s.fail("invariants broken (above)")
	}
}

// liveClaims are the relays' claims whose heads still hold their fences.
func (s *modelRun) liveClaims() map[outboxdriver.Fence]heldRun {
	live := map[outboxdriver.Fence]heldRun{}
	for _, cs := range s.relays {
		for _, c := range cs {
			if s.m.held(c.fence) {
				live[c.fence] = heldRun{c.key, c.ids}
			}
		}
	}
	return live
}

// serial runs o alone as a step and compares.
func (s *modelRun) serial(o *mop) {
	s.t.Helper()
	s.log = append(s.log, o.name)
	s.check(o, s.exec(o))
	s.compare([][]*mop{{o}}, true)
}

// drain ends a sequence: the publish held open commits or rolls back,
// every relay settles its claims as done, then claims and settles,
// skipping halted heads, until no message is left but dead ones.
func (s *modelRun) drain() {
	s.t.Helper()
	s.log = append(s.log, "drain")
	if s.open != nil {
		orders, name := s.finishOpen(nil)
		s.log = append(s.log, name)
		s.compare(orders, true)
	}
	settleAll := func(i int) {
		for range 10 {
			if len(s.relays[i]) == 0 {
				return
			}
			for _, c := range slices.Clone(s.relays[i]) {
				s.serial(s.settleWith(i, c, outboxdriver.RunOutcome{Head: c.fence, Key: c.key, Done: c.ids}, "all done"))
			}
		}
		s.fail("relay R%d could not settle its claims", i)
	}
	for i := range s.relays {
		settleAll(i)
	}
	for range 100 {
		for _, key := range modelKeys {
			if k := s.m.keys[key]; k != nil && k.halted != 0 {
				s.serial(s.skipOp(key))
			}
		}
		s.serial(s.claimWith(0, 100, 100, false))
		if len(s.relays[0]) == 0 {
			for _, x := range s.m.msgs {
				if x.state != "dead" {
					s.fail("drained, but %s of key %s (key_seq %d) is %s", x.id, x.key, x.seq, x.state)
				}
			}
			return
		}
		settleAll(0)
	}
	s.fail("the drain did not end")
}

// longSteps are the steps of a sequence of modelSeeds and of a replayed
// seed; modelSteps those of the short run's sequences, longRunSteps those
// of the long run's.
const (
	longSteps    = 30
	modelSteps   = 15
	longRunSteps = 12
)

// modelSequences is the number of random sequences of one dialect and
// driver: 20 in the short run; under OUTBOX_RELIABILITY=long, 1,200 (of
// longRunSteps each), run by modelWorkers workers at once, each on a
// table of its own (one on a harness whose tests cannot run in parallel,
// SQLite's one file), so that thousands of sequences run in CI on every
// dialect and driver in minutes.
const (
	modelShortSequences = 20
	modelLongSequences  = 1200
	modelWorkers        = 4
)

// orderedModel runs seeded random sequences against the dialect and the
// model: modelSeeds first, then the random sequences, each from a seed of
// its own, logged when it fails; OUTBOX_MODEL_SEED runs that one seed
// alone, with longSteps; OUTBOX_MODEL_SEQUENCES sets the number of random
// sequences.
func orderedModel(t *testing.T, e *env) {
	seeds := slices.Clone(modelSeeds)
	n, steps := modelShortSequences, modelSteps
	long := os.Getenv("OUTBOX_RELIABILITY") == "long"
	if long {
		n, steps = modelLongSequences, longRunSteps
	}
	if v := os.Getenv("OUTBOX_MODEL_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("OUTBOX_MODEL_SEED: %v", err)
		}
		seeds, n, long = []uint64{seed}, 0, false
	}
	if v := os.Getenv("OUTBOX_MODEL_SEQUENCES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("OUTBOX_MODEL_SEQUENCES: %v", err)
		}
	}
	for _, seed := range seeds {
		runModelSequence(t, e, seed, longSteps)
	}
	random := make([]uint64, n)
	for i := range random {
		random[i] = rand.Uint64()
	}
	workers := 1
	if long && e.h.Parallel {
		workers = modelWorkers
	}
	if workers == 1 {
		for _, seed := range random {
			runModelSequence(t, e, seed, steps)
		}
		t.Logf("%d kept sequences of %d steps, %d random sequences of %d steps", len(seeds), longSteps, n, steps)
		return
	}
	// Each worker is a subtest with a store of its own: the sequences of
	// one worker run one after another, the workers side by side.
	cfg := outbox.Config{OrderByKey: true}
	t.Run("workers", func(t *testing.T) {
		for w := range workers {
			share := random[w*len(random)/workers : (w+1)*len(random)/workers]
			t.Run(fmt.Sprintf("w%d", w), func(t *testing.T) {
				t.Parallel()
				we := newEnv(t, e.h)
				c := cfg
				c.Table = we.Table
				ob, err := outbox.New(e.h.Dialect, c)
				if err != nil {
					t.Fatal(err)
				}
				we.ob = ob
				for _, seed := range share {
					runModelSequence(t, we, seed, steps)
				}
			})
		}
	})
	t.Logf("%d kept sequences of %d steps, %d random sequences of %d steps on %d workers", len(seeds), longSteps, n, steps, workers)
}

// runModelSequence runs the sequence of seed, of steps steps, on a
// freshly emptied table, then drains it.
func runModelSequence(t *testing.T, e *env, seed uint64, steps int) {
	t.Helper()
	resetTables(t, e)
	g := NewGate(e.DB)
	s := &modelRun{t: t, e: e, od: e.od(t), g: g, db: g.DB(), seed: seed,
		r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), m: newModel()}
	for range steps {
		s.step()
	}
	s.drain()
}
