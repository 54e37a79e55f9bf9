package kafka_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/oncommit/oncommit/forward/kafka"
	"github.com/oncommit/oncommit/internal/fwdtest"
	"github.com/oncommit/oncommit/outbox"
)

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

// TestLateRecordsArrive, under each client setting (kgo's defaults;
// kgo.RecordDeliveryTimeout set) with an ack timeout shorter than the
// outage: a message that reaches the forwarder later than the delivery
// timeout after it was published (a backlog built up while Kafka was
// unreachable for longer than the timeout, a message delayed past it) is
// produced, not timed out on every attempt: every message arrives, none is
// dead-lettered. Each record carries the message's publish time in the
// oncommit-created-at header.
func TestLateRecordsArrive(t *testing.T) {
	fwdtest.Under(t, settings, func(t *testing.T, set fwdtest.Setting[[]kgo.Opt]) {
		e := newEnv(t, set.C, "orders")
		down := e.down()
		f := e.forwarder(t, kafka.Config{AckTimeout: 2 * deliveryTimeout})
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
	})
}

// stall leaves every produce request unanswered while it is set, as a
// broker that takes requests and never answers would: kgo cannot fail a
// record in such a request (it may have been written), whatever its
// RecordDeliveryTimeout.
func (e *env) stall() *atomic.Bool {
	var stalled atomic.Bool
	e.cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		return nil, nil, stalled.Load()
	})
	return &stalled
}

// logBuffer is an io.Writer for a logger, safe to read while it logs.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAckTimeoutStalledProduce: while Kafka takes produce requests and
// never answers, each message fails after Config.AckTimeout with
// ErrAckTimeout (its key's later message without being produced), the
// relay logs it, counts an attempt and backs off, and dead-letters the
// messages after MaxAttempts, instead of holding them processing with
// their leases renewed.
func TestAckTimeoutStalledProduce(t *testing.T) {
	fwdtest.Under(t, settings, func(t *testing.T, set fwdtest.Setting[[]kgo.Opt]) {
		e := newEnv(t, set.C, "orders")
		e.stall().Store(true)
		f := e.forwarder(t, kafka.Config{AckTimeout: 300 * time.Millisecond})
		var mu sync.Mutex
		var outcomes []error
		var logs logBuffer
		e.relay(t, outbox.RelayConfig{MaxAttempts: 3, RetryBase: 20 * time.Millisecond, RetryCap: 50 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))},
			func(ctx context.Context, ds []outbox.Delivery) []error {
				errs := f.Handler()(ctx, ds)
				mu.Lock()
				outcomes = append(outcomes, errs...)
				mu.Unlock()
				return errs
			})
		e.publish(t, outbox.Message{Topic: "orders", Key: "a"}, outbox.Message{Topic: "orders", Key: "a"}, outbox.Message{Topic: "orders"})
		waitFor(t, 30*time.Second, "the messages dead-lettered", func() bool {
			return e.count(t, `state = 'dead' AND attempts = 3 AND last_error LIKE '%within the ack timeout%'`) == 3
		})
		mu.Lock()
		for i, err := range outcomes {
			if !errors.Is(err, kafka.ErrAckTimeout) {
				t.Errorf("outcome %d: %v, want an error wrapping ErrAckTimeout", i, err)
			}
		}
		mu.Unlock()
		for _, line := range []string{`msg="outbox: handler failed; retrying"`, `msg="outbox: message failed its last attempt; dead-lettered"`} {
			if !strings.Contains(logs.String(), line) {
				t.Errorf("no log line %s in:\n%s", line, logs.String())
			}
		}
	})
}

// TestNewConfigError: a nil client and a negative AckTimeout are
// *ConfigError naming the field.
func TestNewConfigError(t *testing.T) {
	cl := fakeClient(t)
	for _, tc := range []struct {
		client *kgo.Client
		cfg    kafka.Config
		field  string
	}{
		{nil, kafka.Config{}, "client"},
		{cl, kafka.Config{AckTimeout: -time.Second}, "AckTimeout"},
	} {
		var ce *kafka.ConfigError
		if _, err := kafka.New(tc.client, tc.cfg); !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("New(%v, %+v): %v, want a *ConfigError for %s", tc.client, tc.cfg, err, tc.field)
		}
	}
}
