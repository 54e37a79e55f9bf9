package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topology is what [DeclareTopology] declares: an exchange the forwarder
// publishes to (Config.Exchange), a queue bound to it that a consumer
// reads ([Consume]'s ConsumeConfig.Queue), and optionally a dead-letter
// exchange and queue for the messages the consumer rejects
// (ConsumeConfig.DeadLetterReject).
type Topology struct {
	// Exchange is the exchange's name. Required (the default exchange ""
	// cannot be declared).
	Exchange string
	// ExchangeKind is its type: "topic", "direct", "fanout", "headers" or
	// a plugin's. Defaults to "topic".
	ExchangeKind string

	// Queue is the queue's name. Required.
	Queue string
	// BindingKeys are the binding keys of the queue to the exchange (the
	// forwarder's routing key is the topic by default). Defaults to "#"
	// (every message of a topic exchange; for a direct exchange "#" is a
	// literal key, so name the keys).
	BindingKeys []string
	// Quorum declares the queues (the dead-letter queue too) as quorum
	// queues (x-queue-type: quorum): replicated, and counting deliveries
	// (x-delivery-count), which Consume's MaxAttempts reads. Defaults to
	// false: classic queues.
	Quorum bool

	// DeadLetterExchange, when set, is declared (of DeadLetterKind) and
	// set as the queue's x-dead-letter-exchange, where the broker puts
	// the messages rejected without requeue (Consume with
	// DeadLetterReject) with their routing key.
	DeadLetterExchange string
	// DeadLetterKind is the dead-letter exchange's type. Defaults to
	// "fanout": every dead letter, whatever its routing key, reaches the
	// queues bound to it.
	DeadLetterKind string
	// DeadLetterQueue, when set, is declared and bound to the dead-letter
	// exchange with the key "#" (which a fanout exchange ignores and a
	// topic exchange matches on every key). It requires
	// DeadLetterExchange.
	DeadLetterQueue string

	// Dial opens the connection. Defaults to amqp.DialConfig with
	// DefaultDialTimeout (10s), as Config.Dial.
	Dial func(url string) (*amqp.Connection, error)
}

// TopologyConflictError is [DeclareTopology]'s error when an exchange or
// queue exists with other properties or arguments than the ones
// declared: RabbitMQ refuses the declaration (406 PRECONDITION_FAILED, the
// wrapped *amqp.Error) rather than change them. Delete it (losing its
// messages) and declare again, or declare it as it is.
type TopologyConflictError struct {
	Kind string // "exchange" or "queue"
	Name string
	Err  *amqp.Error // the broker's refusal, which says what differs
}

func (e *TopologyConflictError) Error() string {
	return fmt.Sprintf("rabbitmq: %s %q exists with other properties or arguments, which RabbitMQ does not change on a declaration (delete it, or declare it as it is): %v", e.Kind, e.Name, e.Err)
}

func (e *TopologyConflictError) Unwrap() error { return e.Err }

// DeclareTopology declares t at url (an AMQP URI) on a connection of its
// own, closed before it returns: a durable exchange, a durable queue
// (with x-dead-letter-exchange and x-queue-type as t says) bound to it
// with t.BindingKeys, and the dead-letter exchange and queue when t names
// them, dead-letter ones first. Declaring what exists as declared changes
// nothing, so it may run at every start; what exists with other
// properties or arguments makes it return a *TopologyConflictError.
//
// ctx bounds the call (the dial is bounded by its own timeout);
// without a deadline DefaultConfirmTimeout (10s) does.
//
// It takes a URL rather than an *amqp.Channel because a refused
// declaration closes the channel it was made on: a channel of its own
// leaves the caller's intact.
func DeclareTopology(ctx context.Context, url string, t Topology) error {
	switch {
	case t.Exchange == "":
		return &ConfigError{Field: "Topology.Exchange", Reason: "is required (the default exchange cannot be declared)"}
	case t.Queue == "":
		return &ConfigError{Field: "Topology.Queue", Reason: "is required"}
	case t.DeadLetterQueue != "" && t.DeadLetterExchange == "":
		return &ConfigError{Field: "Topology.DeadLetterQueue", Reason: "requires DeadLetterExchange"}
	case url == "":
		return &ConfigError{Field: "url", Reason: "must not be empty"}
	}
	if _, err := amqp.ParseURI(url); err != nil {
		return &ConfigError{Field: "url", Reason: err.Error()}
	}
	if t.ExchangeKind == "" {
		t.ExchangeKind = amqp.ExchangeTopic
	}
	if len(t.BindingKeys) == 0 {
		t.BindingKeys = []string{"#"}
	}
	if t.DeadLetterKind == "" {
		t.DeadLetterKind = amqp.ExchangeFanout
	}
	if t.Dial == nil {
		t.Dial = defaultDial
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultConfirmTimeout)
		defer cancel()
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rabbitmq: declare topology: %w", err)
	}
	conn, err := t.Dial(url)
	if err != nil {
		return fmt.Errorf("rabbitmq: declare topology: connect: %w", err)
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
	// amqp091 awaits the broker's answers without a timeout: closing the
	// connection when ctx ends ends the wait.
	stop := context.AfterFunc(ctx, func() { _ = conn.CloseDeadline(time.Now()) })
	defer stop()
	err = declare(conn, t)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("rabbitmq: declare topology: %w", ctx.Err())
	}
	return err
}

// declare declares t on a channel of conn.
func declare(conn *amqp.Connection, t Topology) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: declare topology: open channel: %w", err)
	}
	queueArgs := func() amqp.Table {
		if t.Quorum {
			return amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
		}
		return nil
	}
	exchange := func(name, kind string) error {
		return refusal("exchange", name, ch.ExchangeDeclare(name, kind, true, false, false, false, nil))
	}
	queue := func(name string, args amqp.Table) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, args)
		return refusal("queue", name, err)
	}
	bind := func(queue, key, exchange string) error {
		if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: bind queue %q to exchange %q with key %q: %w", queue, exchange, key, err)
		}
		return nil
	}
	args := queueArgs()
	if t.DeadLetterExchange != "" {
		if err := exchange(t.DeadLetterExchange, t.DeadLetterKind); err != nil {
			return err
		}
		if t.DeadLetterQueue != "" {
			if err := queue(t.DeadLetterQueue, queueArgs()); err != nil {
				return err
			}
			if err := bind(t.DeadLetterQueue, "#", t.DeadLetterExchange); err != nil {
				return err
			}
		}
		if args == nil {
			args = amqp.Table{}
		}
		args["x-dead-letter-exchange"] = t.DeadLetterExchange
	}
	if err := exchange(t.Exchange, t.ExchangeKind); err != nil {
		return err
	}
	if err := queue(t.Queue, args); err != nil {
		return err
	}
	for _, key := range t.BindingKeys {
		if err := bind(t.Queue, key, t.Exchange); err != nil {
			return err
		}
	}
	return ch.Close()
}

// refusal wraps the error of declaring kind name: a *TopologyConflictError
// for the broker's 406 PRECONDITION_FAILED.
func refusal(kind, name string, err error) error {
	if err == nil {
		return nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		return &TopologyConflictError{Kind: kind, Name: name, Err: ae}
	}
	return fmt.Errorf("rabbitmq: declare %s %q: %w", kind, name, err)
}
