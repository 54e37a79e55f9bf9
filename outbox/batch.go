package outbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds batch handlers (Relay.HandleBatch) and the catch-all
// (AllTopics): which handler a topic goes to, how the claim loop gathers
// a claim's messages for one batch handler into one job, and how that job
// runs the batch and turns its outcomes into settlements, one per message
// as a Handler's would be.

// batchHandler is a registered BatchHandler (a pointer: the claim loop
// gathers a claim's messages by it).
type batchHandler struct{ h BatchHandler }

// errRunStopped is the outcome reported to the observer for a message of a
// batch that follows, in its key, a message whose outcome was not done: it
// is not settled, and is delivered again after that message.
var errRunStopped = errors.New("outbox: not settled: an earlier message of its key was not done")

// handlerOf returns the Handler of topic (of subscriber's copies of it,
// when subscriber is not ""): its own, else the catch-all's when topic has
// no batch handler of its own; nil when a batch handler (or none) handles
// topic.
func (r *Relay) handlerOf(topic, subscriber string) Handler {
	if subscriber != "" {
		return r.subscriberHandler(topic, subscriber)
	}
	if h, ok := r.handlers[topic]; ok || !r.all {
		if !ok && r.subs[topic] != nil && r.batches[topic] == nil {
			return plainHandler(topic) // a relay that only subscribes to topic
		}
		return h
	}
	if _, ok := r.batches[topic]; ok {
		return nil
	}
	return r.handlers[AllTopics]
}

// handles reports whether this relay has a handler for subscriber's
// copies of topic (subscriber ""; the topic's own messages), a batch
// handler or the catch-all included.
func (r *Relay) handles(topic, subscriber string) bool {
	if subscriber != "" {
		_, ok := r.subs[topic][subscriber]
		return ok
	}
	_, h := r.handlers[topic]
	_, b := r.batches[topic]
	return h || b || r.all
}

// batchOf is batchFor of claimed message c.
func (r *Relay) batchOf(c *outboxdriver.Claimed) *batchHandler {
	return r.batchFor(c.Topic, subscriberOf(c.Key))
}

// batchFor is handlerOf for batch handlers: nil when a Handler (or none)
// handles topic (subscriber's copies of it).
func (r *Relay) batchFor(topic, subscriber string) *batchHandler {
	if subscriber != "" {
		return r.subs[topic][subscriber].b
	}
	if b, ok := r.batches[topic]; ok || !r.all {
		return b
	}
	if _, ok := r.handlers[topic]; ok {
		return nil
	}
	return r.batches[AllTopics]
}

// callTopic runs the handler of d's topic on d alone: a batch handler
// gets a batch of one.
func (r *Relay) callTopic(ctx context.Context, d Delivery) error {
	if h := r.handlerOf(d.Topic, d.Subscriber); h != nil {
		return r.call(ctx, h, d)
	}
	if b := r.batchFor(d.Topic, d.Subscriber); b != nil {
		return r.callBatch(ctx, b.h, []Delivery{d})[0]
	}
	return fmt.Errorf("outbox: no handler for topic %q", d.Topic)
}

// group gathers, in place, the jobs of one claim whose messages a batch
// handler handles (under r.inflightMu, which the caller holds:
// cancelHandler reads the jobs' lead, and register has published them): the first job of each batch handler stays in dispatch
// with group set to all of them, in claim order; the others leave
// dispatch. Jobs of Handlers stay as they are.
func (r *Relay) group(dispatch []*job) []*job {
	type batch struct {
		b    *batchHandler
		lead *job
	}
	var batches []batch // as many as batch handlers in the claim: few
	k := 0
	for _, j := range dispatch {
		b := r.batchOf(j.c)
		if b == nil {
			dispatch[k] = j
			k++
			continue
		}
		i := 0
		for i < len(batches) && batches[i].b != b {
			i++
		}
		if i == len(batches) {
			j.group = []*job{j}
			batches = append(batches, batch{b, j})
			dispatch[k] = j
			k++
			continue
		}
		lead := batches[i].lead
		lead.group = append(lead.group, j)
		j.lead = lead
	}
	clear(dispatch[k:])
	return dispatch[:k]
}

// callBatch runs h on ds, turning a panic or a result of the wrong length
// into that error for every delivery.
func (r *Relay) callBatch(ctx context.Context, h BatchHandler, ds []Delivery) (errs []error) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("outbox: batch handler panicked", "count", len(ds), "first_message_id", ds[0].ID, "topic", ds[0].Topic, "panic", p, "stack", string(debug.Stack()))
			errs = sameError(len(ds), fmt.Errorf("batch handler panicked: %v", p))
		}
	}()
	errs = h(ctx, ds)
	if len(errs) != len(ds) {
		err := fmt.Errorf("batch handler returned %d outcomes for %d deliveries", len(errs), len(ds))
		r.log.Error("outbox: "+err.Error(), "first_message_id", ds[0].ID, "topic", ds[0].Topic)
		errs = sameError(len(ds), err)
	}
	return errs
}

func sameError(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// batchItem is one message of a batch: a claimed message, or a member of
// the run of a claimed ordered head.
type batchItem struct {
	m        *outboxdriver.Claimed
	attempts int  // m's claims, this delivery included
	member   bool // a run member (its head is the item's head before it)
	d        Delivery
	err      error // decoding its headers failed: it is not in the batch
	at       int   // its place in the batch, when err is nil
	ctx      context.Context
}

// deliverBatch runs the batch handler of lead's group on the group's
// messages (with the runs of ordered heads) and queues their outcomes.
func (r *Relay) deliverBatch(lead *job) {
	defer func() {
		for _, j := range lead.group {
			r.finished(j)
		}
	}()
	b := r.batchOf(lead.c)
	items := make([]batchItem, 0, len(lead.group))
	// Run members fill what the claim's heads leave of BatchSize: a run is
	// a prefix of its key, so cutting it leaves the rest blocked.
	room := r.cfg.BatchSize - len(lead.group)
	for _, j := range lead.group {
		if r.ord != nil && r.spent(j) {
			r.deadSpent(j) // no handler runs
			continue
		}
		if !r.addItem(&items, j.c, j.c.Attempts, false) || j.c.KeySeq == 0 {
			continue
		}
		for i := range j.c.Run {
			m := &j.c.Run[i]
			// A run member was not claimed: this delivery is its next
			// attempt. The run stops before a message another handler
			// handles (it becomes the key's head once these are done).
			if room <= 0 || r.batchOf(m) != b {
				break
			}
			room--
			if !r.addItem(&items, m, m.Attempts+1, true) {
				break
			}
		}
	}
	ds := make([]Delivery, 0, len(items))
	for i := range items {
		if it := &items[i]; it.err == nil {
			it.at = len(ds)
			ds = append(ds, it.d)
		}
	}
	ctx := &lead.ctx
	var start time.Time
	if r.cfg.Observer != nil {
		for i := range items {
			items[i].ctx = r.cfg.Observer.HandlerStart(ctx, items[i].d)
		}
		start = time.Now()
	}
	var errs []error
	if len(ds) > 0 {
		errs = r.callBatch(ctx, b.h, ds)
	}
	// The outcomes expire with the lease as renewed until the handler
	// returned, not a lease counted from now.
	r.settleBatch(items, errs, start, lead.b.leaseEnd(r.cfg.Lease))
}

// addItem appends m to items, and reports whether its headers decoded
// (a message whose headers do not is dead-lettered without running the
// handler, and ends its key's run).
func (r *Relay) addItem(items *[]batchItem, m *outboxdriver.Claimed, attempts int, member bool) bool {
	it := batchItem{m: m, attempts: attempts, member: member, at: -1, d: newDelivery(m, attempts)}
	if len(m.Headers) > 0 {
		it.d.Headers, it.err = decodeHeaders(m.Headers)
	}
	*items = append(*items, it)
	return it.err == nil
}

// settleBatch turns the outcomes of a batch's items (errs, by place in the
// batch) into settlements: one per unordered message; one run outcome per
// ordered head, which stops at its run's first message not done. They
// expire at expires, when the claim's leases lapse.
func (r *Relay) settleBatch(items []batchItem, errs []error, start, expires time.Time) {
	out := make([]queued, 0, len(items))
	var run *outboxdriver.RunOutcome
	var settled []outboxdriver.Settlement // run's, for the tracer
	stopped := false                      // run's key had a message not done
	flush := func() {
		if run != nil {
			r.sendRun(queuedRun{*run, expires, settled})
			run, settled = nil, nil
		}
	}
	for i := range items {
		it := &items[i]
		err := it.err
		if err == nil {
			err = errs[it.at]
		}
		if !it.member {
			flush()
			if it.m.KeySeq != 0 {
				run = &outboxdriver.RunOutcome{Head: outboxdriver.Fence{ID: it.m.ID, Attempts: it.m.Attempts}, Key: it.m.Key, Done: make([]outboxdriver.ID, 0, 1+len(it.m.Run))}
				stopped = false
			}
		}
		var s outboxdriver.Settlement
		if run != nil && stopped {
			// Held behind its key's failed message: not settled.
			err, s = errRunStopped, outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: it.m.ID, Attempts: it.attempts}, Kind: outboxdriver.SettleRetry}
		} else {
			mc := *it.m
			mc.Attempts = it.attempts
			s = r.outcome(&mc, err)
			switch {
			case run == nil:
				out = append(out, queued{s, expires})
			case s.Kind == outboxdriver.SettleDone:
				run.Done = append(run.Done, it.m.ID)
			default:
				run.Failed, stopped = s, true
				run.Halt = s.Kind == outboxdriver.SettleDead && r.halts(it.m.Topic)
			}
			if run != nil && r.cfg.Tracer != nil {
				settled = append(settled, s)
			}
		}
		if r.cfg.Observer != nil {
			r.observeHandled(it.ctx, &it.d, &s, start, it.err == nil, err)
		}
	}
	flush()
	if len(out) > 0 && !r.out.add(out...) {
		r.dropped("the relay has stopped", out)
	}
}
