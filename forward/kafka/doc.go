// Package kafka forwards outbox messages to Kafka: a batch handler for an
// oncommit relay ([github.com/oncommit/oncommit/outbox.Relay.HandleBatch])
// that produces each claim's messages with one franz-go client
// ([github.com/twmb/franz-go/pkg/kgo]), awaits every acknowledgement, and
// returns one outcome per message. A message is settled done only once
// Kafka has acknowledged its record (acks=all, idempotent producer); a
// produce error, or no acknowledgement within Config.AckTimeout
// ([ErrAckTimeout]), is an outcome error, retried with the relay's backoff
// and dead-lettered after its MaxAttempts.
//
// Delivery into Kafka is at least once: a relay that dies after Kafka
// acknowledged a record and before the outcome was written produces the
// record again after the lease, with the same oncommit-id header (the
// outbox message id). Consumers deduplicate by that header. Kafka's
// idempotent producer dedups only the client's own retries within one
// producer session, not a second relay's produce of the same message.
//
// Each record's key is the message's Key (no key when it has none), so
// the default partitioner keeps a key's messages in one partition; its
// value is the payload; its headers the envelope, then the message's
// headers sorted by name. The envelope has two modes (Config.CloudEvents
// has the full mapping):
//
//   - plain (the default): oncommit-id and id (the message id),
//     content-type (application/json, when there is a payload),
//     oncommit-type (the outbox topic), oncommit-source (Config.Source,
//     "oncommit" by default) and oncommit-created-at (the message's
//     CreatedAt, RFC 3339 in UTC);
//   - CloudEvents (Config.CloudEvents): a CloudEvent in binary content
//     mode as the CloudEvents Kafka protocol binding maps it: ce_id,
//     ce_source, ce_specversion (1.0), ce_type, ce_time, ce_partitionkey
//     (the key, for a keyed message) and content-type (the
//     datacontenttype), with oncommit-id kept (equal to ce_id).
//
// A message header named id or content-type, or starting with oncommit- or
// ce_ (in any case), is dropped and logged: message data cannot forge the
// envelope.
//
// A record's timestamp is left to kgo, which stamps the time of the
// produce: kgo's RecordDeliveryTimeout counts from it, so a message
// produced long after it was published (a backlog, a delay, a retry) is
// not timed out before it is sent. A batch has at most one unacknowledged
// record per key in flight: a key's next record is produced
// once Kafka acknowledged the one before it, and when one fails the key's
// later records in the batch fail without being produced, so within one
// batch a key's records reach Kafka in the batch's order. Across batches,
// per-key order into Kafka needs ordered delivery (outbox
// Config.OrderByKey): the relay then hands a key's messages over in
// publish order and never settles a later one before an earlier one, so
// they land in publish order, possibly repeated (k1 k2 k1 k2 after a
// redelivery). Without it, a key's messages are claimed and retried
// independently (concurrent claims, separate backoffs) and may land in any
// order.
//
// On the receiving side, [Consume] applies each record once through an
// outbox.Inbox keyed by its oncommit-id header (else its ce_id, else its
// id header: a CloudEvents stream of another producer deduplicates too),
// in the consumer's own
// transaction, and commits a record's offset only after that transaction
// committed (or the record was dead-lettered): a record delivered again
// (a lost commit, a rebalance) is found a repeat.
//
// The client must produce idempotently with acks=all (franz-go's default;
// New returns ErrNotDurable otherwise) and must not use kgo.ManualFlushing
// (the forwarder never flushes).
package kafka
