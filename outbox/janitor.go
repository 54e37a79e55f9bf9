package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// keyTrimBatch is how many rows of an ordered outbox's keys table one
// transaction of the janitor's key trim deletes at most: each batch is
// short, and a pass runs batches until one is not full or the command
// timeout ends it.
const keyTrimBatch = 1000

// janitorRuns reports whether the janitor has work: purging delivered
// messages (KeepDelivered, not Forever) or trimming the keys table of
// ordered delivery (OrderByKey, on a dialect that is a KeyTrimmer).
func (r *Relay) janitorRuns() bool {
	return r.purges() || r.keyTrimmer() != nil
}

func (r *Relay) purges() bool { return r.cfg.KeepDelivered > 0 && r.cfg.KeepDelivered != Forever }

// keyTrimmer returns the dialect's KeyTrimmer when this relay orders by
// key, else nil.
func (r *Relay) keyTrimmer() outboxdriver.KeyTrimmer {
	if r.ord == nil {
		return nil
	}
	kt, _ := r.ord.od.(outboxdriver.KeyTrimmer)
	return kt
}

// janitorLoop purges delivered messages older than KeepDelivered and trims
// the keys table of ordered delivery, every JanitorEvery.
func (r *Relay) janitorLoop(ctx context.Context) {
	tick(ctx, r.cfg.JanitorEvery, func() {
		if r.purges() {
			r.purgeDelivered(ctx)
		}
		if kt := r.keyTrimmer(); kt != nil {
			r.trimKeys(ctx, kt)
		}
	})
}

// purgeDelivered is the janitor's purge of delivered messages.
func (r *Relay) purgeDelivered(ctx context.Context) {
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
}

// trimKeys is the janitor's trim of the keys table: batches of
// keyTrimBatch until one is not full, within one command timeout.
func (r *Relay) trimKeys(ctx context.Context, kt outboxdriver.KeyTrimmer) {
	jctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	var total int64
	for {
		n, err := kt.TrimKeys(jctx, r.db, r.ob.table, keyTrimBatch)
		total += n
		if err != nil && ctx.Err() != nil {
			return // the relay stops
		}
		if err != nil {
			err = wrapOp(jctx, "trim keys", r.d.Classify(err))
			if total > 0 && errors.Is(err, context.DeadlineExceeded) {
				r.log.Info("outbox: trimmed key rows until the command timeout; the next round continues", "count", total)
			} else {
				r.log.Error("outbox: trimming key rows failed", "err", err, "count", total)
			}
			return
		}
		if n < keyTrimBatch || ctx.Err() != nil {
			break
		}
	}
	if total > 0 {
		r.log.Debug("outbox: trimmed key rows", "count", total)
	}
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
