package outbox

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/oncommit/oncommit/internal/backoff"
	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds ordered delivery (Config.OrderByKey): the publish's
// second statement when an ordered message has a DedupKey, the relay's
// runs (a claimed head and the messages after it in its key, run one after
// another on one handler slot), their settler, and the operations that
// keep a key's order (SkipHead; Redrive and Stats go through the ordered
// dialect when the Outbox orders).

// DeadKeyPolicy says what a dead-lettered ordered message does to its key.
type DeadKeyPolicy int

const (
	// HaltKey keeps the dead message as its key's head: the key's later
	// messages wait until it is redriven ([Outbox.Redrive]) or skipped
	// ([Outbox.SkipHead]).
	HaltKey DeadKeyPolicy = iota
	// ContinueKey lets the key go on with its next message.
	ContinueKey
)

// StateBlocked is the state of an ordered message waiting behind the head
// of its key.
const StateBlocked = outboxdriver.StateBlocked

// initOrdered sets the relay up for an Outbox with OrderByKey.
func (r *Relay) initOrdered() error {
	if !r.ob.cfg.OrderByKey {
		return nil
	}
	od, ok := r.d.(outboxdriver.OrderedDialect)
	if !ok {
		return fmt.Errorf("%w: the %s dialect cannot order messages by key", ErrUnsupported, r.ob.d.Name())
	}
	// A run's settle is a transaction: refuse here a DB that cannot run
	// one (a wrapper around an adapter that hides its InTx) rather than
	// deliver messages whose outcomes can never be written.
	if _, ok := r.db.(outboxdriver.TxDB); !ok {
		return fmt.Errorf("%w: %T cannot run a transaction, which ordered delivery needs (wrap an adapter without hiding its InTx)", ErrUnsupported, r.db)
	}
	r.ord = &orderedRelay{od: od, added: make(chan struct{}, 1), stopped: make(chan struct{})}
	return nil
}

// validateOrdered checks the dead-letter policies of c.
func (c *RelayConfig) validateOrdered() error {
	if c.DeadKeys != HaltKey && c.DeadKeys != ContinueKey {
		return &ConfigError{Field: "DeadKeys", Reason: "unknown policy"}
	}
	for topic, p := range c.DeadKeysByTopic {
		if p != HaltKey && p != ContinueKey {
			return &ConfigError{Field: "DeadKeysByTopic", Reason: fmt.Sprintf("unknown policy for topic %q", topic)}
		}
	}
	return nil
}

// runBudgetBatches is how many BatchSize a claim's runs share when the
// relay has no batch handler (see runBudget).
const runBudgetBatches = 4

// runBudget is the most run members one ordered claim takes, shared among
// its heads round-robin (one hot key gets a run this long): 4 x BatchSize,
// so that a claim of BatchSize heads of keys with a handful of messages
// each takes their keys whole (one claim, one settle and no promotion per
// key, instead of a run of two and a promotion per claim: see
// docs/benchmarks.md), or BatchSize when the relay has a batch handler,
// which gets at most a claim's messages at once.
func (r *Relay) runBudget() int {
	if r.anyBatch() {
		return r.cfg.BatchSize
	}
	return runBudgetBatches * r.cfg.BatchSize
}

// halts reports whether a dead message of topic halts its key.
func (r *Relay) halts(topic string) bool {
	if p, ok := r.cfg.DeadKeysByTopic[topic]; ok {
		return p == HaltKey
	}
	return r.cfg.DeadKeys == HaltKey
}

// orderedRelay is the state of a relay's ordered delivery: the outcomes of
// runs waiting to be written.
type orderedRelay struct {
	od      outboxdriver.OrderedDialect
	mu      sync.Mutex
	runs    []queuedRun
	closed  bool
	added   chan struct{} // signalled when runs becomes non-empty
	stopped chan struct{} // closed when the run settler has returned
}

// queuedRun is a run's outcome waiting to be written, until expires (its
// head's lease will have lapsed by then).
type queuedRun struct {
	outboxdriver.RunOutcome
	expires time.Time
	// settled are the settlements of the run's messages handled (Done's,
	// then Failed), for the tracer (see runOutcomes); nil without one.
	settled []outboxdriver.Settlement
}

// sendRun queues a run's outcome; after the run settler's last write it is
// logged as dropped (the head's lease lapses and the run is delivered
// again, in order).
func (r *Relay) sendRun(q queuedRun) {
	o := r.ord
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		r.droppedRuns("the relay has stopped", []queuedRun{q})
		return
	}
	first := len(o.runs) == 0
	o.runs = append(o.runs, q)
	o.mu.Unlock()
	if first {
		notify(o.added)
	}
}

// moreComing reports whether other outcomes may soon join those waiting:
// whether more of the relay's handlers are in flight (inflight) than runs
// wait (a handler that queued its run is counted until it returns). When
// none are, lingering only delays the write, and so the next run of the
// keys waiting for it: a hot key's runs follow one another, each behind
// the settle of the last.
func (o *orderedRelay) moreComing(inflight int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return inflight > len(o.runs)
}

func (o *orderedRelay) take(n int, closing bool) []queuedRun {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = o.closed || closing
	k := min(len(o.runs), n)
	out := append([]queuedRun(nil), o.runs[:k]...)
	o.runs = append(o.runs[:0], o.runs[k:]...)
	return out
}

func (r *Relay) droppedRuns(why string, runs []queuedRun) {
	ids := make([]string, 0, min(len(runs), 10))
	for _, q := range runs[:min(len(runs), 10)] {
		ids = append(ids, q.Head.ID.String())
	}
	r.log.Warn("outbox: run outcomes dropped; their keys' heads will be delivered again after their lease", "why", why, "count", len(runs), "heads", ids)
}

// deliverOrdered delivers j when it needs more than deliver does: a
// message whose attempts are spent (an ordered claim never dead-letters,
// so that a dead head goes through its key's policy) or an ordered head
// and its run. It reports false, doing nothing, for a plain unordered
// message.
func (r *Relay) deliverOrdered(j *job) bool {
	c := j.c
	spent := r.spent(j)
	if c.KeySeq == 0 && !spent {
		return false
	}
	defer r.finished(j)
	if spent {
		r.deadSpent(j)
		return true
	}
	head := outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}
	out := outboxdriver.RunOutcome{Head: head, Key: c.Key, Done: make([]outboxdriver.ID, 0, 1+len(c.Run))}
	var settled []outboxdriver.Settlement // for the tracer
	for i := -1; i < len(c.Run); i++ {
		m, attempts := c, c.Attempts
		if i >= 0 {
			if j.ctx.Err() != nil {
				break // lease lost or grace over: the rest stays blocked
			}
			// A run member was not claimed: this delivery is its next
			// attempt, counted if it fails.
			m = &c.Run[i]
			attempts = m.Attempts + 1
		}
		s := r.handleOne(&j.ctx, m, attempts)
		if r.cfg.Tracer != nil {
			settled = append(settled, s)
		}
		if s.Kind == outboxdriver.SettleDone {
			out.Done = append(out.Done, m.ID)
			continue
		}
		out.Failed = s
		out.Halt = out.Failed.Kind == outboxdriver.SettleDead && r.halts(m.Topic)
		break
	}
	// The lease as renewed during the run, read once the run is over.
	r.sendRun(queuedRun{out, j.b.leaseEnd(r.cfg.Lease), settled})
	return true
}

// spent reports whether the message of j had its attempts (an ordered
// claim never dead-letters at claim: see deliverOrdered).
func (r *Relay) spent(j *job) bool { return j.c.Attempts-j.c.AttemptsBase > r.cfg.MaxAttempts }

// deadSpent dead-letters the spent message of j without running a
// handler: through its key's policy when it is an ordered head.
func (r *Relay) deadSpent(j *job) {
	c := j.c
	head := outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}
	expires := j.b.leaseEnd(r.cfg.Lease)
	r.log.Warn("outbox: message dead-lettered at claim: max attempts reached", logWho(c, "attempt", c.Attempts-c.AttemptsBase-1)...)
	if r.cfg.Observer != nil {
		r.cfg.Observer.DeadLettered(&j.ctx, DeadLetterEvent{ID: c.ID, Topic: c.Topic, Subscriber: subscriberOf(c.Key), Attempt: c.Attempts - c.AttemptsBase - 1, Reason: DeadMaxAttempts})
	}
	s := outboxdriver.Settlement{Fence: head, Kind: outboxdriver.SettleDead, Error: "max attempts reached"}
	if c.KeySeq == 0 {
		r.send(queued{s, expires})
	} else {
		r.sendRun(queuedRun{outboxdriver.RunOutcome{Head: head, Key: c.Key, Failed: s, Halt: r.halts(c.Topic)}, expires, []outboxdriver.Settlement{s}})
	}
}

// handleOne runs the handler of message m, delivered for the attempts-th
// time, and returns its outcome (told to the observer, if any).
func (r *Relay) handleOne(ctx context.Context, m *outboxdriver.Claimed, attempts int) outboxdriver.Settlement {
	d := newDelivery(m, attempts)
	var err error
	if len(m.Headers) > 0 {
		d.Headers, err = decodeHeaders(m.Headers)
	}
	var start time.Time
	if r.cfg.Observer != nil {
		ctx = r.cfg.Observer.HandlerStart(ctx, d)
		start = time.Now()
	}
	ran := err == nil
	if ran {
		err = r.callTopic(ctx, d)
	}
	mc := *m
	mc.Attempts = attempts
	s := r.outcome(&mc, err)
	if r.cfg.Observer != nil {
		r.observeHandled(ctx, &d, &s, start, ran, err)
	}
	return s
}

// startRuns starts the run settler of an ordered relay and returns the
// function that stops it once the handlers are done: it writes what is
// left and returns.
func (r *Relay) startRuns(ctx context.Context) (stop func()) {
	if r.ord == nil {
		return func() {}
	}
	quit := make(chan struct{})
	go r.runSettleLoop(context.WithoutCancel(ctx), quit)
	return func() {
		close(quit)
		<-r.ord.stopped
	}
}

// runSettleLoop writes run outcomes: once one is waiting, it gathers those
// that arrive within settleLinger (no wait when no other handler is in
// flight: see moreComing) and writes them with one SettleRuns (a
// transaction of two statements). A failed write puts them back (unless
// their lease has lapsed) and waits a backoff. Runs whose key row another
// transaction holds (an open publish of the key) are put back without
// counting as a failure and tried again after busyRetry, so that they delay
// only their own key. At quit it writes what is left (see finalRuns).
func (r *Relay) runSettleLoop(ctx context.Context, quit <-chan struct{}) {
	o := r.ord
	defer close(o.stopped)
	failures, busy := 0, 0
	for {
		select {
		case <-o.added:
		case <-quit:
			r.finalRuns(ctx)
			return
		}
		wait := settleLinger
		switch {
		case failures > 0:
			wait = settleRetry.Delay(failures)
		case busy > 0:
			wait = busyRetry.Delay(busy)
		case !o.moreComing(r.inflightCount()):
			wait = 0
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-quit:
				t.Stop()
				r.finalRuns(ctx)
				return
			}
		}
		batch := o.take(maxSettleBatch, false)
		if len(batch) > 0 {
			held, err := r.settleRuns(ctx, batch)
			switch {
			case err != nil:
				failures++
				r.putBackRuns(batch)
			case len(held) > 0:
				failures = 0
				busy++
				r.putBackRuns(held)
			default:
				failures, busy = 0, 0
			}
		}
		o.mu.Lock()
		more := len(o.runs) > 0
		o.mu.Unlock()
		if more {
			notify(o.added)
		}
	}
}

// busyRetry spaces the writes of runs whose keys are held by open
// transactions.
var busyRetry = backoff.Policy{Base: 10 * time.Millisecond, Cap: 100 * time.Millisecond, Jitter: 0.5}

// finalRunsWithin bounds the last writes of run outcomes at shutdown while
// their keys are held by open transactions: Run returns within about
// ShutdownGrace and this, whatever a publisher holds.
const finalRunsWithin = 500 * time.Millisecond

// finalRuns writes the run outcomes left at shutdown and refuses later
// ones. A write that fails is tried again up to finalAttempts failures in
// all (successful writes of other batches do not count); runs whose keys
// stay held by open transactions are tried again until finalRunsWithin has
// passed. What is left then is dropped, with a log line: those heads are
// delivered again once their leases lapse.
func (r *Relay) finalRuns(ctx context.Context) {
	o := r.ord
	deadline := time.Now().Add(finalRunsWithin)
	failures, busy := 0, 0
	for {
		batch := o.take(maxSettleBatch, true)
		if len(batch) == 0 {
			return
		}
		held, err := r.settleRuns(ctx, batch)
		switch {
		case err != nil:
			failures++
			if failures >= finalAttempts {
				r.droppedRuns("the last write at shutdown failed", append(batch, o.take(math.MaxInt, true)...))
				return
			}
			o.putFront(batch)
			time.Sleep(settleRetry.Delay(failures))
		case len(held) > 0:
			busy++
			if time.Now().After(deadline) {
				r.droppedRuns("their keys were held by open transactions at shutdown", append(held, o.take(math.MaxInt, true)...))
				return
			}
			o.putFront(held)
			time.Sleep(min(busyRetry.Delay(busy), time.Until(deadline)))
		}
	}
}

// putFront queues runs again ahead of those waiting.
func (o *orderedRelay) putFront(runs []queuedRun) {
	o.mu.Lock()
	o.runs = append(runs, o.runs...)
	o.mu.Unlock()
}

// putBackRuns queues run outcomes whose write failed or whose keys were
// held, unless their lease has lapsed.
func (r *Relay) putBackRuns(batch []queuedRun) {
	now := time.Now()
	var keep, lapsed []queuedRun
	for _, q := range batch {
		if now.Before(q.expires) {
			keep = append(keep, q)
		} else {
			lapsed = append(lapsed, q)
		}
	}
	if len(lapsed) > 0 {
		r.droppedRuns("their lease lapsed before their write could be made", lapsed)
	}
	if len(keep) > 0 {
		r.ord.putFront(keep)
	}
}

// settleRuns writes batch with one SettleRuns and returns the runs whose
// keys were held by other transactions, not written.
func (r *Relay) settleRuns(ctx context.Context, batch []queuedRun) (held []queuedRun, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	runs := make([]outboxdriver.RunOutcome, len(batch))
	for i := range batch {
		runs[i] = batch[i].RunOutcome
	}
	var start time.Time
	if r.cfg.Observer != nil {
		start = time.Now()
	}
	applied, busy, err := r.ord.od.SettleRuns(ctx, r.db, r.ob.table, r.settleP, runs)
	if err != nil {
		err = wrapOp(ctx, "settle", r.d.Classify(err))
	} else if len(applied) > 0 {
		// The settle made the next message of these keys their head
		// (nothing notifies of it): claim again now rather than at the
		// next poll, or a hot key would move one run per poll interval.
		r.signal()
	}
	for _, i := range busy {
		held = append(held, batch[i])
	}
	n, ok, s, fences := r.runOutcomes(batch, busy, applied)
	r.report(ctx, n, ok, s, fences, false, start, err)
	return held, err
}

// checkOrdered is the relay's start-up check of what ordering needs.
func (r *Relay) checkOrdered(ctx context.Context) error {
	if r.ord == nil {
		return nil
	}
	return r.ord.od.CheckOrdered(ctx, r.db, r.ob.table)
}

// OrdersByKey reports whether o was built with Config.OrderByKey.
func (o *Outbox) OrdersByKey() bool { return o.cfg.OrderByKey }

// orderedDialect returns the ordered dialect of an Outbox with OrderByKey,
// nil for one without.
func (o *Outbox) orderedDialect() outboxdriver.OrderedDialect {
	if !o.cfg.OrderByKey {
		return nil
	}
	od, _ := o.d.(outboxdriver.OrderedDialect) // New checked it
	return od
}

// needsSequence reports whether Publish numbers the ordered rows of
// rows in statements of their own after the INSERT ([Outbox.sequence]):
// when an ordered row has a DedupKey, or with a dialect that is an
// [outboxdriver.Sequencer], when there is an ordered row.
func needsSequence(od outboxdriver.OrderedDialect, rows []outboxdriver.Row) bool {
	_, steps := od.(outboxdriver.Sequencer)
	for i := range rows {
		if rows[i].Ordered && (steps || rows[i].DedupKey != "") {
			return true
		}
	}
	return false
}

// sequenceStatements returns the statements that number the ordered
// rows ids (in publish order) that an INSERT stored blocked: a
// Sequencer's, or SequenceSQL's one (none when the INSERT numbered them,
// as SQLite's trigger does).
func (o *Outbox) sequenceStatements(od outboxdriver.OrderedDialect, ids []ID) []outboxdriver.Statement {
	if seq, ok := od.(outboxdriver.Sequencer); ok {
		return seq.SequenceStatements(o.table, ids)
	}
	q, args := od.SequenceSQL(o.table, ids)
	if q == "" {
		return nil
	}
	return []outboxdriver.Statement{{Query: q, Args: args}}
}

// sequence runs the statements that number the ordered messages a publish
// stored without a key_seq (see [outboxdriver.OrderedDialect] and
// [outboxdriver.Sequencer]), when it must ([needsSequence]). stored holds
// the ids the INSERT stored when the batch has a DedupKey (dedup); else
// every row was stored.
func (o *Outbox) sequence(ctx context.Context, tx Tx, rows []outboxdriver.Row, stored []string, dedup bool) error {
	od := o.orderedDialect()
	if od == nil || !needsSequence(od, rows) {
		return nil
	}
	// The stored ordered rows' ids in publish order, whatever order the
	// database returned them in: the statements number a key's messages
	// in the order of the list. All stored (no duplicate): every ordered
	// row, as Publish's results assume.
	var got map[ID]bool
	if dedup && len(stored) != len(rows) {
		got = make(map[ID]bool, len(stored))
		for _, s := range stored {
			id, err := ParseID(s)
			if err != nil {
				return err
			}
			got[id] = true
		}
	}
	ids := make([]ID, 0, len(rows))
	for i := range rows {
		if rows[i].Ordered && (got == nil || got[rows[i].ID]) {
			ids = append(ids, rows[i].ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	for _, st := range o.sequenceStatements(od, ids) {
		if _, err := o.query(ctx, tx, st.Query, st.Args, 0, false); err != nil {
			return err
		}
	}
	return nil
}

// SkipHead skips the head of key when it is dead and halts the key: the
// message stays dead and the key's next message becomes its head. It
// returns the skipped message's id, or ok false when the key's head is not
// dead. It needs Config.OrderByKey.
func (o *Outbox) SkipHead(ctx context.Context, db DB, key string) (id ID, ok bool, err error) {
	od := o.orderedDialect()
	if od == nil {
		return ID{}, false, fmt.Errorf("%w: SkipHead needs Config.OrderByKey", ErrUnsupported)
	}
	if err := checkText(0, "Key", key, MaxKeyBytes, true); err != nil {
		return ID{}, false, err
	}
	id, ok, err = od.SkipHead(ctx, db, o.table, key, ID{})
	if err != nil {
		return ID{}, false, wrapOp(ctx, "skip head", o.d.Classify(err))
	}
	return id, ok, nil
}

// skipHeads is [Outbox.Act] with [ActSkip]: it pages through the dead
// messages matching f (in id order) and skips each one that is its key's
// halted head, one short transaction per key, fenced by the message's id
// (a key whose head changed meanwhile is left as it is). Interrupted, it
// returns the messages skipped so far.
func (o *Outbox) skipHeads(ctx context.Context, db DB, f Filter) (int64, error) {
	od := o.orderedDialect()
	if od == nil {
		if _, ok := o.d.(outboxdriver.OrderedDialect); !ok {
			return 0, fmt.Errorf("%w: the %s dialect cannot order messages by key, so no key is halted and there is nothing to skip", ErrUnsupported, o.d.Name())
		}
		return 0, fmt.Errorf("%w: skip needs an Outbox with Config.OrderByKey", ErrUnsupported)
	}
	if len(f.States) > 0 && !slices.Contains(f.States, StateDead) {
		return 0, nil // only dead messages halt keys
	}
	f.States = []State{StateDead}
	var n int64
	for {
		p, err := o.List(ctx, db, f, MaxPageSize)
		if err != nil {
			return n, err
		}
		for _, m := range p.Messages {
			if m.Key == "" || !m.SettledAt.IsZero() {
				continue // unordered, or dead without halting its key (see SettleRunsSQL)
			}
			key := m.Key
			if m.Subscriber != "" {
				key = outboxdriver.SubscriberKey(m.Subscriber, m.Key) // as stored
			}
			_, ok, err := od.SkipHead(ctx, db, o.table, key, m.ID)
			if err != nil {
				return n, wrapOp(ctx, "skip", o.d.Classify(err))
			}
			if ok {
				n++
			}
		}
		if p.Next.IsZero() {
			return n, nil
		}
		f.After = p.Next
	}
}
