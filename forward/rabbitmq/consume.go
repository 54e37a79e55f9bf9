package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncommit/oncommit/internal/receive"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// DeadReasonHeader is the header of a dead-lettered message (see
// ConsumeConfig.DeadLetterExchange) that says why it was dead-lettered.
const DeadReasonHeader = "Oncommit-Dead-Reason"

// DefaultPrefetch is ConsumeConfig.Prefetch when it is zero.
const DefaultPrefetch = 16

// Re-dial backoff of [Consume] after a lost or refused connection.
const (
	redialMin = 100 * time.Millisecond
	redialMax = 2 * time.Second
)

// maxTracked bounds the message ids whose failures Consume counts in
// memory (queues without x-delivery-count); past it the counts restart.
const maxTracked = 10000

// ConsumeConfig configures [Consume].
type ConsumeConfig struct {
	// Name is the consumer's name in the inbox: two consumers of the same
	// messages with different names each apply every message once.
	// Required.
	Name string

	// Queue is the queue consumed. Required; Consume does not declare it.
	Queue string

	// MaxAttempts is how many deliveries of a message may fail before it
	// is dead-lettered. Defaults to 5; negative means never. A quorum
	// queue counts deliveries across processes (the x-delivery-count
	// header); a classic queue gives no count, and Consume counts the
	// failures of each message in memory, in this process only: a message
	// that fails in turn in several processes (or after restarts) may be
	// delivered more often. Keep it below a quorum queue's delivery-limit,
	// or the broker drops the message first.
	MaxAttempts int

	// RetryDelay is how long Consume waits after a failed delivery before
	// it gives the message back to the queue (a Nack with requeue), which
	// delivers it again at once. Consume applies nothing meanwhile.
	// Defaults to one second.
	RetryDelay time.Duration

	// Prefetch is the most unacknowledged deliveries the broker sends
	// this consumer ahead (basic.qos). Defaults to DefaultPrefetch (16).
	// Messages are applied one at a time: a larger prefetch holds more
	// messages back from other consumers, and after a lost connection
	// the broker delivers all of them again.
	Prefetch int

	// DeadLetter, when set, is called with a message that failed
	// MaxAttempts times, or has no message-id, and why it failed; it may
	// write the message to a table. The message is then acknowledged.
	DeadLetter func(ctx context.Context, d amqp.Delivery, reason error) error

	// DeadLetterExchange and DeadLetterRoutingKey, when either is set,
	// are where such a message is published instead (its body,
	// properties and headers but CC, BCC and x- names, with
	// DeadReasonHeader added and message-id suffixed with "/dead";
	// persistent, mandatory, confirmed) before it is acknowledged. The
	// exchange "" is the default one, which routes to the queue named by
	// the routing key.
	DeadLetterExchange   string
	DeadLetterRoutingKey string

	// DeadLetterReject rejects such a message instead (a Nack without
	// requeue), so that the broker dead-letters it to the queue's own
	// dead-letter exchange. The queue must be declared with
	// x-dead-letter-exchange (an argument or a policy): without one the
	// broker drops the message. The reason is only logged; the broker
	// adds its x-death header.
	DeadLetterReject bool

	// Exactly one of DeadLetter, DeadLetterExchange/RoutingKey and
	// DeadLetterReject is required: a poison message is never dropped
	// without a trace. When the dead letter fails, the message is not
	// acknowledged but delivered again.

	// ConfirmTimeout bounds opening a channel and consuming (a stalled
	// connection is closed after it, and dialled again), and the wait for
	// a dead letter's confirm. Defaults to DefaultConfirmTimeout (10s).
	ConfirmTimeout time.Duration

	// Dial opens a connection to the URL. Defaults to amqp.DialConfig
	// with DefaultDialTimeout (10s) and 10s heartbeats, as Config.Dial.
	Dial func(url string) (*amqp.Connection, error)

	// OnOutcome, when set, is called after each delivery with what
	// Consume did (for metrics and tests).
	OnOutcome func(Outcome)

	// Logger receives a line per failed delivery, per dead letter and per
	// lost connection. Defaults to slog.Default().
	Logger *slog.Logger
}

// Outcome is what [Consume] did with one delivery.
type Outcome struct {
	ID         string // the message-id; "" when the message had none
	RoutingKey string
	// Attempt is the delivery's number: 1 on the first (see
	// ConsumeConfig.MaxAttempts for how it is counted).
	Attempt int
	// Redelivered is the broker's flag: the message was delivered before
	// (to this consumer or another) and not acknowledged.
	Redelivered bool
	// Applied: fn ran and its transaction committed; acknowledged.
	Applied bool
	// Repeat: the inbox had the id (applied before); acknowledged
	// without calling fn.
	Repeat bool
	// Dead: dead-lettered, then acknowledged (or rejected, with
	// DeadLetterReject).
	Dead bool
	// Err is why the message was not applied (to be delivered again, or
	// dead), or why its dead letter failed.
	Err error
}

// Consume applies the messages of cfg.Queue at url (an AMQP URI) once
// each, until ctx ends (returning nil) or the broker refuses the queue
// (404 NOT_FOUND, 403 ACCESS_REFUSED: returning the error). For each
// delivery it begins a transaction with b, records the message-id (the
// outbox id our forwarder sets) in ib under cfg.Name, calls fn with the
// transaction for a new id, commits, and only then acknowledges. A repeat
// is acknowledged without calling fn. When fn or the commit fails the
// message is given back to the queue after cfg.RetryDelay and delivered
// again; after cfg.MaxAttempts deliveries it is dead-lettered and
// acknowledged.
//
// Consume dials the connection itself and dials again (with a short
// backoff) whenever it is lost: closed, cut, or given up by the heartbeats
// or ConfirmTimeout. The broker then delivers again every message that
// was not acknowledged, and the inbox finds those applied a repeat.
//
// Messages are applied one at a time; run Consume in several goroutines
// (or processes) on the same queue for more.
func Consume[T any](ctx context.Context, url string, ib *outbox.Inbox, b outboxdriver.Beginner[T], cfg ConsumeConfig, fn func(ctx context.Context, tx T, d amqp.Delivery) error) error {
	if err := checkConsume(url, ib, b, &cfg, fn); err != nil {
		return err
	}
	c := &consumer[T]{url: url, ib: ib, b: b, cfg: cfg, fn: fn, failures: map[string]int{}}
	return c.run(ctx)
}

// checkConsume refuses an invalid call and fills cfg's defaults.
func checkConsume[T any](url string, ib *outbox.Inbox, b outboxdriver.Beginner[T], cfg *ConsumeConfig, fn func(context.Context, T, amqp.Delivery) error) error {
	dead := 0
	for _, set := range []bool{cfg.DeadLetter != nil, cfg.DeadLetterExchange != "" || cfg.DeadLetterRoutingKey != "", cfg.DeadLetterReject} {
		if set {
			dead++
		}
	}
	switch {
	case cfg.Name == "":
		return &ConfigError{Field: "Name", Reason: "is required: the consumer's name in the inbox"}
	case cfg.Queue == "":
		return &ConfigError{Field: "Queue", Reason: "is required"}
	case dead == 0:
		return &ConfigError{Field: "DeadLetter", Reason: "or DeadLetterExchange/RoutingKey or DeadLetterReject is required: where a poison message goes"}
	case dead > 1:
		return &ConfigError{Field: "DeadLetter", Reason: "conflicts: set only one of DeadLetter, DeadLetterExchange/RoutingKey and DeadLetterReject"}
	case cfg.RetryDelay < 0:
		return &ConfigError{Field: "RetryDelay", Reason: "must not be negative"}
	case cfg.Prefetch < 0:
		return &ConfigError{Field: "Prefetch", Reason: "must not be negative"}
	case cfg.ConfirmTimeout < 0:
		return &ConfigError{Field: "ConfirmTimeout", Reason: "must not be negative"}
	case url == "":
		return &ConfigError{Field: "url", Reason: "must not be empty"}
	case ib == nil || any(b) == nil || fn == nil:
		return &ConfigError{Field: "Inbox", Reason: "must not be nil (nor the Beginner, nor fn)"}
	}
	if _, err := amqp.ParseURI(url); err != nil {
		return &ConfigError{Field: "url", Reason: err.Error()}
	}
	receive.Defaults(&cfg.MaxAttempts, &cfg.RetryDelay, &cfg.Logger)
	if cfg.Prefetch == 0 {
		cfg.Prefetch = DefaultPrefetch
	}
	if cfg.ConfirmTimeout == 0 {
		cfg.ConfirmTimeout = DefaultConfirmTimeout
	}
	if cfg.Dial == nil {
		cfg.Dial = defaultDial
	}
	return nil
}

// consumer is one Consume call's state.
type consumer[T any] struct {
	url      string
	ib       *outbox.Inbox
	b        outboxdriver.Beginner[T]
	cfg      ConsumeConfig
	fn       func(ctx context.Context, tx T, d amqp.Delivery) error
	failures map[string]int // failed deliveries per id, without x-delivery-count
}

// session is one connection with its consuming channel, and the channel
// publishing dead letters (opened when the first is needed).
type session struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	closed     chan *amqp.Error
	pub        *amqp.Channel
	returns    chan amqp.Return
}

func (c *consumer[T]) run(ctx context.Context) error {
	wait := redialMin
	for dials := 0; ; dials++ {
		if ctx.Err() != nil {
			return nil
		}
		s, err := c.open(ctx)
		if err != nil {
			if refused(err) {
				return fmt.Errorf("rabbitmq: consume %q: %w", c.cfg.Queue, err)
			}
			if ctx.Err() != nil {
				return nil
			}
			c.cfg.Logger.Warn("rabbitmq: consume: connect", "queue", c.cfg.Queue, "err", err, "retry_in", wait)
			if !sleep(ctx, wait) {
				return nil
			}
			wait = min(2*wait, redialMax)
			continue
		}
		if dials > 0 {
			c.cfg.Logger.Info("rabbitmq: consume: reconnected", "queue", c.cfg.Queue)
		}
		wait = redialMin
		err = c.serve(ctx, s)
		// Closing the connection gives the unacknowledged deliveries back.
		_ = s.conn.CloseDeadline(time.Now().Add(c.cfg.ConfirmTimeout))
		if ctx.Err() != nil {
			return nil
		}
		c.cfg.Logger.Warn("rabbitmq: consume: connection lost", "queue", c.cfg.Queue, "err", err)
	}
}

// refused reports a broker's refusal of the queue, which no re-dial mends.
func refused(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Server && (ae.Code == amqp.NotFound || ae.Code == amqp.AccessRefused)
}

// sleep waits d, or returns false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// open dials and starts consuming.
func (c *consumer[T]) open(ctx context.Context) (*session, error) {
	conn, err := c.cfg.Dial(c.url)
	if err != nil {
		return nil, err
	}
	s := &session{conn: conn}
	err = bounded(ctx, conn, c.cfg.ConfirmTimeout, func() error {
		var err error
		if s.ch, err = conn.Channel(); err != nil {
			return err
		}
		s.closed = s.ch.NotifyClose(make(chan *amqp.Error, 1))
		if err := s.ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
			return err
		}
		s.deliveries, err = s.ch.Consume(c.cfg.Queue, "", false, false, false, false, nil)
		return err
	})
	if err != nil {
		_ = conn.CloseDeadline(time.Now())
		return nil, err
	}
	return s, nil
}

// bounded runs fn on conn, and closes conn when fn has not returned within
// d or ctx ends first: amqp091 awaits the broker's answers without a
// timeout, and a stalled connection never sends them.
func bounded(ctx context.Context, conn *amqp.Connection, d time.Duration, fn func() error) error {
	timer := time.AfterFunc(d, func() { _ = conn.CloseDeadline(time.Now()) })
	stop := context.AfterFunc(ctx, func() { _ = conn.CloseDeadline(time.Now()) })
	err := fn()
	stop()
	if !timer.Stop() {
		return fmt.Errorf("no answer within %v: %w", d, ErrConfirmTimeout)
	}
	return err
}

// serve applies s's deliveries until ctx ends or s is lost.
func (c *consumer[T]) serve(ctx context.Context, s *session) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-s.closed:
			if err == nil {
				return amqp.ErrClosed
			}
			return err
		case d, ok := <-s.deliveries:
			if !ok {
				return errors.New("deliveries ended (connection lost, or the consumer cancelled)")
			}
			if ctx.Err() != nil {
				return ctx.Err() // d goes back with the connection
			}
			c.handle(ctx, s, d)
		}
	}
}

// handle applies d and tells the broker the verdict.
func (c *consumer[T]) handle(ctx context.Context, s *session, d amqp.Delivery) {
	if s.ch.IsClosed() {
		return // the broker took it back with the channel
	}
	id := d.MessageId
	attempt, counted := c.attempt(d)
	r := receive.Apply(ctx, c.ib, c.b, c.cfg.Name, id, attempt, c.cfg.MaxAttempts,
		func(ctx context.Context, tx T) error { return c.fn(ctx, tx, d) },
		func(ctx context.Context, reason error) error { return c.deadLetter(ctx, s, d, reason) })
	var err error
	switch r.Verdict {
	case receive.Ack:
		delete(c.failures, id)
		err = d.Ack(false)
	case receive.Dead:
		delete(c.failures, id)
		c.cfg.Logger.Warn("rabbitmq: consume: dead-lettered", "queue", c.cfg.Queue, "id", id, "attempt", attempt, "reason", r.Err)
		if c.cfg.DeadLetterReject {
			err = d.Nack(false, false)
		} else {
			err = d.Ack(false)
		}
	default:
		if !counted && id != "" {
			if len(c.failures) >= maxTracked {
				clear(c.failures)
			}
			c.failures[id]++
		}
		c.cfg.Logger.Info("rabbitmq: consume: will retry", "queue", c.cfg.Queue, "id", id, "attempt", attempt, "err", r.Err)
		sleep(ctx, c.cfg.RetryDelay)
		err = d.Nack(false, true)
	}
	if err != nil && ctx.Err() == nil {
		// The broker delivers it again; the inbox finds an applied one a repeat.
		c.cfg.Logger.Warn("rabbitmq: consume: acknowledge", "queue", c.cfg.Queue, "id", id, "verdict", r.Verdict.String(), "err", err)
	}
	if c.cfg.OnOutcome != nil {
		c.cfg.OnOutcome(Outcome{ID: id, RoutingKey: d.RoutingKey, Attempt: attempt, Redelivered: d.Redelivered,
			Applied: r.Applied, Repeat: r.Repeat, Dead: r.Verdict == receive.Dead, Err: r.Err})
	}
}

// attempt returns d's delivery number: from x-delivery-count (a quorum
// queue's count of earlier deliveries, absent on the first), counted is
// true; else from this process's count of d's failures.
func (c *consumer[T]) attempt(d amqp.Delivery) (n int, counted bool) {
	switch v := d.Headers["x-delivery-count"].(type) {
	case int64:
		return int(v) + 1, true
	case int32:
		return int(v) + 1, true
	case int16:
		return int(v) + 1, true
	case int8:
		return int(v) + 1, true
	case int:
		return v + 1, true
	case uint64:
		return int(v) + 1, true
	case uint32:
		return int(v) + 1, true
	case uint16:
		return int(v) + 1, true
	case uint8:
		return int(v) + 1, true
	}
	return c.failures[d.MessageId] + 1, false
}

// deadLetter hands d to the configured dead letter.
func (c *consumer[T]) deadLetter(ctx context.Context, s *session, d amqp.Delivery, reason error) error {
	switch {
	case c.cfg.DeadLetter != nil:
		return c.cfg.DeadLetter(ctx, d, reason)
	case c.cfg.DeadLetterReject:
		return nil // the broker dead-letters it on the reject
	}
	h := amqp.Table{}
	for k, v := range d.Headers {
		if !reserved(k) {
			h[k] = v
		}
	}
	h[DeadReasonHeader] = reason.Error()
	id := d.MessageId
	if id != "" {
		id += "/dead"
	}
	msg := amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		MessageId:       id,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
	return c.publishDead(ctx, s, msg)
}

// publishDead publishes msg to the dead-letter exchange, mandatory, and
// waits for its confirm.
func (c *consumer[T]) publishDead(ctx context.Context, s *session, msg amqp.Publishing) error {
	ex, key := c.cfg.DeadLetterExchange, c.cfg.DeadLetterRoutingKey
	if s.pub == nil || s.pub.IsClosed() {
		err := bounded(ctx, s.conn, c.cfg.ConfirmTimeout, func() error {
			ch, err := s.conn.Channel()
			if err != nil {
				return err
			}
			if err := ch.Confirm(false); err != nil {
				_ = ch.Close()
				return err
			}
			s.pub, s.returns = ch, ch.NotifyReturn(make(chan amqp.Return, 1))
			return nil
		})
		if err != nil {
			return fmt.Errorf("rabbitmq: dead letter: open channel: %w", err)
		}
	}
	dc, err := s.pub.PublishWithDeferredConfirm(ex, key, true, false, msg)
	if err != nil {
		return fmt.Errorf("rabbitmq: dead letter to exchange %q, routing key %q: %w", ex, key, err)
	}
	timer := time.NewTimer(c.cfg.ConfirmTimeout)
	defer timer.Stop()
	var ret *amqp.Return
	for done := false; !done; {
		select {
		case r, ok := <-s.returns:
			if !ok {
				s.returns = nil
			} else if r.MessageId == msg.MessageId {
				ret = &r
			}
		case <-dc.Done():
			done = true
		case <-timer.C:
			return fmt.Errorf("rabbitmq: dead letter to exchange %q, routing key %q: %w", ex, key, ErrConfirmTimeout)
		case <-ctx.Done():
			return fmt.Errorf("rabbitmq: dead letter to exchange %q, routing key %q: %w", ex, key, ctx.Err())
		}
	}
	// A return comes before the confirm of the same message.
	select {
	case r, ok := <-s.returns:
		if ok && r.MessageId == msg.MessageId {
			ret = &r
		}
	default:
	}
	if ret != nil {
		return &UnroutableError{Exchange: ret.Exchange, RoutingKey: ret.RoutingKey, Code: ret.ReplyCode, Text: ret.ReplyText}
	}
	if !dc.Acked() {
		return fmt.Errorf("rabbitmq: dead letter to exchange %q, routing key %q: %w", ex, key, ErrNacked)
	}
	return nil
}
