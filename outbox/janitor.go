package outbox

import (
	"context"
	"errors"
	"time"
)

// janitorLoop purges delivered messages older than KeepDelivered.
func (r *Relay) janitorLoop(ctx context.Context) {
	tick(ctx, r.cfg.JanitorEvery, func() {
		jctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
		n, err := r.d.Purge(jctx, r.db, r.ob.table, []State{StateDelivered}, r.cfg.KeepDelivered)
		if err != nil {
			err = wrapOp(jctx, "purge", r.d.Classify(err))
		}
		cancel()
		switch {
		case err != nil && n > 0 && errors.Is(err, context.DeadlineExceeded):
			// The batches made progress; the next round goes on.
			r.log.Info("outbox: purged delivered messages until the command timeout; the next round continues", "count", n)
		case err != nil:
			r.log.Error("outbox: purging delivered messages failed", "err", err, "count", n)
		case n > 0:
			r.log.Debug("outbox: purged delivered messages", "count", n)
		}
	})
}

// tick calls f every d until ctx ends.
func tick(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}
