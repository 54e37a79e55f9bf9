package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Delivery is one attempt at delivering a message, as a handler sees it.
type Delivery struct {
	// ID is the message's id, the same on every attempt: the side
	// effect's idempotency key. Each subscriber's copy of a message (see
	// Config.Subscribers) has an id of its own.
	ID ID
	// Subscriber is the subscriber this copy is for, "" for a message of a
	// topic without subscribers.
	Subscriber string
	// Topic, Key, Headers and Payload are as published.
	Topic   string
	Key     string
	Headers map[string]string
	Payload []byte
	// Attempt counts the claims of this message, this one and crashed ones
	// included: 1 on the first delivery.
	Attempt int
	// CreatedAt is when the message was published, on the database clock.
	CreatedAt time.Time
}

// Handler handles the messages of one topic. Its return value decides what
// happens to the message:
//
//   - nil: done; the message is deleted (or marked delivered).
//   - an error: retry after the backoff, or dead-letter once the message has
//     had RelayConfig.MaxAttempts attempts.
//   - [RetryAfter] or [RetryAt]: retry at that time (still an attempt).
//   - [DeadLetter]: dead-letter now, with the reason.
//
// A panic counts as an error. The context is cancelled when the lease is
// lost or the shutdown grace ends.
type Handler func(ctx context.Context, d Delivery) error

// BatchHandler handles one or more deliveries at once and returns one
// outcome per delivery, in order, each meaning what a [Handler]'s return
// means. A result of another length, or a panic, is an error for every
// delivery. Register it with [Relay.HandleBatch].
type BatchHandler func(ctx context.Context, ds []Delivery) []error

// AllTopics, as the topic of [Relay.Handle] or [Relay.HandleBatch],
// registers the catch-all: it handles every topic without a handler of its
// own.
const AllTopics = "*"

// RetryError asks for a retry at a given time. Build it with [RetryAfter] or
// [RetryAt].
type RetryError struct {
	After  time.Duration // delay from now on the database clock, when At is zero
	At     time.Time     // absolute time, when set
	Reason error         // optional, recorded as the message's last error
}

func (e *RetryError) Error() string {
	if e.Reason != nil {
		return "retry requested: " + e.Reason.Error()
	}
	return "retry requested"
}

// Unwrap returns the reason.
func (e *RetryError) Unwrap() error { return e.Reason }

// RetryAfter returns an error that reschedules the message d from now (on
// the database clock), with reason recorded (reason may be nil).
func RetryAfter(d time.Duration, reason error) error {
	if d < 0 {
		d = 0
	}
	return &RetryError{After: d, Reason: reason}
}

// RetryAt returns an error that reschedules the message at t.
func RetryAt(t time.Time, reason error) error { return &RetryError{At: t, Reason: reason} }

// DeadLetterError dead-letters a message at once. Build it with
// [DeadLetter].
type DeadLetterError struct {
	Reason error
}

func (e *DeadLetterError) Error() string {
	if e.Reason == nil {
		return "dead-lettered"
	}
	return "dead-lettered: " + e.Reason.Error()
}

// Unwrap returns the reason.
func (e *DeadLetterError) Unwrap() error { return e.Reason }

// DeadLetter returns an error that dead-letters the message at once,
// without further retries, recording reason. Use it when retrying cannot
// help (a payload the handler can never process, say).
func DeadLetter(reason error) error { return &DeadLetterError{Reason: reason} }

// Validator is implemented by payload types that check themselves after
// decoding; see [HandleJSON].
type Validator interface {
	Validate() error
}

// HandleJSON registers on r, for topic, a handler that decodes the JSON
// payload into a T (unknown fields are allowed) and, if T implements
// [Validator], validates it. A payload that is missing, fails to decode or
// fails validation dead-letters the message at once: retrying cannot help.
func HandleJSON[T any](r *Relay, topic string, h func(ctx context.Context, d Delivery, v T) error) error {
	return r.Handle(topic, jsonHandler(h))
}

// SubscribeJSON is [HandleJSON] for subscriber's copies of topic's
// messages (see [Relay.Subscribe]).
func SubscribeJSON[T any](r *Relay, topic, subscriber string, h func(ctx context.Context, d Delivery, v T) error) error {
	return r.Subscribe(topic, subscriber, jsonHandler(h))
}

// jsonHandler decodes and validates a delivery's payload into a T for h;
// a payload that does not decode or validate is dead-lettered.
func jsonHandler[T any](h func(ctx context.Context, d Delivery, v T) error) Handler {
	return func(ctx context.Context, d Delivery) error {
		var v T
		if d.Payload == nil {
			return DeadLetter(errors.New("invalid payload: message has no payload"))
		}
		if err := json.Unmarshal(d.Payload, &v); err != nil {
			return DeadLetter(fmt.Errorf("invalid payload: %w", err))
		}
		if val, ok := any(&v).(Validator); ok {
			if err := val.Validate(); err != nil {
				return DeadLetter(fmt.Errorf("invalid payload: %w", err))
			}
		} else if val, ok := any(v).(Validator); ok {
			if err := val.Validate(); err != nil {
				return DeadLetter(fmt.Errorf("invalid payload: %w", err))
			}
		}
		return h(ctx, d, v)
	}
}
