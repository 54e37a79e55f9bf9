package outbox

import (
	"context"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// horizonWarnAfter is how long a holder of the MVCC horizon may hold
// before the relay warns about it (once per holder).
const horizonWarnAfter = time.Minute

// cleanupEvery is how often the relay reads its table's cleanup: ten poll
// intervals, between half a second and 30 seconds.
func (r *Relay) cleanupEvery() time.Duration {
	return min(max(10*r.cfg.PollInterval, 500*time.Millisecond), 30*time.Second)
}

// cleanupLoop reads what keeps the table's deleted rows into
// Health.Cleanup, and warns once when autovacuum is off and once per
// holder of the horizon that has held for horizonWarnAfter.
func (r *Relay) cleanupLoop(ctx context.Context, cr outboxdriver.CleanupReader) {
	t := time.NewTimer(0)
	defer t.Stop()
	var holder string      // the holder last seen
	var seen time.Time     // when it was first seen
	var warned, avOff bool // warned about holder; about autovacuum
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(r.cleanupEvery())
		rctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
		c, err := cr.ReadCleanup(rctx, r.db, r.ob.table)
		cancel()
		now := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			err = wrapOp(ctx, "read the table's cleanup", r.d.Classify(err))
			r.health.set(func(h *Health) { h.Cleanup.CheckedAt, h.Cleanup.LastError = now, err })
			continue
		}
		if c.Holder != holder {
			holder, seen, warned = c.Holder, now, false
		}
		if c.HolderAge == 0 && holder != "" {
			c.HolderAge = now.Sub(seen)
		}
		r.health.set(func(h *Health) {
			h.Cleanup = CleanupHealth{CheckedAt: now, DeadRows: c.DeadRows, AutovacuumOff: c.AutovacuumOff,
				Holder: c.Holder, HolderAge: c.HolderAge, HolderXIDs: c.HolderXIDs}
		})
		if c.AutovacuumOff && !avOff {
			r.log.Warn("outbox: autovacuum is off for the outbox table or the server: only a VACUUM someone runs removes the rows delivered messages leave", "table", r.ob.table.String(), "dead_rows", c.DeadRows)
		}
		avOff = c.AutovacuumOff
		warnAfter := horizonWarnAfter
		if r.horizonWarn > 0 {
			warnAfter = r.horizonWarn
		}
		if holder != "" && !warned && c.HolderAge >= warnAfter {
			warned = true
			r.log.Warn("outbox: an old snapshot holds back cleanup of the outbox table: its dead rows stay until it ends", "holder", holder, "held_for", c.HolderAge.Round(time.Second), "xmin_age", c.HolderXIDs, "dead_rows", c.DeadRows, "table", r.ob.table.String())
		}
	}
}
