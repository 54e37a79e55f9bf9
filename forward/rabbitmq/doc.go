// Package rabbitmq forwards outbox messages to RabbitMQ: a relay handler
// that publishes each delivery persistent, mandatory, with the outbox id
// as its message-id, on a channel in confirm mode, and that reports a
// message done only once the broker confirmed it and did not return it as
// unroutable.
//
// The guarantee end to end is at-least-once into the broker: RabbitMQ
// does not deduplicate, so a relay that dies after the broker's confirm
// and before it wrote the outcome publishes the message again, with the
// same message-id. Consumers deduplicate on the message-id (a processed-ids
// table written in the consumer's own transaction, or an idempotent
// effect); docs/forwarding.md shows how. [Consume] is such a consumer: it
// applies each message once through an outbox.Inbox, and dead-letters a
// message that keeps failing.
//
// Every message carries an envelope: its id, topic, source, creation time,
// content type and key as AMQP properties and headers, in plain mode or,
// with Config.CloudEvents, as CloudEvents in binary content mode (see
// Config.CloudEvents for the mapping). [DeclareTopology] declares an
// exchange, a queue bound to it and a dead-letter exchange and queue, the
// same way at every start.
//
// It lives in a module of its own (github.com/oncommit/oncommit/forward/rabbitmq),
// so that a service that does not import it gets no AMQP module.
package rabbitmq
