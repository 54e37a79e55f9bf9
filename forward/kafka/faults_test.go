package kafka_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/oncommit/oncommit/forward/kafka"
	"github.com/oncommit/oncommit/outbox"
)

// deliveryTimeout is the kgo.RecordDeliveryTimeout of the fault tests'
// clients: kgo's smallest, so that a backlog, a delay and an outage are
// each longer than it.
const deliveryTimeout = time.Second

// down makes the cluster close the connection of every request while it
// is set, as an unreachable broker would.
func (e *env) down() *atomic.Bool {
	var down atomic.Bool
	e.cluster.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		if down.Load() {
			return nil, errors.New("broker down"), true
		}
		return nil, nil, false
	})
	return &down
}

// createdAt records the CreatedAt of every delivery h is handed.
type createdAt struct {
	mu sync.Mutex
	at map[outbox.ID]time.Time
}

func (c *createdAt) wrap(h outbox.BatchHandler) outbox.BatchHandler {
	c.at = map[outbox.ID]time.Time{}
	return func(ctx context.Context, ds []outbox.Delivery) []error {
		c.mu.Lock()
		for _, d := range ds {
			c.at[d.ID] = d.CreatedAt
		}
		c.mu.Unlock()
		return h(ctx, ds)
	}
}

// TestLateRecordsArrive: with kgo.RecordDeliveryTimeout set, a message
// that reaches the forwarder later than that after it was published (a
// backlog built up while Kafka was unreachable for longer than the
// timeout, a message delayed past it) is produced, not timed out on every
// attempt: every message arrives, none is dead-lettered. Each record
// carries the message's publish time in the oncommit-created-at header.
func TestLateRecordsArrive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "orders")
	e.client = e.newClient(t, kgo.RecordDeliveryTimeout(deliveryTimeout))
	down := e.down()
	f := e.forwarder(t, kafka.Config{})
	var seen createdAt
	e.relay(t, outbox.RelayConfig{RetryBase: 50 * time.Millisecond, RetryCap: 500 * time.Millisecond}, seen.wrap(f.Handler()))

	ids := e.publish(t, outbox.Message{Topic: "orders", Key: "warm-up"})
	waitFor(t, 20*time.Second, "the first message delivered", func() bool { return e.count(t, "") == 0 })
	down.Store(true)
	var msgs []outbox.Message
	for i := range 60 {
		msgs = append(msgs, outbox.Message{Topic: "orders", Key: []string{"a", "b", "c", ""}[i%4]})
	}
	ids = append(ids, e.publish(t, msgs...)...)
	time.Sleep(3 * deliveryTimeout) // the outage, longer than the timeout
	down.Store(false)
	// Due when it is older than the timeout.
	ids = append(ids, e.publish(t, outbox.Message{Topic: "orders", Key: "a", Delay: 2 * deliveryTimeout})...)

	waitFor(t, 60*time.Second, "every message delivered", func() bool {
		if n := e.count(t, "state = 'dead'"); n > 0 {
			t.Fatalf("%d messages dead-lettered", n)
		}
		return e.count(t, "") == 0
	})
	recs := e.consume(t, len(ids), 10*time.Second, "orders")
	got := map[string]*kgo.Record{}
	for _, r := range recs {
		s, _ := header(r, kafka.IDHeader)
		got[s] = r
	}
	seen.mu.Lock()
	defer seen.mu.Unlock()
	for _, id := range ids {
		r := got[id.String()]
		if r == nil {
			t.Errorf("message %s not in Kafka", id)
			continue
		}
		want := seen.at[id].UTC().Format(time.RFC3339Nano)
		if h, _ := header(r, kafka.CreatedAtHeader); h != want {
			t.Errorf("message %s: %s %q, want its CreatedAt %q", id, kafka.CreatedAtHeader, h, want)
		}
	}
}
