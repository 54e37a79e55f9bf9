package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"

	"github.com/oncommit/oncommit/internal/backoff"
)

// renewAttempts bounds the statements one renewal sends: a renewal that the
// database refused because of contention (a deadlock, a serialization
// failure, a lock it could not have in time: ErrRetryTx) changed nothing,
// and is sent again at once rather than at the next tick.
const renewAttempts = 3

// renewPause is the pause before a renewal is sent again.
var renewPause = backoff.Policy{Base: 10 * time.Millisecond, Cap: 100 * time.Millisecond, Jitter: 1}

// renewLoop extends, every sixth of the lease, the leases of the handlers
// claimed more than a third of the lease ago (each such handler is renewed
// at every tick, not once per third): a lease is renewed by the time half
// of it has passed, so a renewal that has to wait (a busy database, a
// SQLite write lock) still has half the lease to land.
func (r *Relay) renewLoop(ctx context.Context) {
	tick(ctx, r.cfg.Lease/6, func() {
		var held []outboxdriver.Fence
		var batches []*claimBatch
		now := time.Now()
		cutoff := now.Add(-r.cfg.Lease / 3)
		r.inflightMu.Lock()
		for b := range r.inflight {
			if !b.claimed.Before(cutoff) {
				continue
			}
			batches = append(batches, b)
			for i := range b.jobs {
				if j := &b.jobs[i]; !j.ended.Load() {
					held = append(held, outboxdriver.Fence{ID: j.c.ID, Attempts: j.c.Attempts})
				}
			}
		}
		r.inflightMu.Unlock()
		if len(held) == 0 {
			return
		}
		kept, err := r.renew(ctx, held)
		if err != nil {
			r.log.Error("outbox: lease renewal failed", "err", err, "count", len(held))
			return
		}
		for _, b := range batches {
			b.renewed.Store(int64(now.Sub(b.claimed)))
		}
		if len(kept) < len(held) {
			r.leasesLost(ctx, held, kept)
		}
	})
}

// renew renews the leases of held and returns the fences still held. It
// sends the renewal again, up to renewAttempts statements in all, when the
// database refused it because of contention before its command timeout.
func (r *Relay) renew(ctx context.Context, held []outboxdriver.Fence) ([]outboxdriver.Fence, error) {
	for attempt := 1; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
		kept, err := r.d.Renew(rctx, r.db, r.ob.table, r.cfg.Lease, held)
		if err != nil {
			err = wrapOp(rctx, "renew", r.d.Classify(err))
		}
		timedOut := rctx.Err() != nil
		cancel()
		if err == nil || timedOut || attempt == renewAttempts || !errors.Is(err, ErrRetryTx) {
			return kept, err
		}
		r.log.Debug("outbox: lease renewal refused because of contention; sending it again", "err", err, "count", len(held), "attempt", attempt)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(renewPause.Delay(attempt)):
		}
	}
}

// leasesLost handles the fences of held that a renewal found no longer
// held (kept has the others). A fence fails either because another claim
// took the message (the lease had lapsed), or an operator changed it, or
// because the message's own outcome was written between the moment the
// renewal listed it and its statement: its handler had returned. Only a
// handler still running has lost its lease: its context is cancelled, and
// the loss logged and observed. A handler that has returned has nothing to
// cancel; if another claim did take its message, its outcome is fenced off
// and logged as such when it is written.
//
// A handler is taken as running until its relay has marked it finished,
// just after queueing its outcome: one whose outcome got written while its
// goroutine was between the two is still reported.
func (r *Relay) leasesLost(ctx context.Context, held, kept []outboxdriver.Fence) {
	lost := make(map[outboxdriver.Fence]bool, len(held)-len(kept))
	for _, f := range held {
		lost[f] = true
	}
	for _, f := range kept {
		delete(lost, f)
	}
	for _, e := range r.cancelLost(lost) {
		r.log.Warn("outbox: lease lost while its handler ran: another claim took the message (or an operator changed it); cancelling the handler, whose outcome will be fenced off", "message_id", e.ID, "topic", e.Topic, "attempt", e.Attempt)
		if r.cfg.Observer != nil {
			r.cfg.Observer.LeaseLost(ctx, e)
		}
	}
}

// cancelLost cancels the contexts of the handlers of the claims in lost
// that are still running (with their batches' contexts), and returns one
// event for each. It finds them all before it cancels any: a cancelled
// batch may return, and its other messages' handlers with it, at once.
func (r *Relay) cancelLost(lost map[outboxdriver.Fence]bool) []LeaseLostEvent {
	var running []*job
	r.inflightMu.Lock()
	defer r.inflightMu.Unlock()
	for b := range r.inflight {
		for i := range b.jobs {
			if j := &b.jobs[i]; lost[outboxdriver.Fence{ID: j.c.ID, Attempts: j.c.Attempts}] && !j.ended.Load() {
				running = append(running, j)
			}
		}
	}
	events := make([]LeaseLostEvent, len(running))
	for i, j := range running {
		j.ctx.cancel()
		if j.lead != nil {
			j.lead.ctx.cancel() // its batch's context
		}
		events[i] = LeaseLostEvent{ID: j.c.ID, Topic: j.c.Topic, Attempt: j.c.Attempts - j.c.AttemptsBase}
	}
	return events
}
