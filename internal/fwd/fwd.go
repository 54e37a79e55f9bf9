// Package fwd is the part the broker forwarders (forward/nats,
// forward/rabbitmq) share: publishing a batch of deliveries through a
// bounded window of unconfirmed publishes, at most one unconfirmed message
// per key, and turning the broker's answers into one outcome per delivery.
//
// It never decides that a message is done: only a publish whose wait
// returned nil is. Everything else (a publish that failed, an answer that
// did not come within the timeout, a cancelled context, a later message
// of a key whose earlier message failed) is an error, which the relay
// retries with backoff.
package fwd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

// ErrAckTimeout is the outcome of a publish whose confirmation did not
// come within the timeout. The message may still have reached the broker:
// its redelivery is deduplicated by its id.
var ErrAckTimeout = errors.New("no confirmation from the broker within the ack timeout")

// ErrKeyFailed is the outcome of a message that was not published because
// an earlier message of its key in the same batch failed: publishing it
// could put it on the broker before its predecessor.
var ErrKeyFailed = errors.New("not published: an earlier message of its key in this batch failed")

// Wait waits for the broker's answer to one publish: nil when the broker
// confirmed it, an error otherwise. It must return when done is closed
// (with ctx's error) or when timeout fires (with ErrAckTimeout).
type Wait func(done <-chan struct{}, timeout <-chan time.Time) error

// Start publishes ds[i] without waiting for the broker's answer, and
// returns how to wait for it. An error means the message was not sent
// (or its fate is unknown) and is its outcome.
type Start func(i int) (Wait, error)

// Batch publishes every delivery of ds through start, in order, with at
// most window publishes awaiting their answer at once, and at most one per
// non-empty key: before the next message of a key is published, the
// previous one's answer is awaited, and after a failure the key's later
// messages in ds are not published (their outcome wraps ErrKeyFailed). A
// publish's answer is awaited at most timeout from when it was sent. It
// returns one outcome per delivery, in the order of ds.
func Batch(ctx context.Context, ds []outbox.Delivery, window int, timeout time.Duration, start Start) []error {
	out := make([]error, len(ds))
	type pending struct {
		i    int
		sent time.Time
		wait Wait
	}
	// queue holds the unanswered publishes, oldest first (brokers answer
	// in about that order); head is the oldest's index in it.
	queue := make([]pending, 0, min(window, len(ds)))
	head := 0
	var inflight map[string]int // key -> index in ds of its unanswered publish
	var failed map[string]bool  // keys with a failed message in this batch
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	done := ctx.Done()

	// resolve awaits the oldest unanswered publish.
	resolve := func() {
		p := queue[head]
		queue[head] = pending{}
		head++
		if head == len(queue) {
			queue, head = queue[:0], 0
		}
		left := time.Until(p.sent.Add(timeout))
		timer.Reset(max(left, 0))
		err := p.wait(done, timer.C)
		timer.Stop() // since Go 1.23, a stopped timer's channel holds no stale tick
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("forwarding stopped before the broker confirmed: %w", err)
		}
		out[p.i] = err
		if k := ds[p.i].Key; k != "" {
			if inflight[k] == p.i {
				delete(inflight, k)
			}
			if err != nil {
				failed[k] = true
			}
		}
	}
	for i := range ds {
		k := ds[i].Key
		if k != "" {
			if inflight == nil {
				inflight, failed = map[string]int{}, map[string]bool{}
			}
			for {
				if _, ok := inflight[k]; !ok {
					break
				}
				resolve() // the key's unanswered publish is in the queue
			}
			if failed[k] {
				out[i] = ErrKeyFailed
				continue
			}
		}
		for len(queue)-head >= window {
			resolve()
		}
		if err := ctx.Err(); err != nil {
			out[i] = fmt.Errorf("forwarding stopped before the message was published: %w", err)
			if k != "" {
				failed[k] = true
			}
			continue
		}
		wait, err := start(i)
		if err != nil {
			out[i] = err
			if k != "" {
				failed[k] = true
			}
			continue
		}
		queue = append(queue, pending{i: i, sent: time.Now(), wait: wait})
		if k != "" {
			inflight[k] = i
		}
	}
	for head < len(queue) {
		resolve()
	}
	return out
}
