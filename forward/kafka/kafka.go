package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/oncommit/oncommit/outbox"
	"github.com/twmb/franz-go/pkg/kgo"
)

// IDHeader is the record header that carries the outbox message id, the
// same on every produce of one message: the key consumers deduplicate by.
const IDHeader = "oncommit-id"

// Config configures a [Forwarder]. The zero value works.
type Config struct {
	// Topic maps a message's outbox topic to the Kafka topic its record is
	// produced to. It must return a topic name; "" fails the message (and
	// it is retried). Defaults to nil: the same name.
	Topic func(outboxTopic string) string
}

// Forwarder produces outbox messages to Kafka. Build it with [New] and
// register [Forwarder.Handler] on a relay.
type Forwarder struct {
	client *kgo.Client
	cfg    Config
}

// ErrNotDurable is returned by [New] for a client whose records Kafka may
// acknowledge before every in-sync replica has them (acks other than all)
// or that does not produce idempotently.
var ErrNotDurable = errors.New("kafka: the client must produce idempotently with acks=all (kgo's defaults)")

// New returns a forwarder that produces with client. The client must keep
// kgo's producer defaults for durability: idempotent writes and
// RequiredAcks(kgo.AllISRAcks()); New returns an error wrapping
// [ErrNotDurable] otherwise. The client stays the caller's: close it after
// the relay has stopped.
func New(client *kgo.Client, cfg Config) (*Forwarder, error) {
	if client == nil {
		return nil, errors.New("kafka: client must not be nil")
	}
	acks, _ := client.OptValue(kgo.RequiredAcks).(kgo.Acks)
	if acks != kgo.AllISRAcks() {
		return nil, fmt.Errorf("%w: RequiredAcks is not AllISRAcks", ErrNotDurable)
	}
	if off, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		return nil, fmt.Errorf("%w: DisableIdempotentWrite is set", ErrNotDurable)
	}
	return &Forwarder{client: client, cfg: cfg}, nil
}

// Handler returns the batch handler that forwards a batch: it produces a
// record for every delivery (without waiting), then awaits them all, and
// returns each record's produce error as its message's outcome (nil once
// Kafka acknowledged it). When ctx ends first (the relay lost a lease or
// is shutting down), the records not acknowledged yet get ctx's error:
// they are not settled done and are delivered again.
func (f *Forwarder) Handler() outbox.BatchHandler {
	return func(ctx context.Context, ds []outbox.Delivery) []error {
		w := &wait{errs: make([]error, len(ds)), got: make([]bool, len(ds)), left: len(ds), done: make(chan struct{})}
		if len(ds) == 0 {
			return nil
		}
		for i := range ds {
			r, err := f.record(&ds[i])
			if err != nil {
				w.set(i, err)
				continue
			}
			f.client.Produce(ctx, r, func(_ *kgo.Record, err error) { w.set(i, err) })
		}
		select {
		case <-w.done:
		case <-ctx.Done():
		}
		return w.result(ctx.Err())
	}
}

// record builds the record of d.
func (f *Forwarder) record(d *outbox.Delivery) (*kgo.Record, error) {
	topic := d.Topic
	if f.cfg.Topic != nil {
		if topic = f.cfg.Topic(d.Topic); topic == "" {
			return nil, fmt.Errorf("kafka: Config.Topic maps topic %q to no Kafka topic", d.Topic)
		}
	}
	r := &kgo.Record{Topic: topic, Value: d.Payload, Timestamp: d.CreatedAt,
		Headers: make([]kgo.RecordHeader, 0, 1+len(d.Headers))}
	if d.Key != "" {
		r.Key = []byte(d.Key)
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: IDHeader, Value: []byte(d.ID.String())})
	names := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		if k != IDHeader {
			names = append(names, k)
		}
	}
	slices.Sort(names) // the same order on every produce of the message
	for _, k := range names {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(d.Headers[k])})
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
// returned).
func (w *wait) set(i int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.returned {
		return
	}
	if w.got[i] {
		return
	}
	w.got[i], w.errs[i] = true, err
	if w.left--; w.left == 0 {
		close(w.done)
	}
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
