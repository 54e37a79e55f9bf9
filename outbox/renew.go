package outbox

import (
	"context"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

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
		rctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
		kept, err := r.d.Renew(rctx, r.db, r.ob.table, r.cfg.Lease, held)
		if err != nil {
			err = wrapOp(rctx, "renew", r.d.Classify(err))
		}
		cancel()
		if err != nil {
			r.log.Error("outbox: lease renewal failed", "err", err, "count", len(held))
			return
		}
		for _, b := range batches {
			b.renewed.Store(int64(now.Sub(b.claimed)))
		}
		if len(kept) < len(held) {
			still := make(map[outboxdriver.Fence]bool, len(kept))
			for _, f := range kept {
				still[f] = true
			}
			for _, f := range held {
				if still[f] {
					continue
				}
				topic, attempt := r.cancelHandler(f)
				r.log.Warn("outbox: lease lost: the message was claimed again; cancelling its handler, whose outcome will be fenced off", "message_id", f.ID, "topic", topic, "attempt", attempt)
				if r.cfg.Observer != nil {
					r.cfg.Observer.LeaseLost(ctx, LeaseLostEvent{ID: f.ID, Topic: topic, Attempt: attempt})
				}
			}
		}
	})
}

// cancelHandler cancels the context of the handler of claim f, if it is
// running, and returns its message's topic and attempt (as Delivery.Attempt
// counts it); "" and f's claim count when it is not.
func (r *Relay) cancelHandler(f outboxdriver.Fence) (topic string, attempt int) {
	attempt = f.Attempts
	r.inflightMu.Lock()
	defer r.inflightMu.Unlock()
	for b := range r.inflight {
		for i := range b.jobs {
			if j := &b.jobs[i]; j.c.ID == f.ID && j.c.Attempts == f.Attempts {
				j.ctx.cancel()
				if j.lead != nil {
					j.lead.ctx.cancel() // its batch's context
				}
				topic, attempt = j.c.Topic, j.c.Attempts-j.c.AttemptsBase
			}
		}
	}
	return topic, attempt
}
