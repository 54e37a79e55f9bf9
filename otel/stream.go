package oncommitotel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/oncommit/oncommit/outbox"
)

// The gauges of a relay's message stream (PostgreSQL's WAL transport).
const (
	// MetricStreamLag is the WAL the server keeps past the position the
	// reading relay has settled, in bytes.
	MetricStreamLag = "oncommit.stream.lag"
	// MetricStreamOldestAge is the age (since commit) of the oldest
	// message the reading relay has read and not settled.
	MetricStreamOldestAge = "oncommit.stream.oldest_unsettled.age"
)

// ObserveStream reports, while r reads its dialect's message stream
// (postgres.WALDialect), the stream's lag as gauges MetricStreamLag and
// MetricStreamOldestAge; a relay that does not read it (another replica
// does) reports nothing. Call it once per relay, from the process that
// runs r; it makes no statement (the figures are those the reader keeps).
func (t *Telemetry) ObserveStream(r *outbox.Relay) error {
	if r == nil {
		return errors.New("oncommitotel: ObserveStream needs a Relay")
	}
	m := t.cfg.MeterProvider.Meter(ScopeName)
	lag, err1 := m.Int64ObservableGauge(MetricStreamLag, metric.WithUnit("By"),
		metric.WithDescription("WAL the server keeps past the position the reading relay has settled."))
	oldest, err2 := m.Float64ObservableGauge(MetricStreamOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age since commit of the oldest message the reading relay has read and not settled (0 when none)."))
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	_, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		l, reading, err := r.StreamLag(ctx)
		if err != nil || !reading {
			return nil
		}
		o.ObserveInt64(lag, l.Bytes)
		age := 0.0
		if !l.Oldest.IsZero() {
			age = max(0, time.Since(l.Oldest).Seconds())
		}
		o.ObserveFloat64(oldest, age)
		return nil
	}, lag, oldest)
	return err
}
