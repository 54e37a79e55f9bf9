package outbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// workerIdle is how long a relay dispatches nothing before its idle
// handler goroutines exit.
const workerIdle = 5 * time.Second

// work delivers the messages of queue until it yields nil (the claim loop
// has stopped, or the relay has been idle a while). Reusing goroutines
// saves starting one per message and growing its stack again each time.
func (r *Relay) work(queue *handlerQueue, workers *sync.WaitGroup, sl *slots) {
	for j := queue.next(false); j != nil; j = queue.next(true) {
		r.workOne(j, workers, sl)
	}
}

// register makes one batch of the claimed messages (but dead-lettered
// ones), each with its handler's context carrying ctx's values, records
// it in r.inflight, and appends its jobs to dispatch: once per claim,
// under one lock, rather than once per message from each handler
// goroutine.
func (r *Relay) register(ctx context.Context, claimed []outboxdriver.Claimed, dispatch []*job) []*job {
	n := 0
	for i := range claimed {
		if !claimed[i].Dead {
			n++
		}
	}
	if n == 0 {
		return dispatch
	}
	b := &claimBatch{jobs: make([]job, n), claimed: time.Now()}
	b.left.Store(int64(n))
	k := 0
	for i := range claimed {
		if c := &claimed[i]; !c.Dead {
			j := &b.jobs[k]
			j.c, j.b, j.ctx.parent = c, b, ctx
			dispatch = append(dispatch, j)
			k++
		}
	}
	r.inflightN.Add(int64(n))
	r.inflightMu.Lock()
	defer r.inflightMu.Unlock()
	r.inflight[b] = struct{}{}
	if r.handlersCancelled {
		for i := range b.jobs {
			b.jobs[i].ctx.cancel()
		}
	}
	return dispatch
}

// finished records that j's handler has returned, and forgets its batch
// once all of the batch's have.
func (r *Relay) finished(j *job) {
	j.ctx.cancel()
	j.ended.Store(true)
	r.inflightN.Add(-1)
	if j.b.left.Add(-1) == 0 {
		r.inflightMu.Lock()
		delete(r.inflight, j.b)
		r.inflightMu.Unlock()
	}
}

// inflightCount is the number of handlers registered and not finished.
func (r *Relay) inflightCount() int { return int(r.inflightN.Load()) }

// slots counts a relay's running handlers.
type slots struct {
	running  atomic.Int64
	freed    chan struct{} // signalled when running falls to signalAt
	signalAt int64
}

// workOne delivers j (its batch, when it leads one) and frees its slots,
// one per message.
func (r *Relay) workOne(j *job, workers *sync.WaitGroup, sl *slots) {
	n := int64(1)
	if j.group != nil {
		n = int64(len(j.group))
		r.deliverBatch(j)
	} else {
		r.deliver(j)
	}
	defer workers.Add(-int(n))
	if left := sl.running.Add(-n); left <= sl.signalAt && left+n > sl.signalAt {
		select {
		case sl.freed <- struct{}{}:
		default:
		}
	}
}

// deliver runs the handler of one claimed message and queues its outcome.
func (r *Relay) deliver(j *job) {
	if r.ord != nil && r.deliverOrdered(j) { // a run, or spent (ordered.go)
		return
	}
	c := j.c
	defer r.finished(j)

	d := newDelivery(c, c.Attempts)
	h := r.handlerOf(c.Topic, d.Subscriber)
	var err error
	if len(c.Headers) > 0 {
		d.Headers, err = decodeHeaders(c.Headers)
	}
	if r.cfg.Observer != nil {
		r.deliverObserved(j, h, &d, err)
		return
	}
	if err == nil {
		err = r.call(&j.ctx, h, d)
	}
	r.send(queued{r.outcome(c, err), j.b.leaseEnd(r.cfg.Lease)})
}

// newDelivery is the delivery of claimed message c for its attempts-th
// claim (c.Attempts, or one more for an ordered run's member), without its
// headers.
func newDelivery(c *outboxdriver.Claimed, attempts int) Delivery {
	d := Delivery{ID: c.ID, Topic: c.Topic, Key: c.Key, Payload: c.Payload, Attempt: attempts - c.AttemptsBase, CreatedAt: c.CreatedAt}
	if len(c.Key) > 0 {
		d.splitSubscriber()
	}
	return d
}

// call runs h, turning a panic into an error.
func (r *Relay) call(ctx context.Context, h Handler, d Delivery) (err error) {
	defer func() {
		if p := recover(); p != nil {
			who := []any{"message_id", d.ID, "topic", d.Topic}
			if d.Subscriber != "" {
				who = append(who, "subscriber", d.Subscriber)
			}
			r.log.Error("outbox: handler panicked", append(who, "panic", p, "stack", string(debug.Stack()))...)
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return h(ctx, d)
}

// outcome maps a handler's result to a settlement.
func (r *Relay) outcome(c *outboxdriver.Claimed, err error) outboxdriver.Settlement {
	s := outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}}
	if err == nil {
		s.Kind = outboxdriver.SettleDone
		return s
	}
	return r.failure(c, s, err)
}

// failure is outcome for a handler that did not succeed (apart, so that a
// success allocates nothing for the error checks).
func (r *Relay) failure(c *outboxdriver.Claimed, s outboxdriver.Settlement, err error) outboxdriver.Settlement {
	attempt := c.Attempts - c.AttemptsBase // since the last redrive
	var retry *RetryError
	var cancel *DeadLetterError
	switch {
	case errors.As(err, &cancel):
		s.Kind, s.Error = outboxdriver.SettleDead, cleanError(err)
		r.log.Warn("outbox: message cancelled; dead-lettered", logWho(c, "attempt", attempt, "outcome", OutcomeDead.String(), "err", err)...)
		return s
	}
	s.Error = cleanError(err)
	if attempt >= r.cfg.MaxAttempts {
		s.Kind = outboxdriver.SettleDead
		r.log.Warn("outbox: message failed its last attempt; dead-lettered", logWho(c, "attempt", attempt, "outcome", OutcomeDead.String(), "err", err)...)
		return s
	}
	s.Kind = outboxdriver.SettleRetry
	if errors.As(err, &retry) {
		s.Delay, s.At = max(retry.After, 0), retryTime(retry.At)
	} else {
		s.Delay = r.retry.Delay(attempt)
	}
	r.log.Info("outbox: handler failed; retrying", logWho(c, "attempt", attempt, "outcome", OutcomeRetry.String(), "retry_in", s.Delay, "err", err)...)
	return s
}

// logWho returns the log attributes naming c (its id, topic and, for a
// subscriber's copy, subscriber) followed by more.
func logWho(c *outboxdriver.Claimed, more ...any) []any {
	who := []any{"message_id", c.ID, "topic", c.Topic}
	if sub := subscriberOf(c.Key); sub != "" {
		who = append(who, "subscriber", sub)
	}
	return append(who, more...)
}

// retryTime clamps a handler's RetryAt time into the years every dialect's
// timestamp column stores (1970 to 9999, as for Message.NotBefore), in UTC:
// the one place where a far past or far future time is made storable.
func retryTime(t time.Time) time.Time {
	switch {
	case t.IsZero():
		return t
	case t.Before(earliest):
		return earliest
	case t.After(latest):
		return latest
	}
	return t.UTC()
}

// maxErrorBytes bounds the last_error recorded for a message.
const maxErrorBytes = 4096

// cleanError makes err's text storable in a text column: valid UTF-8, no
// NUL, at most maxErrorBytes.
func cleanError(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) > maxErrorBytes {
		s = strings.ToValidUTF8(s[:maxErrorBytes], "")
	}
	return s
}
