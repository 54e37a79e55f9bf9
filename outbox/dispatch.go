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
}

// job is a claimed message and its handler's context.
type job struct {
	c     *outboxdriver.Claimed
	b     *claimBatch
	ctx   handlerCtx
	ended atomic.Bool // its handler has returned
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

// handlerQueue hands jobs to the handler goroutines. The claim loop queues
// a claim's jobs and wakes (or starts) one goroutine; a goroutine that
// takes a job while more are queued wakes (or starts) the next, and one
// that finishes a handler takes the next queued job itself. So when
// handlers are quick, a few goroutines run a whole claim without a wake-up
// per message (waking a parked goroutine for each message, as an
// unbuffered channel did, was most of the relay's scheduler time), and
// when handlers block, every queued job still gets its own goroutine, one
// wake-up after the other.
type handlerQueue struct {
	mu     sync.Mutex
	cond   sync.Cond
	queue  []*job
	head   int
	idle   int  // goroutines waiting in next
	waking bool // one has been woken or started and has not looked yet
	// retiring is how many idle goroutines should exit (see retire).
	retiring int
	closed   bool
	start    func() // starts a handler goroutine
}

func newHandlerQueue(start func()) *handlerQueue {
	q := &handlerQueue{start: start}
	q.cond.L = &q.mu
	return q
}

// push queues jobs. Handler slots bound the jobs queued or running, so
// the queue never holds more than RelayConfig.Concurrency.
func (q *handlerQueue) push(jobs []*job) {
	q.mu.Lock()
	q.queue = append(q.queue, jobs...)
	q.wakeLocked()
	q.mu.Unlock()
}

// wakeLocked wakes or starts a goroutine for the queued jobs, unless one
// is on its way.
func (q *handlerQueue) wakeLocked() {
	if q.waking || q.head == len(q.queue) {
		return
	}
	q.waking = true
	if q.idle > 0 {
		q.cond.Signal()
		return
	}
	q.start()
}

// next returns the next job, waiting for one; nil when the goroutine
// should exit (the queue is closed and empty, or it was idle too long).
func (q *handlerQueue) next() *job {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.head < len(q.queue) {
			j := q.queue[q.head]
			q.queue[q.head] = nil
			q.head++
			if q.head == len(q.queue) {
				q.queue, q.head = q.queue[:0], 0
			}
			q.waking = false
			q.wakeLocked() // more are queued: wake the next goroutine
			return j
		}
		q.waking = false
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
	q.mu.Unlock()
	q.cond.Broadcast()
}
