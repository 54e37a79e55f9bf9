package outbox

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// Claims in windows (a dialect with outboxdriver.WindowedClaimer:
// PostgreSQL).
//
// A claim without a window reads the claim index from its start. Every
// delivered message leaves index entries behind it (the row as published
// and as claimed), which VACUUM removes only once no snapshot older than
// the delete is open: while one is (a long REPEATABLE READ transaction,
// pg_dump, an idle-in-transaction session, a replication slot's or a
// standby's xmin), each claim walks all of them and checks each against
// the heap, and its cost grows with the age of that snapshot.
//
// probeLoop measures that: now and then it looks for the oldest due row
// as a claim without a window would (OldestDue, which locks nothing) and
// notes the server time the look took. While that is over windowOn, the
// relay claims from a window: the rows due since its last claim that took
// fewer rows than its limit (that claim took every row of its window it
// could lock), less windowMargin for publishes whose transactions began
// before it and committed after it; every wideEvery, a claim's window
// reaches windowWide further back. A claim that fills its limit leaves
// the window where it was, so a backlog is claimed from its oldest row.
// A row due before the window (a publish whose transaction outlasted the
// margins, a NotBefore in the past, a row locked by another statement when
// the window passed it) is found by the probe: the next claim's window
// then reaches back to it. With a clean table the look is quick and the
// claims take every due row, as they always did.

// The windows' parameters (see above).
const (
	windowOn     = 5 * time.Millisecond
	windowOff    = 2 * time.Millisecond
	windowMargin = 25 * time.Millisecond
	windowWide   = time.Second
	wideEvery    = 500 * time.Millisecond
)

// probeMeasure is the probe's interval while claims have no window (it
// only measures what a claim from the index's head costs), when the poll
// interval is shorter.
const probeMeasure = time.Second

// probeShare bounds the probe's share of the time: after a look that took
// d, the next comes after max(PollInterval, probeShare*d), and no kick
// brings it sooner.
const probeShare = 50

// claimWindow is a relay's window state.
type claimWindow struct {
	wc outboxdriver.WindowedClaimer // nil: claims take every due row
	// on is set while the probe finds claims without a window dear, and
	// always when always is (tests).
	on     atomic.Bool
	always bool
	// since is the send time of the last claim that took fewer rows than
	// its limit, zero until one has (claim loop only); sinceNano is it
	// for probeLoop, in unix nanoseconds.
	since     time.Time
	sinceNano atomic.Int64
	// wide is when a claim's window last reached windowWide back.
	wide time.Time
	// pull is when the oldest due row a probe found before the window
	// became due (unix nanoseconds), 0 for none.
	pull atomic.Int64
	// recent is the window of the claim being made (claim loop only).
	recent time.Duration
	// probes counts the probes that found a row before the window (for
	// tests).
	probes atomic.Int64
	// kick asks for a probe now (as soon as probeShare allows): the claim
	// loop kicks while it follows up a coalesced notification, whose
	// silent publishes may commit long after their transactions began.
	kick chan struct{}
}

// next sets the window of a claim sent at now.
func (w *claimWindow) next(now time.Time) {
	w.recent = 0
	if w.wc == nil {
		return
	}
	if p := w.pull.Swap(0); p != 0 && (w.since.IsZero() || p < w.since.UnixNano()) {
		w.since = time.Unix(0, p)
	}
	if w.since.IsZero() || !w.on.Load() {
		return
	}
	margin := windowMargin
	if now.Sub(w.wide) >= wideEvery {
		margin, w.wide = windowWide, now
	}
	w.recent = now.Sub(w.since) + margin
}

// claimed records a claim sent at sent that took n rows of limit.
func (w *claimWindow) claimed(sent time.Time, n, limit int) {
	if w.wc != nil && n < limit {
		w.since = sent
		w.sinceNano.Store(sent.UnixNano())
	}
}

// kickProbe asks probeLoop for a probe without blocking.
func (w *claimWindow) kickProbe() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// probeLoop asks the dialect now and then for the oldest due row of the
// relay's topics, and pulls the claims' window back to it when it lies
// before the window.
func (r *Relay) probeLoop(ctx context.Context) {
	w := &r.win
	p := outboxdriver.ClaimParams{Topics: r.topics, AllTopics: r.all}
	t := time.NewTimer(r.cfg.PollInterval)
	defer t.Stop()
	var earliest time.Time // no probe before: probeShare after the last
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.kick:
			if !w.on.Load() {
				continue // the claims take every due row: nothing to find
			}
			if wait := time.Until(earliest); wait > 0 {
				resetTimer(t, wait)
				continue
			}
		}
		since := w.sinceNano.Load()
		if since == 0 {
			resetTimer(t, r.cfg.PollInterval) // the claims take every due row
			continue
		}
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
		due, err := w.wc.OldestDue(pctx, r.db, r.ob.table, p)
		cancel()
		spacing := probeShare * time.Since(start)
		earliest = start.Add(spacing)
		every := r.cfg.PollInterval
		if !w.on.Load() && !w.always {
			// Only measuring: the claims take every due row.
			every = max(every, probeMeasure)
		}
		resetTimer(t, max(every, spacing))
		if err != nil {
			if ctx.Err() == nil {
				r.log.Debug("outbox: looking for due messages before the claims' window failed", "err", r.d.Classify(err))
			}
			continue
		}
		switch {
		case due.Took >= windowOn && !w.on.Load():
			w.on.Store(true)
			r.log.Debug("outbox: claiming in windows: a claim from the start of the claim index is slow (dead index entries an old snapshot keeps)", "look_took", due.Took)
		case due.Took < windowOff && w.on.Load() && !w.always:
			w.on.Store(false)
			r.log.Debug("outbox: claiming without windows again", "look_took", due.Took)
		}
		if at := start.Add(-due.Age).UnixNano(); due.Found && w.on.Load() && at < since-int64(windowMargin) {
			for {
				cur := w.pull.Load()
				if (cur != 0 && cur <= at) || w.pull.CompareAndSwap(cur, at) {
					break
				}
			}
			w.probes.Add(1)
			r.signal()
		}
	}
}
