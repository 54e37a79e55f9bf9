package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncommit/oncommit/internal/fwd"
	"github.com/oncommit/oncommit/outbox"
)

// DefaultAckTimeout is Config.AckTimeout's default.
const DefaultAckTimeout = 10 * time.Second

// ErrAckTimeout is the outcome (wrapped) of a message whose record Kafka
// did not acknowledge within Config.AckTimeout: it is retried, and the
// record may still land, in which case its redelivery repeats its
// oncommit-id. The same error as the other forwarders' (natsfwd,
// rabbitmq).
var ErrAckTimeout = fwd.ErrAckTimeout

// Record headers the forwarder sets (see [Config.CloudEvents] for which
// in each mode). A message header whose name one of them could take is
// dropped (see [Forwarder.Handler]).
const (
	// IDHeader carries the outbox message id, the same on every produce
	// of one message: the key consumers deduplicate by. Set in both
	// modes; in plain mode the header id carries it too, in CloudEvents
	// mode ce_id.
	IDHeader = "oncommit-id"

	// CreatedAtHeader carries the message's publish time
	// (outbox.Delivery.CreatedAt, on the database clock) in RFC 3339 with
	// nanoseconds, in UTC (time.RFC3339Nano), the same on every produce of
	// one message. The record's own timestamp is the time it was
	// produced. Plain mode only: in CloudEvents mode ce_time carries it.
	CreatedAtHeader = "oncommit-created-at"

	// TypeHeader carries the message's outbox topic (the event type; the
	// Kafka topic may differ, see Config.Topic). Plain mode only: in
	// CloudEvents mode ce_type carries it.
	TypeHeader = "oncommit-type"

	// SourceHeader carries Config.Source. Plain mode only: in CloudEvents
	// mode ce_source carries it.
	SourceHeader = "oncommit-source"
)

// Config configures a [Forwarder]. The zero value works.
type Config struct {
	// Topic maps a message's outbox topic to the Kafka topic its record is
	// produced to. It must return a topic name; "" fails the message (and
	// it is retried). Defaults to nil: the same name.
	Topic func(outboxTopic string) string

	// AckTimeout is how long a record waits for Kafka's acknowledgement,
	// from when it is produced; a message without one by then fails with
	// ErrAckTimeout (the relay counts an attempt and retries it with
	// backoff), and the record is cancelled in the client where kgo still
	// can. Keep it below the relay's Lease. Defaults to DefaultAckTimeout
	// (10s).
	AckTimeout time.Duration

	// Source names the producing service in every record's envelope: the
	// oncommit-source header in plain mode, ce_source in CloudEvents mode
	// (a URI reference, such as "/orders" or "urn:orders", as CloudEvents
	// wants). Defaults to "oncommit".
	Source string

	// CloudEvents selects the records' envelope. Every record's key is the
	// message's key (none without one) and its value the payload; its
	// headers are, in this order:
	//
	// Plain mode (false, the default):
	//
	//	oncommit-id          the outbox message id (IDHeader: Consume's dedup key)
	//	id                   the same id, for consumers that look for "id"
	//	content-type         application/json (absent for a message without a payload)
	//	oncommit-type        the message's outbox topic (TypeHeader)
	//	oncommit-source      Config.Source (SourceHeader)
	//	oncommit-created-at  the message's CreatedAt, RFC 3339 in UTC (CreatedAtHeader)
	//
	// CloudEvents mode (true): a CloudEvent in binary content mode, as the
	// CloudEvents Kafka protocol binding maps it, every attribute a ce_
	// header with its UTF-8 value:
	//
	//	oncommit-id          the outbox message id (IDHeader: Consume's dedup key)
	//	ce_id                the same id
	//	ce_source            Config.Source
	//	ce_specversion       1.0
	//	ce_type              the message's outbox topic
	//	ce_time              the message's CreatedAt, RFC 3339 in UTC
	//	ce_partitionkey      the message's key (absent without one; the record key is the same)
	//	content-type         the datacontenttype, application/json (absent for a message without a payload)
	//
	// In both modes the message's own headers follow, sorted by name,
	// except those whose names the forwarder's headers take in either
	// mode: id, content-type and every name starting with oncommit- or
	// ce_, in any case. Those are dropped (logged on Logger), so that
	// message data cannot forge the envelope, and a record carries the
	// same message headers whichever the mode.
	CloudEvents bool

	// Logger receives a line per message header dropped (see
	// [Forwarder.Handler]). Defaults to slog.Default().
	Logger *slog.Logger
}

// ConfigError reports an invalid [Config] field or argument of [New].
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return "kafka: Config." + e.Field + " " + e.Reason }

// Forwarder produces outbox messages to Kafka. Build it with [New] and
// register [Forwarder.Handler] on a relay.
type Forwarder struct {
	client  *kgo.Client
	cfg     Config
	headers fwd.Headers
}

// ErrNotDurable is returned by [New] for a client whose records Kafka may
// acknowledge before every in-sync replica has them (acks other than all)
// or that does not produce idempotently.
var ErrNotDurable = errors.New("kafka: the client must produce idempotently with acks=all (kgo's defaults)")

// New returns a forwarder that produces with client. The client must keep
// kgo's producer defaults for durability: idempotent writes and
// RequiredAcks(kgo.AllISRAcks()); New returns an error wrapping
// [ErrNotDurable] otherwise. The client stays the caller's: close it after
// the relay has stopped. An invalid cfg is a *[ConfigError].
func New(client *kgo.Client, cfg Config) (*Forwarder, error) {
	switch {
	case client == nil:
		return nil, &ConfigError{Field: "client", Reason: "must not be nil"}
	case cfg.AckTimeout < 0:
		return nil, &ConfigError{Field: "AckTimeout", Reason: "must not be negative"}
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.Source == "" {
		cfg.Source = fwd.DefaultSource
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	acks, _ := client.OptValue(kgo.RequiredAcks).(kgo.Acks)
	if acks != kgo.AllISRAcks() {
		return nil, fmt.Errorf("%w: RequiredAcks is not AllISRAcks", ErrNotDurable)
	}
	if manual, _ := client.OptValue(kgo.ManualFlushing).(bool); manual {
		return nil, errors.New("kafka: the client must not use ManualFlushing: the forwarder never flushes, so its records would never be sent")
	}
	if off, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		return nil, fmt.Errorf("%w: DisableIdempotentWrite is set", ErrNotDurable)
	}
	f := &Forwarder{client: client, cfg: cfg}
	f.headers = fwd.Headers{Reserved: reserved, Logger: cfg.Logger,
		Msg: "kafka: dropped a message header whose name the forwarder's envelope takes (id, content-type, an oncommit- or ce_ name); later drops of this name are logged at debug level"}
	return f, nil
}

// reserved reports whether the forwarder drops a message header of this
// name: one its envelope takes in either mode (see Config.CloudEvents).
func reserved(name string) bool {
	return strings.EqualFold(name, "id") || strings.EqualFold(name, "content-type") ||
		fwd.HasPrefixFold(name, "oncommit-") || fwd.HasPrefixFold(name, "ce_")
}

// Handler returns the batch handler that forwards a batch: it produces the
// batch's records without waiting for one another, but at most one
// unacknowledged record per key (a key's next record is produced once
// Kafka acknowledged the one before it), awaits them all, and returns each
// record's produce error as its message's outcome (nil once Kafka
// acknowledged it). When a record fails, the later records of its key in
// the batch are not produced and fail too: a key's later message never
// reaches Kafka before an earlier one. A record Kafka has not acknowledged
// within Config.AckTimeout of its produce fails with an error wrapping
// [ErrAckTimeout] (a failure like the others: its key's later records are
// not produced). When ctx ends first (the relay lost a lease or is
// shutting down), the records not acknowledged yet get an error wrapping
// ctx's: they are not settled done and are delivered again.
//
// Each record carries the envelope of Config.CloudEvents and the
// message's headers, except those named id or content-type or starting
// with oncommit- or ce_ (in any case), which the envelope takes: they are
// dropped, so that message data cannot forge a record's id, type, source
// or time. A drop is logged on Config.Logger, at warning level the first
// time a name is dropped and at debug level after that.
func (f *Forwarder) Handler() outbox.BatchHandler {
	return func(ctx context.Context, ds []outbox.Delivery) []error {
		if len(ds) == 0 {
			return nil
		}
		b := &batch{f: f, ctx: ctx, ds: ds, next: make([]int, len(ds)),
			recs: make([]*kgo.Record, len(ds)), recErrs: make([]error, len(ds)),
			wait: wait{errs: make([]error, len(ds)), got: make([]bool, len(ds)), left: len(ds), done: make(chan struct{})}}
		last := make(map[string]int, len(ds))
		first := make([]bool, len(ds))
		for i := range ds {
			b.next[i], first[i] = -1, true
			if k := ds[i].Key; k != "" {
				if j, ok := last[k]; ok {
					b.next[j], first[i] = i, false
				}
				last[k] = i
			}
		}
		// Every record is built here, on the relay's goroutine (its
		// recover covers Config.Topic), before any is produced.
		for i := range ds {
			b.recs[i], b.recErrs[i] = f.record(ctx, &ds[i])
		}
		for i := range ds {
			if first[i] {
				b.produce(i)
			}
		}
		select {
		case <-b.done:
		case <-ctx.Done():
		}
		return b.result(ctx.Err())
	}
}

// batch is one call of the handler: its deliveries, for each the next
// delivery of its key (-1 for none), and their outcomes.
type batch struct {
	f       *Forwarder
	ctx     context.Context
	ds      []outbox.Delivery
	next    []int
	recs    []*kgo.Record
	recErrs []error
	wait
}

// produce produces the record of delivery i; once Kafka acknowledged it,
// the next of its key; when it fails or is not acknowledged within the ack
// timeout, fails the rest of its key.
func (b *batch) produce(i int) {
	r, err := b.recs[i], b.recErrs[i]
	if err != nil {
		b.fail(i, err)
		return
	}
	// The record's context ends at the ack timeout: the outcome is the
	// timeout whether or not kgo can still fail the record (it cannot once
	// a request carrying it is unanswered), and kgo drops it where it can.
	rctx, cancel := context.WithTimeoutCause(b.ctx, b.f.cfg.AckTimeout, ErrAckTimeout)
	timedOut := func() error {
		if context.Cause(rctx) != ErrAckTimeout {
			return nil
		}
		return fmt.Errorf("kafka: produce to topic %q: %w (%v)", r.Topic, ErrAckTimeout, b.f.cfg.AckTimeout)
	}
	stop := context.AfterFunc(rctx, func() {
		if err := timedOut(); err != nil {
			b.fail(i, err)
		}
	})
	b.f.client.Produce(rctx, r, func(_ *kgo.Record, err error) {
		stop()
		defer cancel()
		if err != nil {
			switch terr := timedOut(); {
			case terr != nil:
				err = terr // kgo reports the context's error
			case rctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
				// kgo fails a partition's buffered records with the
				// error of the first one it gives up on.
				err = fmt.Errorf("kafka: produce to topic %q: failed with an earlier record of its partition: %w", r.Topic, err)
			}
			b.fail(i, err)
			return
		}
		if b.set(i, nil) && b.next[i] >= 0 {
			// Not from the promise itself: Produce may block (a full
			// buffer), and promises must not.
			go b.produce(b.next[i])
		}
	})
}

// fail records err for delivery i and an error for every later delivery
// of its key, which is not produced.
func (b *batch) fail(i int, err error) {
	b.set(i, err)
	for j := b.next[i]; j >= 0; j = b.next[j] {
		b.set(j, fmt.Errorf("kafka: not produced: an earlier message of its key (%s) failed: %w", b.ds[i].ID, err))
	}
}

// record builds the record of d: the envelope of Config.CloudEvents, then
// d's headers that reserved does not take, sorted.
func (f *Forwarder) record(ctx context.Context, d *outbox.Delivery) (*kgo.Record, error) {
	topic := d.Topic
	if f.cfg.Topic != nil {
		if topic = f.cfg.Topic(d.Topic); topic == "" {
			return nil, fmt.Errorf("kafka: Config.Topic maps topic %q to no Kafka topic", d.Topic)
		}
	}
	// No Timestamp: kgo stamps the record when it is produced. kgo
	// measures RecordDeliveryTimeout from the record's timestamp, so the
	// publish time there would fail at once every record of a message
	// older than that timeout (a backlog, a delayed message, a retry).
	r := &kgo.Record{Topic: topic, Value: d.Payload, Headers: make([]kgo.RecordHeader, 0, 8+len(d.Headers))}
	if d.Key != "" {
		r.Key = []byte(d.Key)
	}
	e := fwd.EnvelopeOf(d, f.cfg.Source)
	add := func(k, v string) { r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add(IDHeader, e.ID)
	if f.cfg.CloudEvents {
		// Binary content mode (CloudEvents Kafka protocol binding): each
		// attribute a ce_ header, datacontenttype the content-type header.
		for _, a := range e.CloudEvents() {
			add("ce_"+a.Name, a.Value)
		}
		if e.ContentType != "" {
			add("content-type", e.ContentType)
		}
	} else {
		add("id", e.ID)
		if e.ContentType != "" {
			add("content-type", e.ContentType)
		}
		add(TypeHeader, e.Type)
		add(SourceHeader, e.Source)
		add(CreatedAtHeader, e.Time)
	}
	names := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		names = append(names, k)
	}
	slices.Sort(names) // the same order on every produce of the message
	for _, k := range names {
		if f.headers.Keep(ctx, d, k) {
			add(k, d.Headers[k])
		}
	}
	return r, nil
}

// wait gathers the outcomes of one batch's records.
type wait struct {
	mu       sync.Mutex
	errs     []error
	got      []bool
	left     int
	done     chan struct{}
	returned bool
}

// set records the outcome of record i (once; none after the handler
// returned), and reports whether it did.
func (w *wait) set(i int, err error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.returned || w.got[i] {
		return false
	}
	w.got[i], w.errs[i] = true, err
	if w.left--; w.left == 0 {
		close(w.done)
	}
	return true
}

// result returns the outcomes, with cause for the records still waiting
// for an acknowledgement.
func (w *wait) result(cause error) []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.returned = true
	if w.left > 0 {
		if cause == nil {
			cause = context.Canceled
		}
		for i := range w.errs {
			if !w.got[i] {
				w.errs[i] = fmt.Errorf("kafka: no acknowledgement before the relay gave up: %w", cause)
			}
		}
	}
	return w.errs
}
