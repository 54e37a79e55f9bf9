// Package natsfwd forwards outbox messages to NATS JetStream: a relay
// handler that publishes each delivery with the outbox id as its
// Nats-Msg-Id, so that JetStream drops a redelivery as a duplicate, and
// that reports a message done only once JetStream has acknowledged it
// (stored it in a stream).
//
// The guarantee end to end: every committed message reaches the stream at
// least once, and exactly once as long as every redelivery of it comes
// within the stream's duplicate window (StreamConfig.Duplicates). A
// redelivery comes at the latest after the relay's lease (a relay died
// after the ack, before the outcome was written) plus its longest backoff
// (the ack was lost, the message retried): keep the window longer than
// RelayConfig.Lease + RelayConfig.RetryCap, or a redelivery after the
// window is stored a second time. [Forwarder.Check] warns when it is
// shorter.
//
// The package is named natsfwd, not nats, because every program that uses
// it also imports nats.go's package nats (for nats.Connect).
//
// It lives in a module of its own (github.com/oncommit/oncommit/forward/nats),
// so that a service that does not import it gets no NATS module.
// docs/forwarding.md has the whole story: configuration, failure modes,
// ordering.
package natsfwd
