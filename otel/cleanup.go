package oncommitotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/metric"

	"github.com/oncommit/oncommit/outbox"
)

// The gauges of what keeps the outbox table's deleted rows (PostgreSQL).
const (
	// MetricTableDeadRows is the outbox table's dead row versions, as the
	// database last counted them.
	MetricTableDeadRows = "oncommit.table.dead_rows"
	// MetricTableHorizonAge is how long the oldest snapshot or
	// transaction holding back the table's cleanup has held, 0 when none.
	MetricTableHorizonAge = "oncommit.table.horizon.age"
)

// ObserveCleanup reports r's last reading of its table's cleanup
// (outbox.Health's Cleanup) as gauges MetricTableDeadRows and
// MetricTableHorizonAge, once r has read it. Call it once per relay, from
// the process that runs r; it makes no statement.
func (t *Telemetry) ObserveCleanup(r *outbox.Relay) error {
	if r == nil {
		return errors.New("oncommitotel: ObserveCleanup needs a Relay")
	}
	m := t.cfg.MeterProvider.Meter(ScopeName)
	dead, err1 := m.Int64ObservableGauge(MetricTableDeadRows, metric.WithUnit("{row}"),
		metric.WithDescription("Dead row versions in the outbox table, as the database last counted them."))
	age, err2 := m.Float64ObservableGauge(MetricTableHorizonAge, metric.WithUnit("s"),
		metric.WithDescription("How long the oldest snapshot holding back the outbox table's cleanup has held (0 when none)."))
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	_, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		c := r.Health().Cleanup
		if c.CheckedAt.IsZero() || c.LastError != nil {
			return nil
		}
		o.ObserveInt64(dead, c.DeadRows)
		o.ObserveFloat64(age, c.HolderAge.Seconds())
		return nil
	}, dead, age)
	return err
}
