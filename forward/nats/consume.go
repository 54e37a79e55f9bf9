package natsfwd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncommit/oncommit/internal/receive"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// DeadReasonHeader is the header of a dead-lettered message (see
// ConsumeConfig.DeadLetterSubject) that says why it was dead-lettered.
const DeadReasonHeader = "Oncommit-Dead-Reason"

// ConsumeConfig configures [Consume].
type ConsumeConfig struct {
	// Name is the consumer's name in the inbox: two consumers of the same
	// messages with different names each apply every message once.
	// Required.
	Name string

	// MaxAttempts is how many deliveries of a message may fail before it
	// is dead-lettered (JetStream's NumDelivered counts them, across
	// processes). Defaults to 5; negative means never.
	MaxAttempts int

	// RetryDelay is how long JetStream waits before it delivers a failed
	// message again (a Nak with this delay). Defaults to one second.
	RetryDelay time.Duration

	// DeadLetterSubject, when set, is where a message that failed
	// MaxAttempts times, or has no Nats-Msg-Id, is published (its data and
	// headers, with DeadReasonHeader added and Nats-Msg-Id suffixed with
	// "/dead") before it is terminated, through JetStream (required with
	// it). Give it a stream of its own.
	DeadLetterSubject string
	JetStream         jetstream.JetStream

	// DeadLetter, when set, is called instead with such a message and
	// why it failed; it may write the message to a table. When it (or the
	// publish to DeadLetterSubject) fails, the message is not terminated
	// but delivered again. One of DeadLetter and DeadLetterSubject is
	// required: a poison message is never dropped without a trace.
	DeadLetter func(ctx context.Context, m jetstream.Msg, reason error) error

	// OnOutcome, when set, is called after each delivery with what
	// Consume did (for metrics and tests).
	OnOutcome func(Outcome)

	// Logger receives a line per failed delivery and per dead letter.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// Outcome is what [Consume] did with one delivery.
type Outcome struct {
	ID      string // the Nats-Msg-Id; "" when the message had none
	Subject string
	Attempt int // JetStream's NumDelivered: 1 on the first delivery
	// Applied: fn ran and its transaction committed; acknowledged.
	Applied bool
	// Repeat: the inbox had the id (applied before); acknowledged
	// without calling fn.
	Repeat bool
	// Dead: dead-lettered, then terminated.
	Dead bool
	// Err is why the message was not applied (to be delivered again, or
	// dead), or why its dead letter failed.
	Err error
}

// Consume applies the messages of c, a JetStream consumer with explicit
// acknowledgements, once each, until ctx ends (returning nil) or c's
// messages can no longer be read: the consumer was deleted, or the
// connection closed for good (returning the error). For each message it
// begins a transaction with b, records the message's Nats-Msg-Id (the
// outbox id our forwarder sets) in ib under cfg.Name, calls fn with the
// transaction for a new id, commits, and only then acknowledges. A repeat
// is acknowledged without calling fn. When fn or the commit fails the
// message is not acknowledged (a Nak with cfg.RetryDelay), and JetStream
// delivers it again; after cfg.MaxAttempts deliveries it is dead-lettered
// and terminated.
//
// Messages are applied one at a time; run Consume in several goroutines
// (or processes) on the same consumer for more. A message whose
// acknowledgement was lost (a dropped connection, AckWait passed) is
// delivered again and found a repeat.
func Consume[T any](ctx context.Context, c jetstream.Consumer, ib *outbox.Inbox, b outboxdriver.Beginner[T], cfg ConsumeConfig, fn func(ctx context.Context, tx T, m jetstream.Msg) error) error {
	if cfg.Name == "" {
		return &ConfigError{Field: "Name", Reason: "is required: the consumer's name in the inbox"}
	}
	if cfg.DeadLetter == nil && cfg.DeadLetterSubject == "" {
		return &ConfigError{Field: "DeadLetter", Reason: "or DeadLetterSubject is required: where a poison message goes"}
	}
	if cfg.DeadLetter == nil && cfg.JetStream == nil {
		return &ConfigError{Field: "JetStream", Reason: "is required with DeadLetterSubject: it publishes the dead letters"}
	}
	if ib == nil || c == nil {
		return &ConfigError{Field: "Inbox", Reason: "and the consumer must not be nil"}
	}
	receive.Defaults(&cfg.MaxAttempts, &cfg.RetryDelay, &cfg.Logger)
	it, err := c.Messages()
	if err != nil {
		return fmt.Errorf("natsfwd: consume: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
				errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, nats.ErrConnectionClosed) {
				return fmt.Errorf("natsfwd: consume: %w", err)
			}
			// A missed heartbeat or a reconnect: the iterator goes on.
			cfg.Logger.Warn("natsfwd: consume: receive", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		consumeOne(ctx, ib, b, &cfg, m, fn)
	}
}

// consumeOne applies m and tells JetStream the verdict.
func consumeOne[T any](ctx context.Context, ib *outbox.Inbox, b outboxdriver.Beginner[T], cfg *ConsumeConfig, m jetstream.Msg, fn func(ctx context.Context, tx T, m jetstream.Msg) error) {
	attempt := 1
	if md, err := m.Metadata(); err == nil {
		attempt = int(md.NumDelivered)
	}
	id := m.Headers().Get(jetstream.MsgIDHeader)
	r := receive.Apply(ctx, ib, b, cfg.Name, id, attempt, cfg.MaxAttempts,
		func(ctx context.Context, tx T) error { return fn(ctx, tx, m) },
		func(ctx context.Context, reason error) error { return deadLetter(ctx, cfg, m, id, reason) })
	var err error
	switch r.Verdict {
	case receive.Ack:
		err = m.Ack()
	case receive.Dead:
		cfg.Logger.Warn("natsfwd: consume: dead-lettered", "subject", m.Subject(), "id", id, "attempt", attempt, "reason", r.Err)
		err = m.TermWithReason("dead-lettered")
	default:
		cfg.Logger.Info("natsfwd: consume: will retry", "subject", m.Subject(), "id", id, "attempt", attempt, "err", r.Err)
		err = m.NakWithDelay(cfg.RetryDelay)
	}
	if err != nil && ctx.Err() == nil {
		// Redelivered after AckWait; the inbox finds an applied one a repeat.
		cfg.Logger.Warn("natsfwd: consume: acknowledge", "id", id, "verdict", r.Verdict.String(), "err", err)
	}
	if cfg.OnOutcome != nil {
		cfg.OnOutcome(Outcome{ID: id, Subject: m.Subject(), Attempt: attempt, Applied: r.Applied, Repeat: r.Repeat, Dead: r.Verdict == receive.Dead, Err: r.Err})
	}
}

func deadLetter(ctx context.Context, cfg *ConsumeConfig, m jetstream.Msg, id string, reason error) error {
	if cfg.DeadLetter != nil {
		return cfg.DeadLetter(ctx, m, reason)
	}
	h := nats.Header{}
	for k, v := range m.Headers() {
		h[k] = append([]string(nil), v...)
	}
	h.Set(DeadReasonHeader, reason.Error())
	if id != "" {
		h.Set(jetstream.MsgIDHeader, id+"/dead")
	}
	msg := &nats.Msg{Subject: cfg.DeadLetterSubject, Data: m.Data(), Header: h}
	_, err := cfg.JetStream.PublishMsg(ctx, msg)
	return err
}
