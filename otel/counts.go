package oncommitotel

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// count is a monotonic count of one attribute set, which a delivery or a
// published message adds to with one atomic add: no call into the metrics
// SDK (whose synchronous Add normalises the attribute set and looks its
// aggregate up on every call). The SDK reads it at collection.
type count struct {
	set attribute.Set
	n   atomic.Int64
}

// countedSum is an asynchronous counter fed from counts: the exported data
// are a monotonic cumulative sum with the counter's name, unit,
// description and the counts' attribute sets, as a synchronous counter's.
// A count that is still 0 is not reported, as a synchronous counter
// reports no attribute set it was never given. Telemetries sharing a
// MeterProvider each report their own counts of the same instrument; the
// SDK adds them up.
type countedSum struct {
	inst   metric.Int64ObservableCounter
	counts cowMap[attrKey, *count]
}

// count returns k's count, made once.
func (c *countedSum) count(k attrKey) *count {
	return c.counts.get(k, func() *count { return &count{set: attrSet(k)} })
}

// observe reports every count.
func (c *countedSum) observe(o metric.Observer) {
	for _, ct := range c.counts.all() {
		if n := ct.n.Load(); n > 0 {
			o.ObserveInt64(c.inst, n, metric.WithAttributeSet(ct.set))
		}
	}
}

// countedSums makes the counted sums' instruments, with one callback.
func countedSums(m metric.Meter, sums ...countedSumSpec) error {
	insts := make([]metric.Observable, 0, len(sums))
	for _, s := range sums {
		inst, err := m.Int64ObservableCounter(s.name, metric.WithUnit(s.unit), metric.WithDescription(s.desc))
		if err != nil {
			return err
		}
		s.sum.inst = inst
		insts = append(insts, inst)
	}
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, s := range sums {
			s.sum.observe(o)
		}
		return nil
	}, insts...)
	return err
}

// countedSumSpec is a counted sum to make.
type countedSumSpec struct {
	sum              *countedSum
	name, unit, desc string
}
