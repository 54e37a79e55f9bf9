package dialecttest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// orderedCases are the conformance cases of ordered delivery
// (Config.OrderByKey), run by dialects whose Capabilities.Ordered is true.
var orderedCases = []envCase{
	{"OrderedPublish", orderedPublish},
	{"OrderedPublishSerialises", orderedPublishSerialises},
	{"OrderedPublishOne", orderedPublishOne},
	{"OrderedDedup", orderedDedup},
	{"OrderedRunClaim", orderedRunClaim},
	{"OrderedRunBudget", orderedRunBudget},
	{"OrderedHotKeyWakes", orderedHotKeyWakes},
	{"OrderedLeaseNoOvertake", orderedLeaseNoOvertake},
	{"OrderedDelivery", orderedDelivery},
	{"OrderedRetryBlocksOnlyItsKey", orderedRetryBlocksOnlyItsKey},
	{"OrderedHaltRedriveSkip", orderedHaltRedriveSkip},
	{"OrderedSkipAction", orderedSkipAction},
	{"OrderedRedriveDeleteActions", orderedRedriveDeleteActions},
	{"OrderedContinue", orderedContinue},
	{"OrderedStats", orderedStats},
	{"OrderedSettleSkipsHeldKey", orderedSettleSkipsHeldKey},
	{"OrderedSpentHead", orderedSpentHead},
	{"OrderedClaimAllTopics", orderedClaimAllTopics},
	{"OrderedBatchRun", orderedBatchRun},
	{"OrderedBatchMixedHandlers", orderedBatchMixedHandlers},
	{"OrderedBatchSize", orderedBatchSize},
	{"OrderedClaimCarriesDone", orderedClaimCarriesDone},
	{"OrderedInterleavings", orderedInterleavings},
	{"OrderedRedriveRacesDeath", orderedRedriveRacesDeath},
	{"OrderedRedriveLockRace", orderedRedriveLockRace},
	{"OrderedPlainRedrive", orderedPlainRedrive},
	{"OrderedRedrivePlace", orderedRedrivePlace},
	{"OrderedHeldKeyLiveness", orderedHeldKeyLiveness},
	{"OrderedModel", orderedModel},
}

// runOrdered registers the ordered cases when h's dialect orders, else
// one case that says, visibly, why they do not run.
func runOrdered(t *testing.T, h Harness) {
	if !h.Dialect.Capabilities().Ordered {
		t.Run("Ordered", func(t *testing.T) {
			t.Skipf("the %s dialect does not order by key yet (Capabilities.Ordered is false): ordered cases not run", h.Dialect.Name())
		})
		return
	}
	runCases(t, h, outbox.Config{OrderByKey: true}, append(slices.Clone(orderedCases), keyTrimCases...))
}

func (e *env) od(t *testing.T) outboxdriver.OrderedDialect {
	od, ok := e.rd.(outboxdriver.OrderedDialect)
	if !ok {
		t.Fatalf("%s: Capabilities.Ordered without OrderedDialect", e.ob.Dialect().Name())
	}
	return od
}

// states returns the states of ids, joined by spaces, and fails t on a
// message not found.
func (e *env) states(t *testing.T, ids ...outbox.ID) string {
	t.Helper()
	var out []string
	for _, id := range ids {
		found := ""
		for _, s := range []string{"pending", "processing", "blocked", "dead", "delivered"} {
			if e.count(t, idIs(id)+" AND state = '"+s+"'") == 1 {
				found = s
			}
		}
		if found == "" {
			found = "gone"
		}
		out = append(out, found)
	}
	return strings.Join(out, " ")
}

func resIDs(res []outbox.Result) []outbox.ID {
	ids := make([]outbox.ID, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids
}

// orderedPublish: a key's first message is its head (pending), the others
// blocked, numbered 1, 2, 3 across batches and topics; messages without a
// key are unordered; a rollback takes its numbers back.
func orderedPublish(t *testing.T, e *env) {
	a := e.publish(t, outbox.Message{Topic: "x", Key: "A"}, outbox.Message{Topic: "y", Key: "A"}, outbox.Message{Topic: "x"}, outbox.Message{Topic: "x", Key: "B"})
	tx := e.Begin(t)
	if _, err := e.ob.Publish(context.Background(), tx.Tx, outbox.Message{Topic: "x", Key: "A"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	b := e.publish(t, outbox.Message{Topic: "y", Key: "A"}, outbox.Message{Topic: "x", Key: "C", Delay: time.Hour})
	ids := append(resIDs(a), resIDs(b)...)
	if got, want := e.states(t, ids...), "pending blocked pending pending blocked pending"; got != want {
		t.Errorf("states %q, want %q", got, want)
	}
	for i, seq := range []string{"1", "2", "NULL", "1", "3", "1"} {
		where := idIs(ids[i]) + " AND key_seq = " + seq
		if seq == "NULL" {
			where = idIs(ids[i]) + " AND key_seq IS NULL"
		}
		if e.count(t, where) != 1 {
			t.Errorf("message %d: key_seq is not %s", i, seq)
		}
	}
	// An Outbox without OrderByKey on the same table still publishes
	// unordered messages.
	plain, err := outbox.New(e.ob.Dialect(), outbox.Config{Table: e.Table})
	if err != nil {
		t.Fatal(err)
	}
	tx = e.Begin(t)
	res, err := plain.Publish(context.Background(), tx.Tx, outbox.Message{Topic: "x", Key: "A"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if e.count(t, idIs(res.ID)+" AND key_seq IS NULL AND state = 'pending'") != 1 {
		t.Error("an unordered Outbox's message is not a plain pending one")
	}
}

// orderedPublishOne: messages published one per transaction (a dialect
// may store a batch of one with a statement of its own) are numbered and
// stored as in a batch: a key's first message is its head, the next
// blocked behind it; headers and payload are kept; a Delay or a NotBefore
// in the future keeps a head from being claimed, one in the past does not.
func orderedPublishOne(t *testing.T, e *env) {
	one := func(m outbox.Message) outbox.ID { return e.publish(t, m)[0].ID }
	a1 := one(outbox.Message{Topic: "x", Key: "A", Payload: []byte(`{"n":1}`), Headers: map[string]string{"h": "v"}, NotBefore: time.Now().Add(-time.Hour)})
	a2 := one(outbox.Message{Topic: "y", Key: "A"})
	b1 := one(outbox.Message{Topic: "x", Key: "B", Delay: time.Hour})
	c1 := one(outbox.Message{Topic: "x", Key: "C", NotBefore: time.Now().Add(time.Hour)})
	b2 := one(outbox.Message{Topic: "x", Key: "B"})
	if got, want := e.states(t, a1, a2, b1, c1, b2), "pending blocked pending pending blocked"; got != want {
		t.Errorf("states %q, want %q", got, want)
	}
	for id, seq := range map[outbox.ID]int{a1: 1, a2: 2, b1: 1, c1: 1, b2: 2} {
		if e.count(t, idIs(id)+fmt.Sprintf(" AND key_seq = %d", seq)) != 1 {
			t.Errorf("message %s: key_seq is not %d", id, seq)
		}
	}
	cs := e.claimOrdered(t, 10, 10, time.Minute)
	if len(cs) != 1 || cs[0].ID != a1 || len(cs[0].Run) != 1 || cs[0].Run[0].ID != a2 {
		t.Fatalf("claimed %+v, want A's head with A's second message as its run (B and C not due)", cs)
	}
	if !bytes.Contains(cs[0].Headers, []byte(`"h"`)) || string(normalizeJSON(t, cs[0].Payload)) != `{"n":1}` {
		t.Errorf("head's headers %s payload %s", cs[0].Headers, cs[0].Payload)
	}
}

// normalizeJSON returns b re-encoded (a database may store JSON with other
// spacing).
func normalizeJSON(t *testing.T, b []byte) []byte {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// orderedPublishSerialises: a second transaction publishing for a key
// waits until the first one commits, and is numbered after it.
func orderedPublishSerialises(t *testing.T, e *env) {
	ctx := context.Background()
	t1 := e.Begin(t)
	r1, err := e.ob.Publish(ctx, t1.Tx, outbox.Message{Topic: "x", Key: "K"})
	if err != nil {
		t.Fatal(err)
	}
	published := make(chan outbox.ID, 1)
	go func() {
		t2 := e.Begin(t)
		r2, err := e.ob.Publish(ctx, t2.Tx, outbox.Message{Topic: "x", Key: "K"})
		if err != nil {
			t.Error(err)
		}
		if err := t2.Commit(); err != nil {
			t.Error(err)
		}
		published <- r2.ID
	}()
	select {
	case <-published:
		t.Fatal("a second publisher of the key did not wait for the first to commit")
	case <-time.After(300 * time.Millisecond):
	}
	if err := t1.Commit(); err != nil {
		t.Fatal(err)
	}
	id2 := <-published
	if e.count(t, idIs(r1.ID)+" AND key_seq = 1 AND state = 'pending'") != 1 || e.count(t, idIs(id2)+" AND key_seq = 2 AND state = 'blocked'") != 1 {
		t.Errorf("states %s", e.states(t, r1.ID, id2))
	}
}

// orderedDedup: a duplicate DedupKey of an ordered message stores nothing
// and does not count in its key: once the key's messages are delivered, the
// key's next message is its head at once.
func orderedDedup(t *testing.T, e *env) {
	first := e.publish(t, outbox.Message{Topic: "x", Key: "K", DedupKey: "d1"}, outbox.Message{Topic: "x", Key: "K", DedupKey: "d2"})
	dup := e.publish(t, outbox.Message{Topic: "x", Key: "K", DedupKey: "d1"}, outbox.Message{Topic: "x", Key: "K"})
	if first[0].Duplicate || first[1].Duplicate || !dup[0].Duplicate || dup[1].Duplicate {
		t.Fatalf("duplicates %v %v", first, dup)
	}
	if got := e.states(t, first[0].ID, first[1].ID, dup[1].ID); got != "pending blocked blocked" {
		t.Fatalf("states %q", got)
	}
	if e.count(t, idIs(dup[1].ID)+" AND key_seq = 4") != 1 && e.count(t, idIs(dup[1].ID)+" AND key_seq = 3") != 1 {
		t.Error("the message after the duplicate is not numbered after the others")
	}
	var got []outbox.ID
	var mu sync.Mutex
	stop := e.relay(t, outbox.RelayConfig{}, map[string]outbox.Handler{"x": func(ctx context.Context, d outbox.Delivery) error {
		mu.Lock()
		got = append(got, d.ID)
		mu.Unlock()
		return nil
	}})
	waitFor(t, "delivered", func() bool { return e.count(t, "") == 0 })
	stop()
	if want := []outbox.ID{first[0].ID, first[1].ID, dup[1].ID}; !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
	next := e.publish(t, outbox.Message{Topic: "x", Key: "K"})
	if s := e.states(t, next[0].ID); s != "pending" {
		t.Errorf("the key's next message is %s, want pending: the duplicate counted in the key", s)
	}
}

func (e *env) claimOrdered(t *testing.T, limit, run int, lease time.Duration, done ...outboxdriver.Fence) []outboxdriver.Claimed {
	t.Helper()
	cs, _, err := e.od(t).ClaimOrdered(context.Background(), e.DB, e.ob.Table(), outboxdriver.ClaimParams{
		Topics: []string{"x", "y"}, Limit: limit, Lease: lease, MaxAttempts: 3, Done: done}, run)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func (e *env) settleRuns(t *testing.T, runs ...outboxdriver.RunOutcome) []outboxdriver.Fence {
	t.Helper()
	applied, busy, err := e.od(t).SettleRuns(context.Background(), e.DB, e.ob.Table(), outboxdriver.SettleParams{}, runs)
	if err != nil {
		t.Fatal(err)
	}
	if len(busy) > 0 {
		t.Fatalf("runs %v not written: their keys are held", busy)
	}
	return applied
}

// orderedRunClaim: a claim returns a head with the messages after it as
// its run (in order, up to the run limit, cut before a message not due or
// of a topic not claimed), leaves the run blocked, and the settle of a run
// deletes its successes, makes the failed message the head and leaves the
// rest blocked.
func orderedRunClaim(t *testing.T, e *env) {
	var msgs []outbox.Message
	for i := range 8 {
		msgs = append(msgs, outbox.Message{Topic: []string{"x", "y"}[i%2], Key: "K", Payload: fmt.Appendf(nil, `{"i":%d}`, i)})
	}
	msgs = append(msgs, outbox.Message{Topic: "z", Key: "K"}, outbox.Message{Topic: "x", Key: "K"})
	ids := resIDs(e.publish(t, msgs...))
	e.publish(t, outbox.Message{Topic: "x", Key: "L"}, outbox.Message{Topic: "x", Key: "L", Delay: time.Hour}, outbox.Message{Topic: "x", Key: "L"})

	cs := e.claimOrdered(t, 10, 5, time.Minute)
	if len(cs) != 2 {
		t.Fatalf("claimed %d heads, want 2", len(cs))
	}
	var k, l outboxdriver.Claimed
	for _, c := range cs {
		if c.Key == "K" {
			k = c
		} else {
			l = c
		}
	}
	if k.ID != ids[0] || k.KeySeq != 1 || len(k.Run) != 5 {
		t.Fatalf("head %s seq %d run %d, want %s 1 5", k.ID, k.KeySeq, len(k.Run), ids[0])
	}
	for i, m := range k.Run {
		if m.ID != ids[i+1] || m.KeySeq != int64(i+2) || m.Attempts != 0 || m.Topic != msgs[i+1].Topic {
			t.Errorf("run[%d] = %s seq %d attempts %d topic %s", i, m.ID, m.KeySeq, m.Attempts, m.Topic)
		}
	}
	if len(l.Run) != 0 {
		t.Errorf("key L's run took %d messages past one not due", len(l.Run))
	}
	if got := e.states(t, ids...); got != "processing blocked blocked blocked blocked blocked blocked blocked blocked blocked" {
		t.Errorf("states after the claim %q", got)
	}
	// The run limit: one more claim finds nothing, the run stays blocked.
	if cs := e.claimOrdered(t, 10, 5, time.Minute); len(cs) != 0 {
		t.Errorf("a second claim took %d messages of held keys", len(cs))
	}
	// Head and two run members done, the third failed.
	applied := e.settleRuns(t, outboxdriver.RunOutcome{
		Head: outboxdriver.Fence{ID: k.ID, Attempts: k.Attempts}, Key: "K", Done: []outbox.ID{ids[0], ids[1], ids[2]},
		Failed: outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: ids[3], Attempts: 1}, Kind: outboxdriver.SettleRetry, Error: "boom"},
	})
	if len(applied) != 1 {
		t.Fatalf("applied %v", applied)
	}
	if got := e.states(t, ids...); got != "gone gone gone pending blocked blocked blocked blocked blocked blocked" {
		t.Errorf("states after the settle %q", got)
	}
	if e.count(t, idIs(ids[3])+" AND attempts = 1 AND last_error = 'boom'") != 1 {
		t.Error("the failed run member did not become the head with attempts 1")
	}
	// The new head's run stops before topic z (not claimed).
	cs = e.claimOrdered(t, 10, 100, time.Minute)
	if len(cs) != 1 || cs[0].ID != ids[3] || cs[0].Attempts != 2 || len(cs[0].Run) != 4 {
		t.Fatalf("claimed %v", cs)
	}
	e.settleRuns(t, outboxdriver.RunOutcome{Head: outboxdriver.Fence{ID: ids[3], Attempts: 2}, Key: "K",
		Done: []outbox.ID{ids[3], ids[4], ids[5], ids[6], ids[7]}})
	if got := e.states(t, ids...); got != "gone gone gone gone gone gone gone gone pending blocked" {
		t.Errorf("states after the whole run %q: the z message should be the head", got)
	}
}

// orderedLeaseNoOvertake: while a head is held, and after its lease lapses,
// no later message of its key is claimed: the head is claimed again, with
// its run; the stale claim's settle changes nothing.
func orderedLeaseNoOvertake(t *testing.T, e *env) {
	ids := resIDs(e.publish(t, outbox.Message{Topic: "x", Key: "K"}, outbox.Message{Topic: "x", Key: "K"}, outbox.Message{Topic: "x", Key: "K"}))
	first := e.claimOrdered(t, 10, 10, time.Second)
	if len(first) != 1 || first[0].ID != ids[0] || len(first[0].Run) != 2 {
		t.Fatalf("first claim %v", first)
	}
	time.Sleep(1100 * time.Millisecond)
	again := e.claimOrdered(t, 10, 10, time.Minute)
	if len(again) != 1 || again[0].ID != ids[0] || again[0].Attempts != 2 || len(again[0].Run) != 2 {
		t.Fatalf("claim after the lease lapsed %v: want the same head, attempt 2, with its run", again)
	}
	// The stale claim's outcome (all done) is fenced off, run included.
	stale := e.settleRuns(t, outboxdriver.RunOutcome{Head: outboxdriver.Fence{ID: ids[0], Attempts: 1}, Key: "K", Done: ids})
	if len(stale) != 0 {
		t.Errorf("a stale run settle applied: %v", stale)
	}
	if got := e.states(t, ids...); got != "processing blocked blocked" {
		t.Errorf("states after the stale settle %q", got)
	}
	if n := len(e.settleRuns(t, outboxdriver.RunOutcome{Head: outboxdriver.Fence{ID: ids[0], Attempts: 2}, Key: "K", Done: ids})); n != 1 {
		t.Errorf("the current claim's settle applied %d", n)
	}
	if e.count(t, "") != 0 {
		t.Error("messages left after the run was settled")
	}
}

// delivery is one handler call recorded by orderedRelay.
type delivery struct {
	key, payload string
	attempt      int
	err          bool
}

// orderedRecorder records deliveries per key and fails t if two
// deliveries of one key are ever in flight at once.
type orderedRecorder struct {
	t        *testing.T
	mu       sync.Mutex
	inflight map[string]int
	log      map[string][]delivery
	fail     func(d outbox.Delivery) error
}

// poisonRecorder records deliveries and dead-letters every message whose
// payload contains a 1 until healed is set.
func poisonRecorder(t *testing.T, healed *atomic.Bool) *orderedRecorder {
	return newOrderedRecorder(t, func(d outbox.Delivery) error {
		if strings.Contains(string(d.Payload), "1") && !healed.Load() {
			return outbox.DeadLetter(errors.New("poison"))
		}
		return nil
	})
}

func newOrderedRecorder(t *testing.T, fail func(d outbox.Delivery) error) *orderedRecorder {
	return &orderedRecorder{t: t, inflight: map[string]int{}, log: map[string][]delivery{}, fail: fail}
}

func (r *orderedRecorder) handler(ctx context.Context, d outbox.Delivery) error {
	r.mu.Lock()
	r.inflight[d.Key]++
	if r.inflight[d.Key] > 1 {
		r.t.Errorf("two deliveries of key %s in flight at once", d.Key)
	}
	r.mu.Unlock()
	time.Sleep(time.Millisecond)
	var err error
	if r.fail != nil {
		err = r.fail(d)
	}
	r.mu.Lock()
	r.inflight[d.Key]--
	r.log[d.Key] = append(r.log[d.Key], delivery{d.Key, string(d.Payload), d.Attempt, err != nil})
	r.mu.Unlock()
	return err
}

// successes returns the payloads of key's successful deliveries, in order.
func (r *orderedRecorder) successes(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, d := range r.log[key] {
		if !d.err {
			out = append(out, d.payload)
		}
	}
	return out
}

func seqPayloads(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"n": %d}`, i)
	}
	return out
}

// orderedDelivery: with many handler slots, every key's messages are
// delivered once each, in publish order across topics and transactions,
// never two of a key at once.
func orderedDelivery(t *testing.T, e *env) {
	rec := newOrderedRecorder(t, nil)
	const keys, per = 6, 12
	e.relay(t, outbox.RelayConfig{Concurrency: 20, BatchSize: 4}, map[string]outbox.Handler{"x": rec.handler, "y": rec.handler})
	for i := range per {
		var msgs []outbox.Message
		for k := range keys {
			msgs = append(msgs, outbox.Message{Topic: []string{"x", "y"}[(i+k)%2], Key: fmt.Sprintf("k%d", k), Payload: fmt.Appendf(nil, `{"n": %d}`, i)})
		}
		e.publish(t, msgs...)
	}
	waitFor(t, "all delivered", func() bool { return e.count(t, "") == 0 })
	for k := range keys {
		if got := rec.successes(fmt.Sprintf("k%d", k)); !slices.Equal(normalize(got), seqPayloads(per)) {
			t.Errorf("key k%d delivered %v", k, got)
		}
	}
}

// normalize makes payloads comparable across JSON columns ({"n":1} and
// {"n": 1}).
func normalize(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = strings.ReplaceAll(strings.ReplaceAll(p, `": `, `":`), `":`, `": `)
	}
	return out
}

// orderedRetryBlocksOnlyItsKey: a failing message holds back its key's
// later messages until it succeeds; other keys flow meanwhile.
func orderedRetryBlocksOnlyItsKey(t *testing.T, e *env) {
	var failures atomic.Int32
	release := make(chan struct{})
	rec := newOrderedRecorder(t, func(d outbox.Delivery) error {
		if d.Key == "A" && strings.Contains(string(d.Payload), "1") {
			select {
			case <-release:
				return nil
			default:
				failures.Add(1)
				return errors.New("not yet")
			}
		}
		return nil
	})
	e.relay(t, outbox.RelayConfig{MaxAttempts: outbox.UnlimitedAttempts}, map[string]outbox.Handler{"x": rec.handler})
	var msgs []outbox.Message
	for i := range 3 {
		msgs = append(msgs, outbox.Message{Topic: "x", Key: "A", Payload: fmt.Appendf(nil, `{"n": %d}`, i)},
			outbox.Message{Topic: "x", Key: "B", Payload: fmt.Appendf(nil, `{"n": %d}`, i)})
	}
	e.publish(t, msgs...)
	waitFor(t, "B delivered and A failing", func() bool { return len(rec.successes("B")) == 3 && failures.Load() >= 3 })
	if got := normalize(rec.successes("A")); !slices.Equal(got, seqPayloads(1)) {
		t.Errorf("key A delivered %v while its second message failed", got)
	}
	close(release)
	waitFor(t, "A delivered", func() bool { return len(rec.successes("A")) == 3 })
	if got := normalize(rec.successes("A")); !slices.Equal(got, seqPayloads(3)) {
		t.Errorf("key A delivered %v", got)
	}
}

// orderedHaltRedriveSkip: a dead message halts its key (HaltKey, the
// default); other keys flow; SkipHead skips a dead head and the key goes
// on; Purge leaves a halted head alone; a redrive delivers it again at its
// place, then the rest.
func orderedHaltRedriveSkip(t *testing.T, e *env) {
	var healed atomic.Bool
	rec := poisonRecorder(t, &healed)
	stop := e.relay(t, outbox.RelayConfig{}, map[string]outbox.Handler{"x": rec.handler})
	var msgs []outbox.Message
	for i := range 3 {
		for _, k := range []string{"A", "S"} {
			msgs = append(msgs, outbox.Message{Topic: "x", Key: k, Payload: fmt.Appendf(nil, `{"n": %d}`, i)})
		}
	}
	msgs = append(msgs, outbox.Message{Topic: "x", Key: "C", Payload: []byte(`{"n": 0}`)})
	res := e.publish(t, msgs...)
	waitFor(t, "A and S halted", func() bool { return e.count(t, "state = 'dead'") == 2 && len(rec.successes("C")) == 1 })
	time.Sleep(200 * time.Millisecond) // the relay polls meanwhile: nothing more of A or S
	if got := e.states(t, res[0].ID, res[2].ID, res[4].ID); got != "gone dead blocked" {
		t.Fatalf("key A: %q, want gone dead blocked", got)
	}
	ctx := context.Background()
	if _, ok, err := e.ob.SkipHead(ctx, e.DB, "C"); err != nil || ok {
		t.Errorf("SkipHead of a key without a dead head: %v %v", ok, err)
	}
	if _, _, err := e.ob.SkipHead(ctx, e.DB, ""); err == nil {
		t.Error("SkipHead with an empty key: no error")
	}
	// Skip S's dead head: S goes on without it.
	id, ok, err := e.ob.SkipHead(ctx, e.DB, "S")
	if err != nil || !ok || id != res[3].ID {
		t.Fatalf("SkipHead S: %s %v %v, want %s", id, ok, err, res[3].ID)
	}
	waitFor(t, "S delivered", func() bool { return len(rec.successes("S")) == 2 })
	if got := normalize(rec.successes("S")); !slices.Equal(got, []string{`{"n": 0}`, `{"n": 2}`}) {
		t.Errorf("S delivered %v", got)
	}
	// Purge deletes S's skipped message, never A's halted head (A would
	// wait forever for it).
	if n, err := e.ob.Purge(ctx, e.DB, outbox.PurgeOptions{States: []outbox.State{outbox.StateDead}}); err != nil || n != 1 {
		t.Fatalf("purge of dead messages: %d %v, want 1 (the skipped one)", n, err)
	}
	// Redrive: A's dead head first, then the rest.
	healed.Store(true)
	if n, err := e.ob.Redrive(ctx, e.DB, ""); err != nil || n != 1 {
		t.Fatalf("redrive: %d %v", n, err)
	}
	waitFor(t, "all delivered", func() bool { return e.count(t, "") == 0 })
	if got := normalize(rec.successes("A")); !slices.Equal(got, seqPayloads(3)) {
		t.Errorf("A delivered %v after the redrive", got)
	}
	stop()
	next := e.publish(t, outbox.Message{Topic: "x", Key: "A"}, outbox.Message{Topic: "x", Key: "S"})
	if got := e.states(t, resIDs(next)...); got != "pending pending" {
		t.Errorf("the keys' next messages are %q, want heads: a key's count went wrong", got)
	}
}

// orderedContinue: under ContinueKey a dead message lets its key go on; a
// redrive re-enters it behind the key's head, never beside it.
func orderedContinue(t *testing.T, e *env) {
	var healed atomic.Bool
	hold := make(chan struct{})
	rec := newOrderedRecorder(t, func(d outbox.Delivery) error {
		p := string(d.Payload)
		if strings.Contains(p, "1") && !healed.Load() {
			return outbox.DeadLetter(errors.New("poison"))
		}
		if strings.Contains(p, "5") {
			<-hold
		}
		return nil
	})
	e.relay(t, outbox.RelayConfig{DeadKeys: outbox.HaltKey, DeadKeysByTopic: map[string]outbox.DeadKeyPolicy{"x": outbox.ContinueKey}},
		map[string]outbox.Handler{"x": rec.handler})
	var msgs []outbox.Message
	for i := range 3 {
		msgs = append(msgs, outbox.Message{Topic: "x", Key: "A", Payload: fmt.Appendf(nil, `{"n": %d}`, i)})
	}
	res := e.publish(t, msgs...)
	waitFor(t, "A went on", func() bool { return len(rec.successes("A")) == 2 })
	waitFor(t, "A settled", func() bool { return e.states(t, resIDs(res)...) == "gone dead gone" })
	// Redrive while A has a head in flight: the redriven message waits
	// behind it.
	held := e.publish(t, outbox.Message{Topic: "x", Key: "A", Payload: []byte(`{"n": 5}`)})
	waitFor(t, "the new head in flight", func() bool { return e.states(t, held[0].ID) == "processing" })
	healed.Store(true)
	if n, err := e.ob.Redrive(context.Background(), e.DB, "x"); err != nil || n != 1 {
		t.Fatalf("redrive %d %v", n, err)
	}
	if got := e.states(t, res[1].ID); got != "blocked" {
		t.Errorf("redriven message is %s while its key's head is in flight, want blocked", got)
	}
	close(hold)
	waitFor(t, "all delivered", func() bool { return e.count(t, "") == 0 })
	if got := normalize(rec.successes("A")); !slices.Equal(got, []string{`{"n": 0}`, `{"n": 2}`, `{"n": 5}`, `{"n": 1}`}) {
		t.Errorf("A delivered %v", got)
	}
}

// orderedStats: Stats counts blocked messages, keys held behind a head
// and keys blocked by a failed head; a relay without a handler for a
// head's topic reports it.
func orderedStats(t *testing.T, e *env) {
	e.publish(t, outbox.Message{Topic: "x", Key: "A"}, outbox.Message{Topic: "y", Key: "A"}, outbox.Message{Topic: "y", Key: "A"},
		outbox.Message{Topic: "z", Key: "B"}, outbox.Message{Topic: "y", Key: "B"})
	e.relay(t, outbox.RelayConfig{}, map[string]outbox.Handler{"x": func(context.Context, outbox.Delivery) error {
		return outbox.DeadLetter(errors.New("poison"))
	}, "y": func(context.Context, outbox.Delivery) error { return nil }})
	waitFor(t, "A halted", func() bool { return e.count(t, "state = 'dead'") == 1 })
	ts, err := e.ob.Stats(context.Background(), e.DB)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]outbox.TopicStats{}
	for _, s := range ts {
		by[s.Topic] = s
	}
	if x := by["x"]; x.BlockedKeys != 1 || x.HeldKeys != 1 || x.OldestBlockedKey <= 0 || x.Dead != 1 {
		t.Errorf("x: %+v, want 1 blocked key held by a dead head", x)
	}
	if y := by["y"]; y.Blocked != 3 || y.HeldKeys != 0 || y.BlockedKeys != 0 {
		t.Errorf("y: %+v, want 3 blocked messages", y)
	}
	if z := by["z"]; z.HeldKeys != 1 || z.BlockedKeys != 0 || z.Pending != 1 {
		t.Errorf("z: %+v, want 1 held key, not blocked", z)
	}
	r, err := e.ob.Relay(e.DB, outbox.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Handle("y", func(context.Context, outbox.Delivery) error { return nil }); err != nil {
		t.Fatal(err)
	}
	rs, err := r.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rs.UnhandledHeads, []string{"x", "z"}) {
		t.Errorf("UnhandledHeads %v, want [x z]", rs.UnhandledHeads)
	}
}

// orderedSettleSkipsHeldKey (I6): while an open transaction that published
// for key K holds K's key row, a settle of runs of K and J writes J's run
// at once and returns K's as busy, untouched (settling K without the lock
// would not see the message that transaction stored, leaving it blocked
// behind no head); once the transaction commits, K's run is written and
// the new message promoted. With one writer at a time (SQLite), where the
// open transaction holds the database, the settle waits for it instead.
func orderedSettleSkipsHeldKey(t *testing.T, e *env) {
	ctx := context.Background()
	h := resIDs(e.publish(t, outbox.Message{Topic: "x", Key: "K"}, outbox.Message{Topic: "x", Key: "J"}))
	if cs := e.claimOrdered(t, 10, 10, time.Minute); len(cs) != 2 {
		t.Fatalf("claimed %v", cs)
	}
	tx := e.Begin(t)
	m, err := e.ob.Publish(ctx, tx.Tx, outbox.Message{Topic: "x", Key: "K"})
	if err != nil {
		t.Fatal(err)
	}
	runs := []outboxdriver.RunOutcome{
		{Head: outboxdriver.Fence{ID: h[0], Attempts: 1}, Key: "K", Done: []outbox.ID{h[0]}},
		{Head: outboxdriver.Fence{ID: h[1], Attempts: 1}, Key: "J", Done: []outbox.ID{h[1]}},
	}
	type result struct {
		applied []outboxdriver.Fence
		busy    []int
	}
	settled := make(chan result, 1)
	go func() {
		applied, busy, err := e.od(t).SettleRuns(ctx, e.DB, e.ob.Table(), outboxdriver.SettleParams{}, runs)
		if err != nil {
			t.Error(err)
		}
		settled <- result{applied, busy}
	}()
	oneWriter := e.ob.Dialect().Name() == "sqlite"
	select {
	case res := <-settled:
		if oneWriter {
			t.Fatal("the settle did not wait for the open transaction")
		}
		if len(res.applied) != 1 || res.applied[0].ID != h[1] || !slices.Equal(res.busy, []int{0}) {
			t.Fatalf("applied %v busy %v, want J's run applied and K's (0) busy", res.applied, res.busy)
		}
		if got := e.states(t, h[0], h[1]); got != "processing gone" {
			t.Fatalf("states %q: K's run was touched while its key was held", got)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if applied := e.settleRuns(t, runs[0]); len(applied) != 1 {
			t.Fatalf("K's run after the commit: applied %v", applied)
		}
	case <-time.After(2 * time.Second):
		if !oneWriter {
			t.Fatal("the settle waited for the open publish of one of its keys")
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if res := <-settled; len(res.applied) != 2 || len(res.busy) != 0 {
			t.Fatalf("applied %v busy %v", res.applied, res.busy)
		}
	}
	if got := e.states(t, h[0], h[1], m.ID); got != "gone gone pending" {
		t.Errorf("states %q, want the published message promoted", got)
	}
}

// orderedSpentHead: a head whose attempts are spent (claimed again after
// lapsed leases) is dead-lettered without running its handler, under its
// key's policy: Halt keeps the key waiting.
func orderedSpentHead(t *testing.T, e *env) {
	ids := resIDs(e.publish(t, outbox.Message{Topic: "x", Key: "K"}, outbox.Message{Topic: "x", Key: "K"}))
	e.claimOrdered(t, 10, 10, time.Second)
	time.Sleep(1100 * time.Millisecond)
	if cs := e.claimOrdered(t, 10, 10, time.Second); len(cs) != 1 || cs[0].Attempts != 2 {
		t.Fatalf("second claim %v", cs)
	}
	time.Sleep(1100 * time.Millisecond)
	var calls atomic.Int32
	e.relay(t, outbox.RelayConfig{MaxAttempts: 2}, map[string]outbox.Handler{"x": func(context.Context, outbox.Delivery) error {
		calls.Add(1)
		return nil
	}})
	waitFor(t, "dead", func() bool { return e.states(t, ids...) == "dead blocked" })
	time.Sleep(100 * time.Millisecond)
	if n := calls.Load(); n != 0 {
		t.Errorf("%d handler calls for a spent head and the message behind it", n)
	}
	if e.count(t, idIs(ids[0])+" AND last_error = 'max attempts reached'") != 1 {
		t.Error("the spent head's last_error is not 'max attempts reached'")
	}
}

// orderedRunBudget: the run limit bounds the run members of a whole claim,
// shared among its heads, each run a prefix of its key.
func orderedRunBudget(t *testing.T, e *env) {
	var msgs []outbox.Message
	for i := range 12 {
		msgs = append(msgs, outbox.Message{Topic: "x", Key: fmt.Sprintf("K%d", i%3)})
	}
	e.publish(t, msgs...)
	cs := e.claimOrdered(t, 10, 4, time.Minute)
	if len(cs) != 3 {
		t.Fatalf("claimed %d heads, want 3", len(cs))
	}
	members := 0
	for _, c := range cs {
		members += len(c.Run)
		if len(c.Run) < 1 {
			t.Errorf("head %s got no run member: the budget is not shared", c.Key)
		}
		for i, m := range c.Run {
			if m.Key != c.Key || m.KeySeq != c.KeySeq+int64(i)+1 {
				t.Errorf("run of %s: member %d is %s seq %d, not the next of its key", c.Key, i, m.Key, m.KeySeq)
			}
		}
	}
	if members != 4 {
		t.Errorf("%d run members in the claim, want the limit, 4", members)
	}
}

// orderedHotKeyWakes: the settle of a run makes the relay claim the key's
// next head at once, not at its next poll (nothing notifies of a
// promotion): with an hour between polls and no listener, a hot key of
// several runs is delivered all the same.
func orderedHotKeyWakes(t *testing.T, e *env) {
	msgs := make([]outbox.Message, 12)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "x", Key: "hot"}
	}
	e.publish(t, msgs...)
	var n atomic.Int32
	e.relay(t, outbox.RelayConfig{PollInterval: time.Hour, Listen: outbox.ListenOff, BatchSize: 2},
		map[string]outbox.Handler{"x": func(context.Context, outbox.Delivery) error { n.Add(1); return nil }})
	waitFor(t, "the hot key's runs delivered", func() bool { return e.count(t, "") == 0 })
	if n.Load() != 12 {
		t.Errorf("%d deliveries, want 12", n.Load())
	}
}

// orderedSkipAction: Outbox.Act with ActSkip (the CLI's and the
// dashboard's skip) skips only dead messages that halt their key, fenced
// by the message's id, and logs who skipped what and how many.
func orderedSkipAction(t *testing.T, e *env) {
	rec := poisonRecorder(t, new(atomic.Bool))
	stop := e.relay(t, outbox.RelayConfig{DeadKeysByTopic: map[string]outbox.DeadKeyPolicy{"c": outbox.ContinueKey}},
		map[string]outbox.Handler{"x": rec.handler, "c": rec.handler})
	defer stop()
	var msgs []outbox.Message
	for i := range 3 {
		msgs = append(msgs, outbox.Message{Topic: "x", Key: "H", Payload: fmt.Appendf(nil, `{"n": %d}`, i)},
			outbox.Message{Topic: "c", Key: "C", Payload: fmt.Appendf(nil, `{"n": %d}`, i)})
	}
	res := e.publish(t, msgs...)
	waitFor(t, "H halted and C through", func() bool { return e.count(t, "state = 'dead'") == 2 && len(rec.successes("C")) == 2 })
	ctx := context.Background()
	var logged bytes.Buffer
	opts := &outbox.ActOptions{Actor: "alice", Logger: slog.New(slog.NewJSONHandler(&logged, nil))}
	// C's dead message (Continue) halts nothing; the fence refuses a head
	// that is not the one named.
	if n, err := e.ob.Act(ctx, e.DB, outbox.ActSkip, outbox.Filter{Key: "C"}, opts); err != nil || n != 0 {
		t.Errorf("skip of a dead message that halts nothing: %d %v, want 0", n, err)
	}
	if _, ok, err := e.od(t).SkipHead(ctx, e.DB, e.ob.Table(), "H", res[0].ID); err != nil || ok {
		t.Errorf("SkipHead fenced by another id: %v %v, want nothing skipped", ok, err)
	}
	if n, err := e.ob.Act(ctx, e.DB, outbox.ActSkip, outbox.Filter{States: []outbox.State{outbox.StatePending}, Key: "H"}, opts); err != nil || n != 0 {
		t.Errorf("skip of pending messages: %d %v, want 0", n, err)
	}
	if got := e.states(t, res[2].ID, res[4].ID); got != "dead blocked" {
		t.Fatalf("H before the skip: %q, want dead blocked", got)
	}
	logged.Reset()
	n, err := e.ob.Act(ctx, e.DB, outbox.ActSkip, outbox.Filter{Topic: "x"}, opts)
	if err != nil || n != 1 {
		t.Fatalf("skip of topic x: %d %v, want 1", n, err)
	}
	waitFor(t, "H delivered after the skip", func() bool { return len(rec.successes("H")) == 2 })
	if got := e.states(t, res[2].ID); got != "dead" {
		t.Errorf("the skipped message: %q, want dead", got)
	}
	var line map[string]any
	if err := json.Unmarshal(logged.Bytes(), &line); err != nil {
		t.Fatalf("log line %q: %v", logged.String(), err)
	}
	for k, want := range map[string]any{"action": "skip", "actor": "alice", "filter": `topic="x"`, "changed": float64(1)} {
		if line[k] != want {
			t.Errorf("log line's %s: %v, want %v (%s)", k, line[k], want, logged.String())
		}
	}
	// Skipped, it halts nothing: a second skip finds nothing.
	if n, err := e.ob.Act(ctx, e.DB, outbox.ActSkip, outbox.Filter{IDs: []outbox.ID{res[2].ID}}, opts); err != nil || n != 0 {
		t.Errorf("second skip: %d %v, want 0", n, err)
	}
}

// orderedRedriveDeleteActions: Outbox.Act's redrive and delete keep the
// keys' order: a delete never takes a halted head or a blocked message
// (the key would wait forever), a redrive by filter re-enters dead ordered
// messages in their keys (a halted head first), and the keys flow again
// afterwards (new messages of each key are pending at once).
func orderedRedriveDeleteActions(t *testing.T, e *env) {
	var healed atomic.Bool
	rec := poisonRecorder(t, &healed)
	stop := e.relay(t, outbox.RelayConfig{DeadKeysByTopic: map[string]outbox.DeadKeyPolicy{"c": outbox.ContinueKey}},
		map[string]outbox.Handler{"x": rec.handler, "c": rec.handler})
	var msgs []outbox.Message
	for i := range 3 {
		msgs = append(msgs, outbox.Message{Topic: "x", Key: "H", Payload: fmt.Appendf(nil, `{"n": %d}`, i)},
			outbox.Message{Topic: "c", Key: "C", Payload: fmt.Appendf(nil, `{"n": %d}`, i)},
			outbox.Message{Topic: "c", Key: "E", Payload: fmt.Appendf(nil, `{"n": %d}`, i)})
	}
	res := e.publish(t, msgs...)
	waitFor(t, "H halted, C and E through", func() bool {
		return e.count(t, "state = 'dead'") == 3 && len(rec.successes("C")) == 2 && len(rec.successes("E")) == 2
	})
	ctx := context.Background()
	opts := actOpts(t)
	if n, err := e.ob.Act(ctx, e.DB, outbox.ActDelete, outbox.Filter{Key: "H"}, opts); err != nil || n != 0 {
		t.Errorf("delete of key H (a halted head, a blocked message): %d %v, want 0", n, err)
	}
	if got := e.states(t, res[3].ID, res[6].ID); got != "dead blocked" {
		t.Fatalf("H after the delete: %q, want dead blocked", got)
	}
	if n, err := e.ob.Act(ctx, e.DB, outbox.ActDelete, outbox.Filter{Key: "C", States: []outbox.State{outbox.StateDead}}, opts); err != nil || n != 1 {
		t.Errorf("delete of C's dead message (ContinueKey, halts nothing): %d %v, want 1", n, err)
	}
	healed.Store(true)
	if n, err := e.ob.Act(ctx, e.DB, outbox.ActRedrive, outbox.Filter{States: []outbox.State{outbox.StateDead}}, opts); err != nil || n != 2 {
		t.Fatalf("redrive of the dead: %d %v, want 2 (H's head, E's)", n, err)
	}
	waitFor(t, "all delivered", func() bool { return e.count(t, "") == 0 })
	if got := normalize(rec.successes("H")); !slices.Equal(got, seqPayloads(3)) {
		t.Errorf("H delivered %v after the redrive", got)
	}
	stop()
	next := e.publish(t, outbox.Message{Topic: "x", Key: "H"}, outbox.Message{Topic: "c", Key: "C"}, outbox.Message{Topic: "c", Key: "E"})
	if got := e.states(t, resIDs(next)...); got != "pending pending pending" {
		t.Errorf("new messages of H, C, E: %q, want pending pending pending (the keys' counts are off)", got)
	}
}

// orderedClaimCarriesDone: an ordered claim that carries successes writes
// those whose fence holds and reports exactly them as written: a stale one
// (its attempts no longer the row's) changes nothing and is left out.
func orderedClaimCarriesDone(t *testing.T, e *env) {
	ids := resIDs(e.publish(t, outbox.Message{Topic: "x"}, outbox.Message{Topic: "x"}, outbox.Message{Topic: "x", Key: "K"}))
	if cs := e.claimOrdered(t, 10, 10, time.Minute); len(cs) != 3 {
		t.Fatalf("claimed %d, want 3", len(cs))
	}
	fresh := outboxdriver.Fence{ID: ids[0], Attempts: 1}
	stale := outboxdriver.Fence{ID: ids[1], Attempts: 7}
	cs, done, err := e.od(t).ClaimOrdered(context.Background(), e.DB, e.ob.Table(), outboxdriver.ClaimParams{
		Topics: []string{"x"}, Limit: 10, Lease: time.Minute, MaxAttempts: 3, Done: []outboxdriver.Fence{fresh, stale}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 0 {
		t.Errorf("claimed %d held messages", len(cs))
	}
	if len(done) != 1 || done[0] != fresh {
		t.Errorf("written %v, want only %v", done, fresh)
	}
	if got := e.states(t, ids...); got != "gone processing processing" {
		t.Errorf("states %q, want the fresh success deleted, the stale one left", got)
	}
}
