package outbox

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds what the claim loop hands its handler goroutines: a
// claim's messages as one batch of jobs (one allocation per claim, their
// handlers' contexts inside it), and the queue the goroutines take them
// from.

// claimBatch is one claim's messages while their handlers run. It stays
// in r.inflight until the last of its handlers has finished.
type claimBatch struct {
	jobs    []job
	claimed time.Time
	left    atomic.Int64 // handlers not finished yet
	// renewed is when the last renewal of its leases that succeeded
	// began, as a time.Duration after claimed; 0 for none.
	renewed atomic.Int64
}

// leaseEnd is when the leases of b's messages lapse, as far as the relay
// knows: lease after the claim or after their last renewal (renewals are
// sent before the leases they extend lapse). It is the expiry of the
// outcomes of a claimed job (handled, observed, ordered runs, spent
// heads), for no clock read per message. A handler that ended while a
// renewal of its lease was under way may have its outcome expire before
// its lease does: if its writes keep failing until then, it is dropped
// early, and delivered again once the lease lapses.
func (b *claimBatch) leaseEnd(lease time.Duration) time.Time {
	return b.claimed.Add(time.Duration(b.renewed.Load()) + lease)
}

// job is a claimed message and its handler's context. The messages of one
// claim for one batch handler are delivered by one job, their first: its
// group holds them all (itself first), and each other's lead is it (a lost
// lease of one of them cancels the batch's context, the lead's).
type job struct {
	c     *outboxdriver.Claimed
	b     *claimBatch
	ctx   handlerCtx
	ended atomic.Bool // its handler has returned
	group []*job
	lead  *job
}

// handlerCtx is a handler's context: the values of the relay's context
// (Run's, without its cancellation), cancelled on its own when the lease
// is lost, at the end of the grace period, or when the handler returns.
// It is what context.WithCancel would give, without two allocations per
// message: it lives inside its claim's batch, and makes its Done channel
// only when a handler asks for it. AfterFunc lets contexts derived from it
// (context.WithTimeout in a handler) register without a goroutine each, as
// they do with the standard library's contexts.
type handlerCtx struct {
	parent context.Context
	mu     sync.Mutex
	done   chan struct{} // made on the first Done
	err    error
	afters map[*afterFunc]struct{}
}

type afterFunc struct{ f func() }

func (c *handlerCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }
func (c *handlerCtx) Value(key any) any           { return c.parent.Value(key) }
func (c *handlerCtx) String() string              { return "outbox handler context" }

func (c *handlerCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

func (c *handlerCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// AfterFunc arranges for f to run in its own goroutine once c is
// cancelled, as context.AfterFunc does; stop unregisters it and reports
// whether it did so before f was started.
func (c *handlerCtx) AfterFunc(f func()) (stop func() bool) {
	a := &afterFunc{f: f}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	if c.afters == nil {
		c.afters = map[*afterFunc]struct{}{}
	}
	c.afters[a] = struct{}{}
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.afters[a]
		delete(c.afters, a)
		return ok
	}
}

// cancel cancels c (once; later calls do nothing).
func (c *handlerCtx) cancel() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = context.Canceled
	if c.done != nil {
		close(c.done)
	}
	afters := c.afters
	c.afters = nil
	c.mu.Unlock()
	for a := range afters {
		go a.f()
	}
}

// handlerQueue hands jobs to the handler goroutines. A goroutine that
// finishes a handler takes the next queued job itself. When jobs are
// queued and no handler is running, the queue wakes (or starts) one
// goroutine. While handlers are running, it wakes none at first: a quick
// handler's goroutine comes back for the next job within microseconds, so
// one or two goroutines run a whole claim of quick handlers without a
// wake-up per message (waking a parked goroutine for each message, as an
// unbuffered channel did, was most of the relay's scheduler time, and
// waking the next goroutine whenever jobs were queued still cost a tenth
// of the relay's CPU). If jobs are still queued stallAfter later, the
// handlers are slow or blocked: the queue wakes (or starts) goroutines
// for the jobs left queued, a few at a time, each of which takes a job and
// wakes the next, and does so for jobs pushed later while handlers are
// running.
type handlerQueue struct {
	mu     sync.Mutex
	cond   sync.Cond
	queue  []*job
	head   int
	idle   int // goroutines waiting in next
	active int // goroutines running a handler
	// signalled and starting count the goroutines woken and started
	// that have not come to take a job yet.
	signalled, starting int
	// eager: handlers were slow to come back; wake a goroutine per job.
	// It lasts until jobs are pushed while no handler runs (the handlers
	// kept up), so slow handlers pay the stallAfter wait once, not once
	// per claim.
	eager      bool
	stall      *time.Timer // fires stallAfter after jobs were left queued
	stallArmed bool
	// retiring is how many idle goroutines should exit (see retire).
	retiring int
	closed   bool
	start    func() // starts a handler goroutine
}

// eagerWakes bounds the goroutines an eager queue wakes ahead of the jobs.
const eagerWakes = 8

// stallAfter is how long queued jobs wait for a running handler to come
// back for them before the queue wakes more goroutines.
const stallAfter = 100 * time.Microsecond

func newHandlerQueue(start func()) *handlerQueue {
	q := &handlerQueue{start: start}
	q.cond.L = &q.mu
	q.stall = time.AfterFunc(time.Hour, q.stalled)
	q.stall.Stop()
	return q
}

// stalled runs stallAfter after jobs were left queued while handlers ran.
func (q *handlerQueue) stalled() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stallArmed = false
	if q.head < len(q.queue) {
		q.eager = true
		q.wakeLocked()
	}
}

// push queues jobs. Handler slots bound the jobs queued or running, so
// the queue never holds more than RelayConfig.Concurrency.
func (q *handlerQueue) push(jobs []*job) {
	q.mu.Lock()
	if q.active == 0 {
		q.eager = false // the handlers kept up
	}
	q.queue = append(q.queue, jobs...)
	q.wakeLocked()
	q.mu.Unlock()
}

// wakeLocked wakes or starts goroutines for the queued jobs: eager, one
// for each job that none is on its way for; else one, when no handler is
// running and none is on its way.
func (q *handlerQueue) wakeLocked() {
	queued := len(q.queue) - q.head
	if queued == 0 {
		return
	}
	if !q.eager {
		if q.active > 0 {
			// A running handler takes the next job when it returns; if
			// none returns soon, stalled wakes goroutines.
			if !q.stallArmed {
				q.stallArmed = true
				q.stall.Reset(stallAfter)
			}
			return
		}
		queued = min(queued, 1)
	} else {
		// At most eagerWakes on their way at once: each takes a job and
		// wakes the next, so every job gets a goroutine, while a stall
		// that was only a goroutine kept off its CPU (a loaded host)
		// wakes a few goroutines rather than one per job.
		queued = min(queued, eagerWakes)
	}
	for n := queued - q.signalled - q.starting; n > 0; n-- {
		if q.idle > q.signalled {
			q.signalled++
			q.cond.Signal()
		} else {
			q.starting++
			q.start()
		}
	}
}

// next returns the next job, waiting for one; nil when the goroutine
// should exit (the queue is closed and empty, or it was idle too long).
// ran says the goroutine has just run a handler (it did, unless this is
// its first call).
func (q *handlerQueue) next(ran bool) *job {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ran {
		q.active--
	} else {
		q.starting-- // a goroutine start started
	}
	for {
		if q.head < len(q.queue) {
			j := q.queue[q.head]
			q.queue[q.head] = nil
			q.head++
			q.active++
			if q.head == len(q.queue) {
				q.queue, q.head = q.queue[:0], 0
				q.drainedLocked()
			} else {
				q.wakeLocked() // more are queued
			}
			return j
		}
		q.drainedLocked()
		if q.closed {
			return nil
		}
		if q.retiring > 0 {
			q.retiring--
			return nil
		}
		q.idle++
		q.cond.Wait()
		q.idle--
		if q.signalled > 0 {
			q.signalled--
		}
	}
}

// drainedLocked ends a burst: the queue is empty.
func (q *handlerQueue) drainedLocked() {
	if q.stallArmed {
		q.stallArmed = false
		q.stall.Stop()
	}
}

// retire makes the goroutines waiting in next exit.
func (q *handlerQueue) retire() {
	q.mu.Lock()
	q.retiring = q.idle
	q.mu.Unlock()
	q.cond.Broadcast()
}

// close makes the goroutines exit once the queue is empty.
func (q *handlerQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.eager = true // no more waiting for running handlers
	q.wakeLocked()
	q.mu.Unlock()
	q.cond.Broadcast()
}
