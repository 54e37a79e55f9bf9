package oncommitotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

// TestOrderedQueueGauges: for an Outbox with OrderByKey, the queue gauges
// report the blocked messages (oncommit.queue.messages, state blocked),
// the held and blocked keys (oncommit.queue.keys) and the age of the
// oldest blocked key, per topic; for an Outbox without, on the same
// table, none of those.
func TestOrderedQueueGauges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: e.table, OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.Open(t, "pgx")
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{
		{Topic: "x", Key: "H"}, {Topic: "x", Key: "H"}, {Topic: "x", Key: "H"}, {Topic: "y", Key: "G"}, {Topic: "y", Key: "G"},
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// H's head fails its one attempt and halts H; G has no handler.
	runRelay(t, e, ob, nil, outbox.RelayConfig{MaxAttempts: 1}, map[string]outbox.Handler{
		"x": func(context.Context, outbox.Delivery) error { return errors.New("refused") },
	})
	eventually(t, "H's head dead", func() bool {
		n, err := ob.Count(ctx, sqltx.FromDB(db), outbox.Filter{States: []outbox.State{outbox.StateDead}})
		return err == nil && n == 1
	})

	observe := func(ob *outbox.Outbox) map[string]float64 {
		tm := newTelemetry(t, oncommitotel.Config{})
		qctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- tm.ObserveQueue(qctx, ob, sqltx.FromDB(db), oncommitotel.QueueConfig{Interval: 100 * time.Millisecond})
		}()
		defer func() { cancel(); <-done }()
		vals := map[string]float64{}
		eventually(t, "the queue gauges", func() bool {
			ms := tm.metrics(t)
			g, ok := ms[oncommitotel.MetricQueueMessages].Data.(metricdata.Gauge[int64])
			if !ok || len(g.DataPoints) == 0 {
				return false
			}
			for _, dp := range g.DataPoints {
				vals["messages,"+render(dp.Attributes)] = float64(dp.Value)
			}
			if g, ok := ms[oncommitotel.MetricQueueKeys].Data.(metricdata.Gauge[int64]); ok {
				if ms[oncommitotel.MetricQueueKeys].Unit != "{key}" {
					t.Errorf("%s: unit %q", oncommitotel.MetricQueueKeys, ms[oncommitotel.MetricQueueKeys].Unit)
				}
				for _, dp := range g.DataPoints {
					vals["keys,"+render(dp.Attributes)] = float64(dp.Value)
				}
			}
			if g, ok := ms[oncommitotel.MetricQueueOldestBlockedAge].Data.(metricdata.Gauge[float64]); ok {
				for _, dp := range g.DataPoints {
					vals["oldest_blocked,"+render(dp.Attributes)] = dp.Value
				}
			}
			return true
		})
		return vals
	}

	vals := observe(ob)
	for k, w := range map[string]float64{
		"messages,messaging.destination.name=x,oncommit.state=blocked": 2,
		"messages,messaging.destination.name=y,oncommit.state=blocked": 1,
		"messages,messaging.destination.name=x,oncommit.state=dead":    1,
		"keys,messaging.destination.name=x,oncommit.state=held":        1,
		"keys,messaging.destination.name=x,oncommit.state=blocked":     1,
		"keys,messaging.destination.name=y,oncommit.state=held":        1,
		"keys,messaging.destination.name=y,oncommit.state=blocked":     0,
		"oldest_blocked,messaging.destination.name=y":                  0,
	} {
		if v, ok := vals[k]; !ok || v != w {
			t.Errorf("%s = %v (reported: %v), want %v", k, v, ok, w)
		}
	}
	if age := vals["oldest_blocked,messaging.destination.name=x"]; age <= 0 || age > 60 {
		t.Errorf("the oldest blocked key of x: %vs, want the age of H's head", age)
	}

	plain, err := outbox.New(postgres.Dialect(), outbox.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	for k := range observe(plain) {
		if k == "messages,messaging.destination.name=x,oncommit.state=blocked" || k[:5] == "keys," || k[:7] == "oldest_" {
			t.Errorf("an Outbox without OrderByKey reports %s", k)
		}
	}
}
