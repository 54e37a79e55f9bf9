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
// Claims run on their own goroutine, and while claims keep filling their
// limit the loop keeps up to maxInFlight of them in flight at once (see
// claimsInFlight), while overlapping pays (see overlapGauge): a draining
// relay then does not wait, between claims, for each claim's round trip
// and commit while its database has a core to spare. The slots of the claims in flight count as taken, so the handlers
// running and the rows claimed never exceed RelayConfig.Concurrency.
//
// While claims fail, it waits out the backoff whatever wakes it
// (notification, reconnect, freed slot): a sick database gets a few claims
// a second at most, not one per wake-up. Until the table has been checked
// (see check), a failed claim checks it again, and a missing table ends
// the loop with that error. When ctx ends it starts no claim, and returns
// once the claims in flight have returned and their messages have been
// dispatched.
func (r *Relay) claimLoop(ctx, handlersCtx context.Context, workers *sync.WaitGroup, checked bool) error {
	sl := &slots{freed: make(chan struct{}, 1)}
	reserved := 0 // the slots of the claims in flight (their limits)
	free := func() int { return r.cfg.Concurrency - int(sl.running.Load()) - reserved }
	// After a full claim, claim again once this many slots are free: a whole
	// batch when the slots hold two batches (one runs while the next is
	// claimed), else half of what fits.
	threshold := max(1, min(r.cfg.BatchSize, r.cfg.Concurrency)/2)
	if r.cfg.Concurrency >= 2*r.cfg.BatchSize {
		threshold = r.cfg.BatchSize
	}
	// The handler whose end frees the threshold-th slot (counting the
	// claims in flight as taken) signals freed: the loop waits on freed
	// only for that.
	setSignal := func() { sl.signalAt.Store(int64(r.cfg.Concurrency - threshold - reserved)) }
	setSignal()
	maxInFlight := r.claimsInFlight()
	results := make(chan claimResult, maxInFlight)
	bufs := make([]*claimBuf, maxInFlight)
	for i := range bufs {
		bufs[i] = &claimBuf{}
	}
	inFlight := 0
	var flying []*claimBuf // the claims in flight
	var gauge overlapGauge
	startClaim := func(limit int) {
		b := bufs[len(bufs)-1]
		bufs = bufs[:len(bufs)-1]
		b.started, b.overlapped = time.Now(), len(flying) > 0
		for _, o := range flying {
			o.overlapped = true
		}
		flying = append(flying, b)
		inFlight++
		reserved += limit
		setSignal()
		go func() {
			claimed, err := r.claimFinishing(ctx, limit, b)
			results <- claimResult{claimed: claimed, err: err, limit: limit, buf: b}
		}()
	}
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
	kick := false           // a poll or wake-up asks for a claim
	var trail time.Duration // the follow-up step in force, 0 for none
	var woke time.Time      // with trail: when the relay was woken, or a follow-up last found messages
	for {
		stopping := ctx.Err() != nil
		if stopping && inFlight == 0 {
			return nil
		}
		// Back to back: the last claim filled its limit and enough slots
		// are free (the claims in flight counted as taken).
		eager := full && free() >= threshold
		r.backToBack.Store(full && (eager || inFlight > 0))
		// A poll or wake-up claims when no claim is in flight (one that
		// comes meanwhile claims after it); back to back, claims overlap
		// up to maxInFlight while overlapping pays.
		if !stopping && ((kick && inFlight == 0) || (eager && (inFlight == 0 || inFlight < maxInFlight && gauge.pays()))) {
			kick = false
			if failures > 0 && time.Now().Before(retryAt) {
				// Backing off: the poll timer fires at retryAt.
			} else if nfree := free(); nfree > 0 {
				startClaim(min(nfree, r.cfg.BatchSize))
				continue
			} // else all slots busy: wait for the next poll or wake-up
		}
		done := ctx.Done()
		if stopping {
			done = nil // only the claims in flight are waited for
		}
		var res claimResult
		select {
		case <-done:
			continue
		case <-poll.C:
			resetTimer(poll, r.cfg.PollInterval)
			kick = true
			continue
		case <-r.wake:
			kick = true
			continue
		case <-sl.freed:
			continue
		case res = <-results:
		}
		inFlight--
		reserved -= res.limit
		setSignal()
		bufs = append(bufs, res.buf)
		flying = slices.DeleteFunc(flying, func(b *claimBuf) bool { return b == res.buf })
		claimed, err := res.claimed, res.err
		if err != nil {
			full = false
			if ctx.Err() != nil {
				continue
			}
			r.health.claimed(err)
			if !checked {
				var cerr error
				if checked, cerr = r.check(ctx); cerr != nil {
					return cerr // the claims in flight return into results' buffer
				}
			}
			failures++
			wait := claimRetry(r.cfg.PollInterval).Delay(failures)
			r.log.Error("outbox: claim failed", "err", err, "retry_in", wait, "failures", failures)
			retryAt = time.Now().Add(wait)
			resetTimer(poll, wait)
			continue
		}
		r.health.claimed(nil)
		checked = true
		failures = 0
		for i := range claimed {
			if c := &claimed[i]; c.Dead {
				r.log.Warn("outbox: message dead-lettered at claim: max attempts reached", "message_id", c.ID, "topic", c.Topic, "attempt", c.Attempts-c.AttemptsBase, "outcome", OutcomeDead.String())
				if r.cfg.DiscardDead {
					r.send(queued{outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}, Kind: outboxdriver.SettleDead, Error: "max attempts reached"}, time.Now().Add(r.cfg.Lease)})
				}
			}
		}
		if dispatch = r.register(handlersCtx, claimed, dispatch[:0]); len(dispatch) > 0 {
			sl.running.Add(int64(len(dispatch)))
			workers.Add(len(dispatch))
			if len(r.batches) > 0 {
				r.inflightMu.Lock()
				dispatch = r.group(dispatch) // a job per batch (batch.go)
				r.inflightMu.Unlock()
			}
			queue.push(dispatch)
			clear(dispatch)
			lastDispatch = time.Now()
		}
		full = len(claimed) == res.limit
		if full && res.limit == r.cfg.BatchSize && maxInFlight > 1 {
			gauge.record(time.Since(res.buf.started), res.buf.overlapped)
		}
		if len(claimed) == 0 && time.Since(lastDispatch) > workerIdle {
			queue.retire()
		}
		if !full && ctx.Err() == nil {
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
			resetTimer(poll, next)
		}
	}
}

// maxInFlight bounds the claims a relay keeps in flight at once while
// its claims keep filling their limit (see claimLoop): two, so that one
// claim's round trip and commit overlap the next's, as two relays' do.
const maxInFlight = 2

// claimsInFlight is how many claims the claim loop may have in flight at
// once: maxInFlight when the dialect's claims may overlap
// (Capabilities.OverlappingClaims) and the handler slots hold two batches
// (Concurrency >= 2*BatchSize); one for ordered delivery, whose claims
// follow each other (ordered.go).
func (r *Relay) claimsInFlight() int {
	if r.ord != nil || !r.ob.caps.OverlappingClaims || r.cfg.Concurrency < 2*r.cfg.BatchSize {
		return 1
	}
	return maxInFlight
}

// overlapGauge tells whether a relay's claims gain from overlapping: they
// do while the database has a core to spare, and do not when it is busy
// (a loaded host, or several relays already claiming at once: then two
// claims in flight each take about twice as long, and claims that skip
// more locked rows take longer still). It keeps moving averages of the
// durations of full claims made alone and overlapped, and lets claims
// overlap while an overlapped claim takes less than overlapGain times one
// made alone (two in flight then deliver more than one). Every probeEvery
// full claims, the next probeClaims claims go the other way, from a fresh
// average, so that both follow the database's load.
type overlapGauge struct {
	solo, over time.Duration // 0 until the first sample
	claims     int           // full claims since the last probe
	probing    int           // claims of the probe left
	probeOver  bool          // the probe's claims overlap
}

const (
	overlapGain = 1.4
	probeEvery  = 64
	probeClaims = 8
)

// record adds the duration of a full claim, made overlapped or alone.
func (g *overlapGauge) record(d time.Duration, overlapped bool) {
	avg := &g.solo
	if overlapped {
		avg = &g.over
	}
	if *avg == 0 {
		*avg = d
	} else {
		*avg += (d - *avg) / 8
	}
	if g.probing > 0 {
		g.probing--
		return
	}
	if g.claims++; g.claims >= probeEvery {
		g.claims, g.probing = 0, probeClaims
		if g.probeOver = !g.gains(); g.probeOver {
			g.over = 0
		} else {
			g.solo = 0
		}
	}
}

// gains reports whether the averages say overlapping pays (or cannot tell
// yet).
func (g *overlapGauge) gains() bool {
	return g.solo == 0 || g.over == 0 || float64(g.over) < overlapGain*float64(g.solo)
}

// pays reports whether the next claim should overlap the one in flight.
func (g *overlapGauge) pays() bool {
	if g.probing > 0 {
		return g.probeOver
	}
	return g.gains()
}

// claimResult is what a claim running on its own goroutine hands back to
// the claim loop.
type claimResult struct {
	claimed []outboxdriver.Claimed
	err     error
	limit   int
	buf     *claimBuf
}

// claimBuf holds one claim's buffers for the successes it carries, reused
// from claim to claim (the dialect does not keep ClaimParams.Done): one
// per claim in flight.
type claimBuf struct {
	done   []queued
	fences []outboxdriver.Fence
	// started is when the claim started; overlapped is set when another
	// claim was in flight at some time during it (see overlapGauge).
	started    time.Time
	overlapped bool
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
func (r *Relay) claimFinishing(ctx context.Context, limit int, b *claimBuf) ([]outboxdriver.Claimed, error) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(min(r.cfg.ShutdownGrace, time.Second), cancel) })
	defer stop()
	return r.claim(cctx, limit, b)
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

// claim claims up to limit messages, carrying the successes waiting (up
// to maxSettleBatch) in b's buffers.
func (r *Relay) claim(ctx context.Context, limit int, b *claimBuf) ([]outboxdriver.Claimed, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	done := r.out.takeDoneInto(b.done[:0], maxSettleBatch)
	b.done = done
	if len(done) > 0 {
		r.carried.Store(time.Now().UnixNano())
	}
	fences := b.fences[:0]
	for i := range done {
		fences = append(fences, done[i].Fence)
	}
	b.fences = fences
	var start time.Time
	if r.cfg.Observer != nil {
		start = time.Now()
	}
	p := outboxdriver.ClaimParams{
		Topics: r.topics, AllTopics: r.all, Limit: limit, Lease: r.cfg.Lease, MaxAttempts: r.cfg.MaxAttempts,
		Done: fences, KeepDelivered: r.settleP.KeepDelivered,
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
			// applied may be b.fences itself (see Claim's doc): the tracer
			// gets copies, the buffers are reused by a later claim.
			batch, applied = settlements(done), slices.Clone(applied)
		}
		r.report(ctx, len(done), batch, applied, true, start, nil)
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
