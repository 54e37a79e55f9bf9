// Package kafka forwards outbox messages to Kafka: a batch handler for an
// oncommit relay ([github.com/oncommit/oncommit/outbox.Relay.HandleBatch])
// that produces each claim's messages with one franz-go client
// ([github.com/twmb/franz-go/pkg/kgo]), awaits every acknowledgement, and
// returns one outcome per message. A message is settled done only once
// Kafka has acknowledged its record (acks=all, idempotent producer); a
// produce error is an outcome error, retried with the relay's backoff.
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
// value is the payload; its timestamp the message's CreatedAt; its headers
// oncommit-id and the message's headers. A batch has at most one
// unacknowledged record per key in flight: a key's next record is produced
// once Kafka acknowledged the one before it, and when one fails the key's
// later records in the batch fail without being produced, so a retry can
// never put a key's later message into Kafka ahead of an earlier one. With
// ordered delivery (outbox Config.OrderByKey), the relay never settles a
// key's later message before an earlier one either: a key's messages land
// in publish order, possibly repeated (k1 k2 k1 k2 after a redelivery).
package kafka
