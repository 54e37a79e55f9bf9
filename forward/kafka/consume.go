package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncommit/oncommit/internal/receive"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// DeadReasonHeader is the header of a dead-lettered record (see
// ConsumeConfig.DeadLetterTopic) that says why it was dead-lettered.
const DeadReasonHeader = "oncommit-dead-reason"

// commitTimeout bounds one offset commit, also the last one after ctx
// ended.
const commitTimeout = 5 * time.Second

// ConsumeConfig configures [Consume].
type ConsumeConfig struct {
	// Name is the consumer's name in the inbox: two consumers of the same
	// records with different names each apply every record once.
	// Required.
	Name string

	// MaxAttempts is how many times in a row a record may fail before it
	// is dead-lettered. Kafka counts no deliveries, so the attempts are
	// Consume's own, in this process: a record delivered again (another
	// member, a restart) starts over at 1. Defaults to 5
	// (receive.DefaultMaxAttempts); negative means never: the record is
	// retried until it is applied or ctx ends.
	MaxAttempts int

	// RetryDelay is how long Consume waits between two attempts of a
	// record. Defaults to one second.
	RetryDelay time.Duration

	// DeadLetterTopic, when set, is where a record that failed MaxAttempts
	// times, or has no id (no oncommit-id, ce_id or id header; see
	// Consume), is produced with the consuming client, synchronously: its
	// key, value and headers, with DeadReasonHeader added and IDHeader set
	// to its id suffixed with "/dead" (none for a record without an id).
	// Its offset is committed only once Kafka acknowledged the dead
	// letter.
	DeadLetterTopic string

	// DeadLetter, when set, is called instead with such a record and why
	// it failed; it may write the record to a table. When it (or the
	// produce to DeadLetterTopic) fails, the record is attempted again.
	// One of DeadLetter and DeadLetterTopic is required: a poison record
	// is never skipped without a trace.
	DeadLetter func(ctx context.Context, r *kgo.Record, reason error) error

	// OnOutcome, when set, is called after each attempt with what
	// Consume did (for metrics and tests).
	OnOutcome func(Outcome)

	// Logger receives a line per failed attempt, per dead letter and per
	// failed offset commit. Defaults to slog.Default().
	Logger *slog.Logger
}

// Outcome is what [Consume] did with one attempt of a record.
type Outcome struct {
	ID        string // the record's id (see Consume); "" when it had none
	Topic     string
	Partition int32
	Offset    int64
	Attempt   int // Consume's attempt at the record: 1 on the first
	// Applied: fn ran and its transaction committed.
	Applied bool
	// Repeat: the inbox had the id (applied before); fn was not called.
	Repeat bool
	// Dead: dead-lettered; its offset is committed like an applied one's.
	Dead bool
	// Err is why the record was not applied (to be attempted again, or
	// dead), or why its dead letter failed.
	Err error
}

// Consume applies the records that client fetches, once each, until ctx
// ends (returning nil) or the client is closed (returning an error). For
// each record it begins a transaction with b, records the record's id in
// ib under cfg.Name, calls fn with the transaction for a new id, and
// commits. A repeat is skipped without calling fn.
//
// A record's id is its oncommit-id header (IDHeader, which our forwarder
// sets in both modes); without one, its ce_id header (the id of a
// CloudEvent in the Kafka binding's binary content mode, so that a
// CloudEvents stream of another producer deduplicates too); without that,
// its id header (as CDC outbox routers set it). The first header of the
// name counts; names are matched exactly (Kafka header names are case
// sensitive). A record with none of them is dead-lettered at once. After each poll's records are
// applied (or dead-lettered), it commits their offsets to Kafka.
//
// client is the caller's: a consumer group member (kgo.ConsumerGroup,
// kgo.ConsumeTopics) with auto-commit disabled (kgo.DisableAutoCommit), so
// that only the offsets of applied records are committed; Consume returns
// a *[ConfigError] otherwise. It also produces the dead letters of
// cfg.DeadLetterTopic. Consume may be called again with it; close it after
// the last. With kgo.BlockRebalanceOnPoll, Consume allows rebalances after
// each poll's commit.
//
// Kafka has no per-record redelivery, so a record whose fn or commit
// fails is attempted again in process, cfg.RetryDelay apart, and
// dead-lettered after cfg.MaxAttempts. It holds the later records of its
// partition (order is kept) and, since records are applied one at a time,
// the rest of the poll: run more group members for more throughput. When
// ctx ends first, the record's offset is not committed, and the client is
// rewound to it.
//
// A record whose offset commit was lost (a failed commit, a process
// killed after its transaction, a partition moved to another member) is
// delivered again and found a repeat.
func Consume[T any](ctx context.Context, client *kgo.Client, ib *outbox.Inbox, b outboxdriver.Beginner[T], cfg ConsumeConfig, fn func(ctx context.Context, tx T, r *kgo.Record) error) error {
	if cfg.Name == "" {
		return &ConfigError{Field: "Name", Reason: "is required: the consumer's name in the inbox"}
	}
	if cfg.DeadLetter == nil && cfg.DeadLetterTopic == "" {
		return &ConfigError{Field: "DeadLetter", Reason: "or DeadLetterTopic is required: where a poison record goes"}
	}
	switch {
	case client == nil:
		return &ConfigError{Field: "client", Reason: "must not be nil"}
	case ib == nil:
		return &ConfigError{Field: "Inbox", Reason: "must not be nil"}
	case fn == nil:
		return &ConfigError{Field: "fn", Reason: "must not be nil"}
	}
	if g, _ := client.OptValue(kgo.ConsumerGroup).(string); g == "" {
		return &ConfigError{Field: "client", Reason: "must consume in a group (kgo.ConsumerGroup): Consume commits offsets"}
	}
	if off, _ := client.OptValue(kgo.DisableAutoCommit).(bool); !off {
		return &ConfigError{Field: "client", Reason: "must disable auto-commit (kgo.DisableAutoCommit): it would commit records not applied yet"}
	}
	receive.Defaults(&cfg.MaxAttempts, &cfg.RetryDelay, &cfg.Logger)
	for {
		fs := client.PollFetches(ctx)
		if fs.IsClientClosed() {
			return fmt.Errorf("kafka: consume: %w", kgo.ErrClientClosed)
		}
		if ctx.Err() != nil {
			// Records polled as ctx ended are left for a later Consume.
			rewind := map[string]map[int32]kgo.EpochOffset{}
			fs.EachPartition(func(p kgo.FetchTopicPartition) {
				if len(p.Records) > 0 {
					markRewind(rewind, p.Records[0])
				}
			})
			client.SetOffsets(rewind)
			return nil
		}
		failed := false
		fs.EachError(func(topic string, p int32, err error) {
			// kgo retries what it can; the rest is for the caller's logs.
			if !errors.Is(err, context.Canceled) {
				failed = true
				cfg.Logger.Warn("kafka: consume: fetch", "topic", topic, "partition", p, "err", err)
			}
		})
		if failed && fs.Empty() {
			// No busy loop on an error kgo returns at once.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		var done []*kgo.Record                           // per partition, the last record done
		rewind := map[string]map[int32]kgo.EpochOffset{} // per partition, the first not done
		stopped := false
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			var last *kgo.Record
			for _, r := range p.Records {
				if stopped || !consumeOne(ctx, client, ib, b, &cfg, r, fn) {
					stopped = true
					markRewind(rewind, r)
					break
				}
				last = r
			}
			if last != nil {
				done = append(done, last)
			}
		})
		commit(ctx, client, &cfg, done)
		if stopped {
			// A later Consume on this client starts at the first record
			// not done, not after the poll.
			client.SetOffsets(rewind)
			return nil
		}
		client.AllowRebalance()
	}
}

// consumeOne attempts r until it is applied, a repeat or dead-lettered
// (true), or ctx ends (false).
func consumeOne[T any](ctx context.Context, client *kgo.Client, ib *outbox.Inbox, b outboxdriver.Beginner[T], cfg *ConsumeConfig, r *kgo.Record, fn func(ctx context.Context, tx T, r *kgo.Record) error) bool {
	id := idOf(r)
	for attempt := 1; ; attempt++ {
		res := receive.Apply(ctx, ib, b, cfg.Name, id, attempt, cfg.MaxAttempts,
			func(ctx context.Context, tx T) error { return fn(ctx, tx, r) },
			func(ctx context.Context, reason error) error { return deadLetter(ctx, client, cfg, r, id, reason) })
		if cfg.OnOutcome != nil {
			cfg.OnOutcome(Outcome{ID: id, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Attempt: attempt,
				Applied: res.Applied, Repeat: res.Repeat, Dead: res.Verdict == receive.Dead, Err: res.Err})
		}
		switch res.Verdict {
		case receive.Ack:
			return true
		case receive.Dead:
			cfg.Logger.Warn("kafka: consume: dead-lettered", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "id", id, "attempt", attempt, "reason", res.Err)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		cfg.Logger.Info("kafka: consume: will retry", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "id", id, "attempt", attempt, "err", res.Err)
		t := time.NewTimer(cfg.RetryDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// markRewind sets r's partition in rewind to r's offset.
func markRewind(rewind map[string]map[int32]kgo.EpochOffset, r *kgo.Record) {
	if rewind[r.Topic] == nil {
		rewind[r.Topic] = map[int32]kgo.EpochOffset{}
	}
	rewind[r.Topic][r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
}

// idOf returns r's deduplication id: its first IDHeader (oncommit-id)
// value, else its first ce_id value (a CloudEvent in binary content mode),
// else its first id value, else "".
func idOf(r *kgo.Record) string {
	var ceID, id *kgo.RecordHeader
	for i := range r.Headers {
		switch h := &r.Headers[i]; h.Key {
		case IDHeader:
			return string(h.Value)
		case "ce_id":
			if ceID == nil {
				ceID = h
			}
		case "id":
			if id == nil {
				id = h
			}
		}
	}
	switch {
	case ceID != nil:
		return string(ceID.Value)
	case id != nil:
		return string(id.Value)
	}
	return ""
}

// commit commits the offsets of done, also after ctx ended (the records
// are applied); a failure only means they are delivered again.
func commit(ctx context.Context, client *kgo.Client, cfg *ConsumeConfig, done []*kgo.Record) {
	if len(done) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if err := client.CommitRecords(cctx, done...); err != nil {
		cfg.Logger.Warn("kafka: consume: commit offsets (the records will be delivered again)", "err", err)
	}
}

func deadLetter(ctx context.Context, client *kgo.Client, cfg *ConsumeConfig, r *kgo.Record, id string, reason error) error {
	if cfg.DeadLetter != nil {
		return cfg.DeadLetter(ctx, r, reason)
	}
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+1)
	for _, h := range r.Headers {
		if h.Key != IDHeader && h.Key != DeadReasonHeader {
			hs = append(hs, h)
		}
	}
	if id != "" {
		hs = append(hs, kgo.RecordHeader{Key: IDHeader, Value: []byte(id + "/dead")})
	}
	hs = append(hs, kgo.RecordHeader{Key: DeadReasonHeader, Value: []byte(reason.Error())})
	d := &kgo.Record{Topic: cfg.DeadLetterTopic, Key: r.Key, Value: r.Value, Headers: hs}
	return client.ProduceSync(ctx, d).FirstErr()
}
