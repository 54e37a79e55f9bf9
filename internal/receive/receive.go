// Package receive is the broker consumers' shared step: apply one received
// message once, through an outbox.Inbox, and say what to tell the broker
// (acknowledge, redeliver later, or dead-letter). The consumers of the
// forwarder modules (forward/nats, forward/rabbitmq, forward/kafka) wrap it
// in their broker's receive loop.
package receive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// DefaultMaxAttempts is a consumer's MaxAttempts when its configuration
// leaves it zero.
const DefaultMaxAttempts = 5

// DefaultRetryDelay is a consumer's RetryDelay when its configuration
// leaves it zero.
const DefaultRetryDelay = time.Second

// Defaults fills a consumer configuration's shared fields where they are
// zero: MaxAttempts (DefaultMaxAttempts), RetryDelay (DefaultRetryDelay)
// and Logger (slog.Default()).
func Defaults(maxAttempts *int, retryDelay *time.Duration, logger **slog.Logger) {
	if *maxAttempts == 0 {
		*maxAttempts = DefaultMaxAttempts
	}
	if *retryDelay <= 0 {
		*retryDelay = DefaultRetryDelay
	}
	if *logger == nil {
		*logger = slog.Default()
	}
}

// ErrNoID is the reason a message without an id is dead-lettered at once:
// without one the inbox cannot tell a redelivery from a new message.
var ErrNoID = errors.New("the message carries no id")

// Verdict is what a consumer tells the broker about one message.
type Verdict int

const (
	// Ack: applied now, or a repeat of one applied before.
	Ack Verdict = iota
	// Retry: not applied; leave it for a redelivery.
	Retry
	// Dead: dead-lettered; acknowledge it so that it stops.
	Dead
)

func (v Verdict) String() string {
	switch v {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	default:
		return "dead"
	}
}

// Result is the outcome of [Apply].
type Result struct {
	Verdict Verdict
	// Applied is true when fn ran and its transaction committed.
	Applied bool
	// Repeat is true when the inbox had the id already (fn did not run).
	Repeat bool
	// Err is why the message was not applied (Retry, Dead), or why its
	// dead letter failed (Retry).
	Err error
}

// Apply runs fn for a message of id, delivered for the attempt-th time,
// once per (consumer, id) through ib, and returns the verdict. A message
// whose fn failed on its max-th attempt (or returned an error wrapping an
// outbox.DeadLetterError, or has no valid id) is handed to dead; when dead
// succeeds the verdict is Dead, else Retry: a message is never dropped
// unless its dead letter was written.
func Apply[T any](ctx context.Context, ib *outbox.Inbox, b outboxdriver.Beginner[T], consumer, id string, attempt, max int, fn func(ctx context.Context, tx T) error, dead func(ctx context.Context, reason error) error) Result {
	var err error
	if id == "" {
		err = ErrNoID
	} else {
		var applied bool
		applied, err = outbox.Receive(ctx, ib, b, consumer, id, fn)
		if err == nil {
			return Result{Verdict: Ack, Applied: applied, Repeat: !applied}
		}
	}
	var dl *outbox.DeadLetterError
	poison := errors.Is(err, ErrNoID) || errors.Is(err, outbox.ErrInvalidRecord) || errors.As(err, &dl)
	if !poison && (max <= 0 || attempt < max) {
		return Result{Verdict: Retry, Err: err}
	}
	if ctx.Err() != nil {
		return Result{Verdict: Retry, Err: err}
	}
	if derr := dead(ctx, err); derr != nil {
		return Result{Verdict: Retry, Err: fmt.Errorf("dead letter failed: %w (after: %w)", derr, err)}
	}
	return Result{Verdict: Dead, Err: err}
}
