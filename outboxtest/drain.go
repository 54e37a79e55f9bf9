package outboxtest

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// DrainPollInterval is the poll interval of the relay [Drain] runs when
// its RelayConfig leaves PollInterval zero.
const DrainPollInterval = 10 * time.Millisecond

// Outcome is what the relay did with one delivery attempt.
type Outcome int

// The outcomes of an attempt.
const (
	// Delivered: the handler succeeded; the message was deleted (or kept
	// as delivered, with RelayConfig.KeepDelivered).
	Delivered Outcome = iota + 1
	// Retried: the handler failed; the message is due again after its
	// backoff (or its RetryAfter), later than Drain looked.
	Retried
	// DeadLettered: the handler returned outbox.DeadLetter, HandleJSON
	// could not decode or validate the payload, or the message had used
	// its RelayConfig.MaxAttempts.
	DeadLettered
)

func (o Outcome) String() string {
	switch o {
	case Delivered:
		return "delivered"
	case Retried:
		return "retried"
	case DeadLettered:
		return "dead-lettered"
	}
	return "unknown"
}

// Attempt is one delivery attempt seen by [Drain], as its handler saw it,
// with what the relay then wrote.
type Attempt struct {
	outbox.Delivery
	Outcome Outcome
	// Error is the error recorded for the message ("" when delivered):
	// the handler's error, or why the relay dead-lettered it.
	Error string
}

// Drain runs a relay of ob on db until no message is due for the topics
// it handles and none is being handled, then stops it and returns every
// attempt it made, ordered by message id (publish order, within one
// process) then attempt. It is meant for integration tests of handlers on
// a real database, with any dialect:
//
//	attempts, err := outboxtest.Drain(ctx, ob, sqltx.FromDB(db), nil, app.RegisterHandlers)
//
// register adds the handlers to the relay, as the service does at start-up
// (with [outbox.Relay.Handle] or [outbox.HandleJSON]). cfg configures the
// relay (nil for the defaults): Drain sets its Tracer, chaining to the one
// cfg has, and its PollInterval, when zero, to DrainPollInterval.
//
// Messages that are not due (delayed, or retried after a backoff) and
// messages of topics without a handler are left in the table. A message
// whose handler fails is reported as Retried, and attempted again within
// the same Drain if its retry falls due before Drain is done: with the
// default full jitter a backoff can be near zero, so a test that expects
// one attempt sets RetryJitter to new(0.0) and a RetryBase longer than the
// test.
//
// On an Outbox with OrderByKey, Drain works the same, with Handlers and
// batch handlers alike, and lists each message of a key with its own
// attempt and outcome. The messages behind a key's head that was retried
// or dead-lettered under [outbox.HaltKey] are not attempted (or, given to
// a batch handler in the batch of their failed head, nothing is written
// for them): they stay blocked in the table and are not listed.
//
// Drain returns an error when the relay cannot be built or started (such
// as [outbox.ErrNoHandlers] or [outbox.ErrTableMissing]) and, with the
// attempts made so far, when ctx ends first.
func Drain(ctx context.Context, ob *outbox.Outbox, db outbox.DB, cfg *outbox.RelayConfig, register func(r *outbox.Relay) error) ([]Attempt, error) {
	var c outbox.RelayConfig
	if cfg != nil {
		c = *cfg
	}
	if c.PollInterval == 0 {
		c.PollInterval = DrainPollInterval
	}
	d := &drainer{next: c.Tracer, pending: map[outboxdriver.Fence]int{}, members: map[outboxdriver.Fence]Attempt{},
		runs: map[outboxdriver.Fence][]outboxdriver.Fence{}, done: make(chan struct{})}
	c.Tracer = d
	r, err := ob.Relay(db, c)
	if err != nil {
		return nil, err
	}
	if register != nil {
		if err := register(r); err != nil {
			return nil, err
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- r.Run(rctx) }()
	select {
	case <-d.done:
		cancel()
		err = <-ran
	case err = <-ran: // Run could not start
	case <-ctx.Done():
		cancel()
		err = <-ran
	}
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return d.attempts(), err
}

// Published delivers the due messages of topics in ob's table on db with
// a handler that accepts each, and returns them ordered by id (publish
// order, within one process): a test runs the code under test on a real
// database, commits, and checks what it published. The messages are gone
// afterwards (deleted, or delivered with RelayConfig.KeepDelivered), as
// after a relay; messages of other topics stay. On an Outbox with
// OrderByKey, so do the messages of topics behind a message of another
// topic in their key: they wait for it. It returns outbox.ErrNoHandlers
// without topics.
func Published(ctx context.Context, ob *outbox.Outbox, db outbox.DB, topics ...string) ([]outbox.Delivery, error) {
	accept := func(context.Context, outbox.Delivery) error { return nil }
	attempts, err := Drain(ctx, ob, db, nil, func(r *outbox.Relay) error {
		for _, t := range topics {
			if err := r.Handle(t, accept); err != nil {
				return err
			}
		}
		return nil
	})
	ds := make([]outbox.Delivery, 0, len(attempts))
	for _, a := range attempts {
		if a.Outcome == Delivered {
			ds = append(ds, a.Delivery)
		}
	}
	return ds, err
}

// drainer watches a relay through its tracer: done is closed after two
// claims in a row found nothing while no outcome was waiting to be
// written. The second claim began after the first ended, so after every
// outcome was written: a message those outcomes made due again (a retry
// without delay, the next message of an ordered key) would have been
// claimed.
//
// The relay traces one settlement per message handled, on both of its
// settle paths: a claimed message's, fenced by its claim, and, on an
// Outbox with OrderByKey, those of the members of a claimed head's run,
// each fenced by its attempts after this delivery, written with their
// head's in one settle. A run's members are listed once their outcome is
// written; those the relay did not reach (the run stopped at a failure or
// a lost lease) are forgotten with their head's settle: they stay blocked.
type drainer struct {
	next outbox.RelayTracer

	mu      sync.Mutex
	list    []Attempt
	pending map[outboxdriver.Fence]int                  // claims whose outcome is not written yet, to list
	members map[outboxdriver.Fence]Attempt              // claimed run members, by the fence of their delivery
	runs    map[outboxdriver.Fence][]outboxdriver.Fence // a pending head's run members
	empty   int                                         // empty claims in a row with nothing pending
	done    chan struct{}
	closed  bool
}

// attempt is the Attempt of c, delivered for the attempts-th time.
func attempt(c *outboxdriver.Claimed, attempts int) Attempt {
	a := Attempt{Delivery: outbox.Delivery{
		ID: c.ID, Topic: c.Topic, Key: c.Key, Payload: c.Payload,
		Attempt: attempts - c.AttemptsBase, CreatedAt: c.CreatedAt,
	}}
	if len(c.Headers) > 0 {
		_ = json.Unmarshal(c.Headers, &a.Headers) // the relay dead-letters it if invalid
	}
	return a
}

func (d *drainer) TraceClaim(ctx context.Context, claimed []outboxdriver.Claimed, err error) {
	if d.next != nil {
		d.next.TraceClaim(ctx, claimed, err)
	}
	if err != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range claimed {
		c := &claimed[i]
		a := attempt(c, c.Attempts)
		head := outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}
		if c.Dead {
			a.Outcome, a.Error = DeadLettered, "max attempts reached"
		} else {
			d.pending[head] = len(d.list)
		}
		d.list = append(d.list, a)
		for j := range c.Run {
			// A run member's delivery is its next attempt.
			m := &c.Run[j]
			f := outboxdriver.Fence{ID: m.ID, Attempts: m.Attempts + 1}
			d.members[f] = attempt(m, f.Attempts)
			d.runs[head] = append(d.runs[head], f)
		}
	}
	switch {
	case len(claimed) > 0 || len(d.pending) > 0:
		d.empty = 0
	default:
		d.empty++
		if d.empty == 2 && !d.closed {
			d.closed = true
			close(d.done)
		}
	}
}

func (d *drainer) TraceSettle(ctx context.Context, s []outboxdriver.Settlement, applied []outboxdriver.Fence, err error) {
	if d.next != nil {
		d.next.TraceSettle(ctx, s, applied, err)
	}
	if err != nil {
		return // the relay writes them again
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var heads []outboxdriver.Fence
	for _, x := range s {
		i, ok := d.pending[x.Fence]
		switch {
		case ok:
			delete(d.pending, x.Fence)
			heads = append(heads, x.Fence)
		default:
			a, ok := d.members[x.Fence]
			if !ok {
				continue
			}
			delete(d.members, x.Fence)
			i = len(d.list)
			d.list = append(d.list, a)
		}
		switch x.Kind {
		case outboxdriver.SettleDone:
			d.list[i].Outcome = Delivered
		case outboxdriver.SettleRetry:
			d.list[i].Outcome = Retried
		case outboxdriver.SettleDead:
			d.list[i].Outcome = DeadLettered
		}
		d.list[i].Error = x.Error
	}
	// A run is settled with its head: members it did not reach were not
	// delivered.
	for _, h := range heads {
		for _, f := range d.runs[h] {
			delete(d.members, f)
		}
		delete(d.runs, h)
	}
	d.empty = 0
}

func (d *drainer) attempts() []Attempt {
	d.mu.Lock()
	defer d.mu.Unlock()
	list := slices.Clone(d.list)
	slices.SortStableFunc(list, func(a, b Attempt) int {
		if c := bytes.Compare(a.ID[:], b.ID[:]); c != 0 {
			return c
		}
		return a.Attempt - b.Attempt
	})
	return list
}
