package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds the hooks observability plugs into (metrics, traces,
// handler middleware): the relay calls them from its loops only when they
// are set, so a relay without them pays a nil check and nothing else. The
// OpenTelemetry package (module github.com/oncommit/oncommit/otel)
// implements them; the core imports no telemetry library.

// Middleware wraps a Handler (not a BatchHandler) in its own code: a
// timeout, a span, a metric. See [RelayConfig.Middleware].
type Middleware func(next Handler) Handler

// Outcome is what the relay settles for one delivery.
type Outcome int

// The outcomes of a delivery.
const (
	// OutcomeDone: the handler succeeded; the message is deleted (or marked
	// delivered).
	OutcomeDone Outcome = iota
	// OutcomeRetry: the handler failed; the message is rescheduled.
	OutcomeRetry
	// OutcomeDead: the message is dead-lettered (DeadLetter, its last
	// attempt failed, or its headers could not be decoded).
	OutcomeDead
	// OutcomeHeld: in an ordered batch, the message came after a failure
	// of its key: not settled, not an attempt, delivered again.
	OutcomeHeld
)

func (o Outcome) String() string {
	switch o {
	case OutcomeDone:
		return "done"
	case OutcomeRetry:
		return "retry"
	case OutcomeDead:
		return "dead"
	case OutcomeHeld:
		return "held"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// ClaimEvent describes one claim statement, for [RelayObserver.ClaimEnd].
type ClaimEvent struct {
	// Claimed is the number of rows the claim took; DeadLettered how many
	// of them it dead-lettered (max attempts reached).
	Claimed      int
	DeadLettered int
	// Limit is the most rows the claim could take.
	Limit int
	// Duration is how long the statement took.
	Duration time.Duration
	// Err is the claim's error; nil when it succeeded.
	Err error
}

// HandlerEvent describes one handler run, for [RelayObserver.HandlerEnd].
type HandlerEvent struct {
	// Delivery is the message as the handler saw it.
	Delivery Delivery
	// Outcome is what the relay writes for it.
	Outcome Outcome
	// Duration is how long the handler ran.
	Duration time.Duration
	// Err is the handler's error (nil on OutcomeDone).
	Err error
	// RetryIn is the delay before the next attempt, with OutcomeRetry.
	RetryIn time.Duration
}

// SettleEvent describes one write of outcomes, for [RelayObserver.SettleEnd].
type SettleEvent struct {
	// Count is the number of outcomes written; Applied those whose fence
	// held; FencedOff the others (another claim had taken them).
	Count     int
	Applied   int
	FencedOff int
	// Carried is true when a claim statement wrote them; Duration is then
	// the claim's.
	Carried  bool
	Duration time.Duration
	// Err is the write's error; the outcomes are written again later.
	Err error
}

// DeadLetterReason says why a message was dead-lettered.
type DeadLetterReason int

// The reasons a message is dead-lettered.
const (
	// DeadMaxAttempts: the claim found the message out of attempts (they
	// never finished: a crash, a lost lease); no handler ran.
	DeadMaxAttempts DeadLetterReason = iota
	// DeadLastAttempt: the handler failed its last attempt.
	DeadLastAttempt
	// DeadCancelled: the handler returned [DeadLetter], or the headers
	// could not be decoded.
	DeadCancelled
)

func (r DeadLetterReason) String() string {
	switch r {
	case DeadMaxAttempts:
		return "max_attempts"
	case DeadLastAttempt:
		return "last_attempt"
	case DeadCancelled:
		return "cancelled"
	}
	return fmt.Sprintf("DeadLetterReason(%d)", int(r))
}

// DeadLetterEvent describes a dead-lettered message, for
// [RelayObserver.DeadLettered].
type DeadLetterEvent struct {
	ID    ID
	Topic string
	// Subscriber is the subscriber of a copy (Config.Subscribers), "" for
	// a message without one.
	Subscriber string
	Attempt    int
	Reason     DeadLetterReason
	// Err is the handler's error; nil with DeadMaxAttempts.
	Err error
}

// LeaseLostEvent describes a lease the relay lost while the handler ran,
// for [RelayObserver.LeaseLost].
type LeaseLostEvent struct {
	ID ID
	// Topic is "" when the handler had returned meanwhile.
	Topic   string
	Attempt int
}

// RelayObserver is told what a relay does; set it as
// [RelayConfig.Observer]. Its methods are called concurrently and must not
// block.
type RelayObserver interface {
	// ClaimEnd is called after each claim statement.
	ClaimEnd(ctx context.Context, e ClaimEvent)
	// HandlerStart is called before a handler runs, with the context it
	// returns, which must derive from ctx.
	HandlerStart(ctx context.Context, d Delivery) context.Context
	// HandlerEnd is called after the handler returns, with the context
	// HandlerStart returned.
	HandlerEnd(ctx context.Context, e HandlerEvent)
	// SettleEnd is called after each write of outcomes.
	SettleEnd(ctx context.Context, e SettleEvent)
	// DeadLettered is called for each message the relay dead-letters.
	DeadLettered(ctx context.Context, e DeadLetterEvent)
	// LeaseLost is called for each running handler whose lease another
	// claim took.
	LeaseLost(ctx context.Context, e LeaseLostEvent)
	// ListenerChanged is called when the wake-up listener changes state.
	ListenerChanged(ctx context.Context, s ListenerState)
}

// PublishEvent describes one Publish or PublishBatch call, for
// [PublishHook.PublishEnd].
type PublishEvent struct {
	// Messages are the messages as stored, Contexts those PublishStart
	// returned, Results their results (nil with Err), in order.
	Messages []Message
	Contexts []context.Context
	Results  []Result
	// Err is the call's error.
	Err error
}

// PublishHook sees every message Publish and PublishBatch store; set it as
// [Config.Hook]. PublishSQL does not run it.
type PublishHook interface {
	// PublishStart is called for each message before validation and
	// returns its context. It may change m; m.Headers is its own copy.
	PublishStart(ctx context.Context, m *Message) context.Context
	// PublishEnd is called once per call, after the statement or a refusal.
	PublishEnd(ctx context.Context, e PublishEvent)
}

// hookStart runs the publish hook on a copy of msgs (the caller's
// messages and header maps stay as they were).
func (o *Outbox) hookStart(ctx context.Context, msgs []Message) ([]Message, []context.Context) {
	own := make([]Message, len(msgs))
	ctxs := make([]context.Context, len(msgs))
	for i := range msgs {
		own[i] = msgs[i]
		if own[i].Headers != nil {
			own[i].Headers = maps.Clone(own[i].Headers)
		}
		ctxs[i] = o.cfg.Hook.PublishStart(ctx, &own[i])
	}
	return own, ctxs
}

// wrapHandler applies the relay's middleware to h, the first outermost.
func (r *Relay) wrapHandler(h Handler) (Handler, error) {
	for i := len(r.cfg.Middleware) - 1; i >= 0; i-- {
		if r.cfg.Middleware[i] == nil {
			return nil, &ConfigError{Field: "Middleware", Reason: fmt.Sprintf("element %d is nil", i)}
		}
		if h = r.cfg.Middleware[i](h); h == nil {
			return nil, &ConfigError{Field: "Middleware", Reason: fmt.Sprintf("element %d returned a nil handler", i)}
		}
	}
	return h, nil
}

// setListener records the listener's state in the health and tells the
// observer.
func (r *Relay) setListener(ctx context.Context, s ListenerState, connected bool) {
	r.health.listener(s, connected)
	if r.cfg.Observer != nil {
		r.cfg.Observer.ListenerChanged(ctx, s)
	}
}

// observeClaim tells the observer about a claim that took claimed.
func (r *Relay) observeClaim(ctx context.Context, claimed []outboxdriver.Claimed, limit int, start time.Time, err error) {
	e := ClaimEvent{Claimed: len(claimed), Limit: limit, Duration: time.Since(start), Err: err}
	for i := range claimed {
		if c := &claimed[i]; c.Dead {
			e.DeadLettered++
			r.cfg.Observer.DeadLettered(ctx, DeadLetterEvent{ID: c.ID, Topic: c.Topic, Subscriber: subscriberOf(c.Key), Attempt: c.Attempts - c.AttemptsBase, Reason: DeadMaxAttempts})
		}
	}
	r.cfg.Observer.ClaimEnd(ctx, e)
}

// observeSettle tells the observer about a write of n outcomes.
func (r *Relay) observeSettle(ctx context.Context, n, applied int, carried bool, start time.Time, err error) {
	e := SettleEvent{Count: n, Carried: carried, Duration: time.Since(start), Err: err}
	if err == nil {
		e.Applied, e.FencedOff = applied, n-applied
	}
	r.cfg.Observer.SettleEnd(ctx, e)
}

// observeHandled tells the observer how a delivery ended.
func (r *Relay) observeHandled(ctx context.Context, d *Delivery, s *outboxdriver.Settlement, start time.Time, ran bool, err error) {
	e := HandlerEvent{Delivery: *d, Err: err}
	if ran {
		e.Duration = time.Since(start)
	}
	switch {
	case err == errRunStopped:
		e.Outcome = OutcomeHeld
	case s.Kind == outboxdriver.SettleDone:
		e.Outcome = OutcomeDone
	case s.Kind == outboxdriver.SettleRetry:
		e.Outcome, e.RetryIn = OutcomeRetry, s.Delay
		if !s.At.IsZero() {
			e.RetryIn = time.Until(s.At)
		}
	default:
		e.Outcome = OutcomeDead
		reason := DeadCancelled
		if d.Attempt >= r.cfg.MaxAttempts && !isDeadLetter(err) {
			reason = DeadLastAttempt
		}
		r.cfg.Observer.DeadLettered(ctx, DeadLetterEvent{ID: d.ID, Topic: d.Topic, Subscriber: d.Subscriber, Attempt: d.Attempt, Reason: reason, Err: err})
	}
	r.cfg.Observer.HandlerEnd(ctx, e)
}

// deliverObserved is deliver with an observer: it tells the observer
// about the handler's start and end. err is the error decoding the
// headers; the handler does not run then.
func (r *Relay) deliverObserved(j *job, h Handler, d *Delivery, err error) {
	ctx := r.cfg.Observer.HandlerStart(&j.ctx, *d)
	start := time.Now()
	ran := err == nil
	if ran {
		err = r.call(ctx, h, *d)
	}
	s := r.outcome(j.c, err)
	r.observeHandled(ctx, d, &s, start, ran, err)
	r.send(queued{s, j.b.leaseEnd(r.cfg.Lease)})
}

// isDeadLetter reports whether err asks for a dead letter.
func isDeadLetter(err error) bool {
	var dl *DeadLetterError
	return errors.As(err, &dl)
}
