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
	// ID is the message's stable id: use it as the idempotency key of the
	// side effect. It is the same on every attempt.
	ID ID
	// Topic, Key, Headers and Payload are as published (Key is "" when
	// none was set; Payload is nil when none was set).
	Topic   string
	Key     string
	Headers map[string]string
	Payload []byte
	// Attempt counts the claims of this message, this one included: 1 on
	// the first delivery. It also counts claims whose handler never finished
	// (a crash), so it can exceed the number of handler runs you observed.
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
// A panic is recovered and counts as an error. The context is cancelled
// when the relay shuts down and the grace period has passed, or when the
// lease is lost; a handler should return promptly then.
type Handler func(ctx context.Context, d Delivery) error

// BatchHandler handles several deliveries at once and returns one outcome
// per delivery, in the same order; each outcome means what a [Handler]'s
// return means (nil done, an error retry with backoff or dead after
// RelayConfig.MaxAttempts, [RetryAfter]/[RetryAt], [DeadLetter]). A result
// of another length, or a panic, counts as that error for every delivery
// of the batch. Register it with [Relay.HandleBatch]; a forwarder to a
// broker publishes a whole claim with one round trip this way. The relay
// never calls it with no delivery; it may call it with one.
type BatchHandler func(ctx context.Context, ds []Delivery) []error

// AllTopics, as the topic of [Relay.Handle] or [Relay.HandleBatch],
// registers the catch-all handler: the relay claims the messages of every
// topic, and gives those of topics that have no handler of their own to
// it (a topic's own handler wins). A message published with the topic
// "*" itself is handled by the catch-all.
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
	return r.Handle(topic, func(ctx context.Context, d Delivery) error {
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
	})
}
