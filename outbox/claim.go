package outbox

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"

	"github.com/oncommit/oncommit/internal/backoff"
)

// claimLoop claims and dispatches until ctx ends.
//
// It claims when the poll timer fires, when a notification arrives, and
// right after a claim that filled its limit (more may be due). A claim
// takes at most the free handler slots; after a full claim it waits until
// enough slots are free (see threshold), so a busy relay claims in batches
// rather than one row per finished handler.
//
// While claims fail, it waits out the backoff whatever wakes it
// (notification, reconnect, freed slot): a sick database gets a few claims
// a second at most, not one per wake-up. Until the table has been checked
// (see check), a failed claim checks it again, and a missing table ends
// the loop with that error.
func (r *Relay) claimLoop(ctx, handlersCtx context.Context, workers *sync.WaitGroup, checked bool) error {
	sl := &slots{freed: make(chan struct{}, 1)}
	free := func() int { return r.cfg.Concurrency - int(sl.running.Load()) }
	// After a full claim, claim again once this many slots are free: a whole
	// batch when the slots hold two batches (one runs while the next is
	// claimed), else half of what fits.
	threshold := max(1, min(r.cfg.BatchSize, r.cfg.Concurrency)/2)
	if r.cfg.Concurrency >= 2*r.cfg.BatchSize {
		threshold = r.cfg.BatchSize
	}
	// The handler whose end frees the threshold-th slot signals freed:
	// the loop waits on freed only for that.
	sl.signalAt = int64(r.cfg.Concurrency - threshold)
	// Handler goroutines take claimed messages from queue.
	var queue *handlerQueue
	queue = newHandlerQueue(func() { go r.work(queue, workers, sl) })
	defer queue.close()
	var dispatch []*job
	lastDispatch := time.Now()
	poll := time.NewTimer(0)
	defer poll.Stop()
	failures := 0
	var retryAt time.Time   // while claims fail: no claim before this
	full := false           // the last claim filled its limit: more may be due
	var trail time.Duration // the follow-up step in force, 0 for none
	var woke time.Time      // with trail: when the relay was woken, or a follow-up last found messages
	for {
		wait := !full || free() < threshold
		r.backToBack.Store(!wait)
		if wait {
			select {
			case <-ctx.Done():
				return nil
			case <-poll.C:
				resetTimer(poll, r.cfg.PollInterval)
			case <-r.wake:
			case <-sl.freed:
				if !full || free() < threshold {
					continue
				}
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if failures > 0 && time.Now().Before(retryAt) {
			continue // backing off: the poll timer fires at retryAt
		}
		nfree := free()
		if nfree == 0 {
			continue // all slots busy: wait for the next poll or wake-up
		}
		limit := min(nfree, r.cfg.BatchSize)
		sent := time.Now()
		r.win.next(sent)
		claimed, err := r.claimFinishing(ctx, limit)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.health.claimed(err)
			if !checked {
				var cerr error
				if checked, cerr = r.check(ctx); cerr != nil {
					return cerr
				}
			}
			failures++
			wait := claimRetry(r.cfg.PollInterval).Delay(failures)
			r.log.Error("outbox: claim failed", "err", err, "retry_in", wait, "failures", failures)
			full = false
			retryAt = time.Now().Add(wait)
			resetTimer(poll, wait)
			continue
		}
		r.health.claimed(nil)
		r.win.claimed(sent, len(claimed), limit)
		checked = true
		failures = 0
		for i := range claimed {
			if c := &claimed[i]; c.Dead {
				r.log.Warn("outbox: message dead-lettered at claim: max attempts reached", logWho(c, "attempt", c.Attempts-c.AttemptsBase, "outcome", OutcomeDead.String())...)
				if r.cfg.DiscardDead {
					r.send(queued{outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}, Kind: outboxdriver.SettleDead, Error: "max attempts reached"}, time.Now().Add(r.cfg.Lease)})
				}
			}
		}
		if dispatch = r.register(handlersCtx, claimed, dispatch[:0]); len(dispatch) > 0 {
			sl.running.Add(int64(len(dispatch)))
			workers.Add(len(dispatch))
			if r.anyBatch() {
				r.inflightMu.Lock()
				dispatch = r.group(dispatch) // a job per batch (batch.go)
				r.inflightMu.Unlock()
			}
			queue.push(dispatch)
			clear(dispatch)
			lastDispatch = time.Now()
		}
		full = len(claimed) == limit
		if len(claimed) == 0 && time.Since(lastDispatch) > workerIdle {
			queue.retire()
		}
		if !full {
			// A coalescing publisher's notification asks for follow-up
			// claims: publishes it made silent commit later, some as
			// late as their transactions last. Follow up at short
			// intervals that grow with the time since the wake-up (or
			// since a follow-up last found messages), back to the poll
			// interval (see nextFollowUp).
			now := time.Now()
			if d := time.Duration(r.followUp.Swap(0)); d > 0 {
				trail, woke = d, now
			} else if trail > 0 && len(claimed) > 0 {
				woke = now
			}
			next := r.cfg.PollInterval
			switch {
			case trail > 0 && len(claimed) > 0:
				// Following up and finding messages: traffic is flowing
				// and more silent publishes are committing; claim again at
				// once, as a notification per publish would make it.
				next = 0
			case trail > 0:
				var hot bool
				if next, hot = nextFollowUp(trail, now.Sub(woke), r.cfg.PollInterval); !hot {
					trail = 0
				}
			}
			if trail > 0 && r.win.kick != nil {
				// A silent publish may be due before the claims' window.
				r.win.kickProbe()
			}
			resetTimer(poll, next)
		}
	}
}

// claimRetry is the backoff after failed claims: from 100 ms up to the poll
// interval or 10 s, whichever is longer.
func claimRetry(poll time.Duration) backoff.Policy {
	return backoff.Policy{Base: 100 * time.Millisecond, Cap: max(poll, 10*time.Second), Jitter: 0.5}
}

// claimFinishing claims like claim, but a claim in flight when ctx ends
// may still finish, for up to min(ShutdownGrace, 1s): cancelling it
// mid-statement makes the driver tear its connection down (pgx sends the
// server a cancel request), and the last settle at shutdown then waits for
// the cancelled statement's row locks. The rows it claims are handled
// within the grace period like those of earlier claims.
func (r *Relay) claimFinishing(ctx context.Context, limit int) ([]outboxdriver.Claimed, error) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(min(r.cfg.ShutdownGrace, time.Second), cancel) })
	defer stop()
	return r.claim(cctx, limit)
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	select {
	case <-t.C:
	default:
	}
	t.Reset(d)
}

// notified records a notification's follow-up request, if any, and wakes
// the claim loop.
func (r *Relay) notified(payload string) {
	if d := int64(min(followUp(payload), r.cfg.PollInterval)); d > 0 {
		for {
			cur := r.followUp.Load()
			if cur >= d || r.followUp.CompareAndSwap(cur, d) {
				break
			}
		}
	}
	r.signal()
}

// signal wakes the claim loop without blocking.
func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Relay) claim(ctx context.Context, limit int) ([]outboxdriver.Claimed, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	// Only the claim loop claims: the buffers are reused from claim to
	// claim (the dialect does not keep ClaimParams.Done).
	done := r.out.takeDoneInto(r.claimDone[:0], maxSettleBatch)
	r.claimDone = done
	if len(done) > 0 {
		r.carried.Store(time.Now().UnixNano())
	}
	fences := r.claimFences[:0]
	for i := range done {
		fences = append(fences, done[i].Fence)
	}
	r.claimFences = fences
	var start time.Time
	if r.cfg.Observer != nil {
		start = time.Now()
	}
	p := outboxdriver.ClaimParams{
		Topics: r.topics, AllTopics: r.all, Limit: limit, Lease: r.cfg.Lease, MaxAttempts: r.cfg.MaxAttempts,
		Done: fences, KeepDelivered: r.settleP.KeepDelivered, AsyncCommit: r.settleP.AsyncCommit, Recent: r.win.recent,
	}
	var claimed []outboxdriver.Claimed
	var applied []outboxdriver.Fence
	var err error
	if r.ord != nil { // heads with their runs (ordered.go)
		claimed, applied, err = r.ord.od.ClaimOrdered(ctx, r.db, r.ob.table, p, r.runBudget())
	} else {
		claimed, applied, err = r.d.Claim(ctx, r.db, r.ob.table, p)
	}
	if err != nil {
		err = wrapOp(ctx, "claim", r.d.Classify(err))
		if len(done) > 0 {
			r.putBack(done) // nothing of the statement was committed
		}
	} else if len(done) > 0 {
		var batch []outboxdriver.Settlement
		if r.cfg.Tracer != nil {
			// applied may be r.claimFences itself (see Claim's doc): the tracer
			// gets a copy, the buffer is reused by the next claim.
			batch, applied = settlements(done), slices.Clone(applied)
		}
		r.report(ctx, len(done), len(applied), batch, applied, true, start, nil)
	}
	clear(done) // no error strings kept until the next claim
	if r.cfg.Tracer != nil {
		r.cfg.Tracer.TraceClaim(ctx, claimed, err)
	}
	if r.cfg.Observer != nil {
		r.observeClaim(ctx, claimed, limit, start, err)
	}
	return claimed, err
}
