package outbox

import (
	"context"
	"sync"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"

	"github.com/oncommit/oncommit/internal/backoff"
)

// settleLinger is how long the settler waits for more outcomes after the
// first, when fewer than a batch are waiting: fewer, larger statements under
// load, at the cost of writing an outcome up to this much later.
const settleLinger = 2 * time.Millisecond

// doneLinger is how long successes wait for a claim to carry them before
// the settler writes them with a statement of their own.
const doneLinger = 50 * time.Millisecond

// maxSettleBatch bounds the outcomes one settle statement (or one claim
// carrying successes) writes.
const maxSettleBatch = 1000

// settleRetry is the backoff between attempts to write outcomes after a
// failed settle statement.
var settleRetry = backoff.Policy{Base: 100 * time.Millisecond, Cap: 5 * time.Second, Jitter: 0.5}

// finalAttempts bounds the attempts of the last write at shutdown, so Run
// returns in bounded time when the database is down; what is left is
// logged as dropped (and delivered again after its lease).
const finalAttempts = 3

// outcomes are the handlers' outcomes waiting to be written. Handlers add
// them; claims take the successes into their own statement; the settler
// writes the rest. Once the settler has taken the last of them at
// shutdown (closed), add refuses an outcome, and the caller logs it as
// dropped: no outcome is ever lost without a trace.
type outcomes struct {
	mu     sync.Mutex
	done   []queued // successes
	failed []queued // retries and dead letters
	closed bool
	// flushArmed: the settler's timer for successes is armed, and it will
	// look at the done list when it fires; add then leaves doneAdded
	// alone (a wake-up of the settler per claim, for nothing).
	flushArmed bool
	// doneAdded and failedAdded are signalled when their list becomes
	// non-empty; stopped is closed when the settler has returned.
	doneAdded   chan struct{}
	failedAdded chan struct{}
	stopped     chan struct{}
}

// queued is an outcome waiting to be written.
type queued struct {
	outboxdriver.Settlement
	// expires is when the relay stops trying to write it after failed
	// writes (its claim's lease will have lapsed by then).
	expires time.Time
}

// settlements returns the settlements of qs, for the dialect.
func settlements(qs []queued) []outboxdriver.Settlement {
	s := make([]outboxdriver.Settlement, len(qs))
	for i := range qs {
		s[i] = qs[i].Settlement
	}
	return s
}

func (o *outcomes) init() {
	o.doneAdded = make(chan struct{}, 1)
	o.failedAdded = make(chan struct{}, 1)
	o.stopped = make(chan struct{})
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// add appends outcomes to their lists; false (and nothing added) once the
// settler has taken its last batch.
func (o *outcomes) add(batch ...queued) bool {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return false
	}
	hadDone, hadFailed := len(o.done) > 0, len(o.failed) > 0
	for _, s := range batch {
		if s.Kind == outboxdriver.SettleDone {
			o.done = append(o.done, s)
		} else {
			o.failed = append(o.failed, s)
		}
	}
	newDone, newFailed := !hadDone && len(o.done) > 0 && !o.flushArmed, !hadFailed && len(o.failed) > 0
	o.mu.Unlock()
	if newDone {
		notify(o.doneAdded)
	}
	if newFailed {
		notify(o.failedAdded)
	}
	return true
}

// take removes and returns up to n outcomes of the list.
func (o *outcomes) take(list *[]queued, n int) []queued {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := min(len(*list), n)
	if k == 0 {
		return nil
	}
	out := append([]queued(nil), (*list)[:k]...)
	*list = append((*list)[:0], (*list)[k:]...)
	return out
}

func (o *outcomes) takeDone(n int) []queued { return o.take(&o.done, n) }

// setFlushArmed records whether the settler's timer for successes is
// armed (see flushArmed).
func (o *outcomes) setFlushArmed(armed bool) {
	o.mu.Lock()
	o.flushArmed = armed
	o.mu.Unlock()
}

// takeDoneInto is takeDone appending to buf.
func (o *outcomes) takeDoneInto(buf []queued, n int) []queued {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := min(len(o.done), n)
	buf = append(buf, o.done[:k]...)
	o.done = append(o.done[:0], o.done[k:]...)
	return buf
}
func (o *outcomes) takeFailed(n int) []queued { return o.take(&o.failed, n) }

// counts returns the lengths of the lists.
func (o *outcomes) counts() (done, failed int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.done), len(o.failed)
}

// closeAll marks the lists closed and returns all they held.
func (o *outcomes) closeAll() []queued {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	all := append(o.failed, o.done...)
	o.done, o.failed = nil, nil
	return all
}

// send queues a handler's outcome. After the settler's last write (a
// handler that outlived the shutdown) it is logged as dropped: the
// message's lease lapses and it is delivered again.
func (r *Relay) send(s queued) {
	if !r.out.add(s) {
		r.dropped("the relay has stopped", []queued{s})
	}
}

// putBack queues outcomes whose write failed, to be written again (they are
// fenced, so a late write is harmless), unless the lease of their claim
// has lapsed: those are dropped, as another relay may deliver them again.
func (r *Relay) putBack(batch []queued) {
	now := time.Now()
	keep, lapsed := batch[:0:0], []queued(nil)
	for _, s := range batch {
		if s.expires.IsZero() || now.Before(s.expires) {
			keep = append(keep, s)
		} else {
			lapsed = append(lapsed, s)
		}
	}
	if len(lapsed) > 0 {
		r.dropped("their lease lapsed while their write kept failing", lapsed)
	}
	if len(keep) > 0 && !r.out.add(keep...) {
		r.dropped("the relay has stopped", keep)
	}
}

// dropped logs outcomes that will never be written.
func (r *Relay) dropped(why string, batch []queued) {
	ids := make([]string, 0, min(len(batch), 10))
	for _, s := range batch[:min(len(batch), 10)] {
		ids = append(ids, s.ID.String())
	}
	r.log.Warn("outbox: outcomes dropped; their messages will be delivered again after their lease", "why", why, "count", len(batch), "message_ids", ids)
}

// settleLoop writes outcomes. Retries and dead letters are written in
// batches: once one is waiting, it gathers those that arrive within
// settleLinger (up to a claim batch, then all that are waiting, up to
// maxSettleBatch) and writes them with one statement per kind. Successes
// wait for the next claim to carry them (one commit for both) while claims
// come often; otherwise (see doneWait) the settler writes them within
// milliseconds. When a write fails, its
// outcomes go back to the lists and the settler writes nothing until a
// backoff has passed (see putBack). At stop it writes what is left, with
// up to finalAttempts attempts, and refuses later outcomes.
func (r *Relay) settleLoop(ctx context.Context, stop <-chan struct{}) {
	defer close(r.out.stopped)
	flush := time.NewTimer(time.Hour)
	flush.Stop()
	flushArmed := false
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	failures := 0 // writes failed in a row; while > 0, wait for retry
	write := func(batch []queued) {
		if len(batch) == 0 {
			// Nothing left to retry (a claim carried the successes, or
			// their leases lapsed): the backoff is over, or the settler
			// would wait for a retry timer nothing arms again.
			failures = 0
			return
		}
		if err := r.settle(ctx, settlements(batch)); err != nil {
			r.putBack(batch)
			failures++
			retry.Reset(settleRetry.Delay(failures))
			return
		}
		failures = 0
	}
	for {
		select {
		case <-r.out.failedAdded:
			if failures > 0 {
				continue // the retry timer writes them
			}
			if _, n := r.out.counts(); n < r.cfg.BatchSize {
				linger := time.NewTimer(settleLinger)
				select {
				case <-linger.C:
				case <-stop:
					linger.Stop()
				}
			}
			write(r.out.takeFailed(maxSettleBatch))
			if _, n := r.out.counts(); n > 0 {
				notify(r.out.failedAdded) // more than one batch was waiting
			}
		case <-r.out.doneAdded:
			if !flushArmed {
				flush.Reset(r.doneWait())
				flushArmed = true
				r.out.setFlushArmed(true)
			}
		case <-flush.C:
			flushArmed = false
			if failures > 0 || r.claimsCarry() {
				// Backing off, or claims are carrying successes: leave
				// these to them (or to the retry) rather than compete
				// for the database.
				flush.Reset(doneLinger)
				flushArmed = true
				continue
			}
			// Successes added from here on notify doneAdded again.
			r.out.setFlushArmed(false)
			write(r.out.takeDone(maxSettleBatch))
			if n, _ := r.out.counts(); n > 0 { // over a batch waited, or some came meanwhile
				flush.Reset(r.doneWait())
				flushArmed = true
				r.out.setFlushArmed(true)
			}
		case <-retry.C:
			write(append(r.out.takeFailed(maxSettleBatch), r.out.takeDone(maxSettleBatch)...))
			if failures == 0 {
				notify(r.out.failedAdded)
				notify(r.out.doneAdded)
			}
		case <-stop:
			r.finalSettle(ctx)
			return
		}
	}
}

// doneWait is how long new successes wait before the settler writes them:
// doneLinger while claims are carrying successes (see claimsCarry), else
// only settleLinger. A relay that polls (SQLite, MySQL, lib/pq) claims
// rarely when it is not busy; successes held for a claim that is far off
// were delivered again after a relay crash (issue 19 item 12: about 1.1
// extra deliveries per SIGKILL on MariaDB and SQLite against 0.2-0.3 once
// they are written within milliseconds).
func (r *Relay) doneWait() time.Duration {
	if r.claimsCarry() {
		return doneLinger
	}
	return settleLinger
}

// claimsCarry reports whether claims are carrying successes (one did within
// doneLinger) or are about to (the claim loop is claiming back to back):
// the next claim will likely take the waiting successes in its own commit.
func (r *Relay) claimsCarry() bool {
	return r.backToBack.Load() || time.Since(time.Unix(0, r.carried.Load())) < doneLinger
}

// finalSettle writes the outcomes left at shutdown and closes the lists.
func (r *Relay) finalSettle(ctx context.Context) {
	batch := r.out.closeAll()
	for attempt := 1; len(batch) > 0; attempt++ {
		if r.settle(ctx, settlements(batch)) == nil {
			return
		}
		if attempt == finalAttempts {
			r.dropped("the last write at shutdown failed", batch)
			return
		}
		time.Sleep(settleRetry.Delay(attempt))
	}
}

// settle writes batch with one Settle call (a statement per kind).
func (r *Relay) settle(ctx context.Context, batch []outboxdriver.Settlement) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	var start time.Time
	if r.cfg.Observer != nil {
		start = time.Now()
	}
	applied, err := r.d.Settle(ctx, r.db, r.ob.table, r.settleP, batch)
	if err != nil {
		err = wrapOp(ctx, "settle", r.d.Classify(err))
	}
	r.report(ctx, len(batch), len(applied), batch, applied, false, start, err)
	return err
}

// report logs, traces and observes a write of n outcomes, one per message
// (by a claim when carried, else by a statement that began at start), of
// which applied held their fences. Every write of outcomes reports here,
// an ordered run's as one outcome per message of it (see runOutcomes):
// the tracer gets s, the settlements written, and fences, those whose
// fence held (both nil when there is no tracer to tell).
func (r *Relay) report(ctx context.Context, n, applied int, s []outboxdriver.Settlement, fences []outboxdriver.Fence, carried bool, start time.Time, err error) {
	if err != nil {
		r.log.Error("outbox: settle failed; writing the outcomes again after a backoff", "err", err, "count", n)
	} else if applied < n {
		r.log.Warn("outbox: settles fenced off: another claim took these messages after their lease lapsed", "count", n-applied)
	}
	if r.cfg.Tracer != nil {
		r.cfg.Tracer.TraceSettle(ctx, s, fences, err)
	}
	if r.cfg.Observer != nil {
		r.observeSettle(ctx, n, applied, carried, start, err)
	}
}

// runOutcomes is what report tells of a write of the runs of batch (those
// at the indexes busy were not written): n, the outcomes written, one per
// message handled (its run's Done and Failed); applied, those of the runs
// whose head's fence held (applied holds the head fences). With a tracer,
// s are their settlements, each with its message's own fence (a run
// member's attempts after this delivery), and fences those that held.
func (r *Relay) runOutcomes(batch []queuedRun, busy []int, applied []outboxdriver.Fence) (n, ok int, s []outboxdriver.Settlement, fences []outboxdriver.Fence) {
	var held []bool
	if len(busy) > 0 {
		held = make([]bool, len(batch))
		for _, i := range busy {
			held[i] = true
		}
	}
	all := len(applied) == len(batch)-len(busy) // every run written held: no lookup
	var heads map[outboxdriver.Fence]bool
	if !all {
		heads = make(map[outboxdriver.Fence]bool, len(applied))
		for _, f := range applied {
			heads[f] = true
		}
	}
	for i := range batch {
		if held != nil && held[i] {
			continue
		}
		q := &batch[i]
		k := len(q.Done)
		if q.Failed.Kind != 0 {
			k++
		}
		in := all || heads[q.Head]
		n += k
		if in {
			ok += k
		}
		if r.cfg.Tracer == nil {
			continue
		}
		s = append(s, q.settled...)
		if in {
			for j := range q.settled {
				fences = append(fences, q.settled[j].Fence)
			}
		}
	}
	return n, ok, s, fences
}
