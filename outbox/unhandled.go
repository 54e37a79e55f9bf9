package outbox

import (
	"context"
	"slices"
	"time"
)

// unhandledAge is how long a due message of a topic without a handler in
// this relay must have waited before the relay warns about its topic: in a
// deployment where each relay handles some topics, the other relays
// deliver theirs long before that.
func (r *Relay) unhandledAge() time.Duration { return max(time.Minute, 10*r.cfg.PollInterval) }

// unhandledFirst is how long after Run starts the relay first looks for
// unhandled topics: not at once, so a relay that starts on a large backlog
// (a deploy, a restart of every replica) spends its first seconds
// delivering rather than scanning the table.
const unhandledFirst = 5 * time.Second

// unhandledWarnEvery is how often the relay warns again about one topic.
const unhandledWarnEvery = time.Hour

// RelayStats are the counts of [Outbox.Stats] seen from one relay.
type RelayStats struct {
	// Topics are the counts of every topic in the table.
	Topics []TopicStats
	// Unhandled are the topics with due messages but no handler in this
	// relay, sorted (none with a catch-all).
	Unhandled []string
	// Idle are the topics this relay handles that have no message in the
	// table, sorted.
	Idle []string
	// UnhandledHeads are the topics without a handler in this relay whose
	// messages head ordered keys with messages behind them, sorted (none
	// with a catch-all).
	UnhandledHeads []string
}

// Stats returns [Outbox.Stats] with the topics this relay does not handle
// and those it handles that have no messages. It scans the table.
func (r *Relay) Stats(ctx context.Context) (RelayStats, error) {
	ts, err := r.ob.Stats(ctx, r.db)
	if err != nil {
		return RelayStats{}, err
	}
	rs := RelayStats{Topics: ts}
	handled, all := r.handlerTopics() // under r.mu: Stats may run while Handle does
	seen := make(map[string]bool, len(ts))
	for _, s := range ts {
		seen[s.Topic] = true
		_, ok := slices.BinarySearch(handled, s.Topic)
		ok = ok || all // the catch-all handles every topic
		if !ok && s.Due > 0 {
			rs.Unhandled = append(rs.Unhandled, s.Topic)
		}
		if !ok && s.HeldKeys > 0 {
			rs.UnhandledHeads = append(rs.UnhandledHeads, s.Topic)
		}
	}
	for _, topic := range handled {
		if !seen[topic] {
			rs.Idle = append(rs.Idle, topic)
		}
	}
	// A topic with subscribers has a TopicStats per subscriber: once each.
	slices.Sort(rs.Unhandled)
	rs.Unhandled = slices.Compact(rs.Unhandled)
	slices.Sort(rs.UnhandledHeads)
	rs.UnhandledHeads = slices.Compact(rs.UnhandledHeads)
	return rs, nil
}

// handlerTopics returns the topics with handlers of their own, sorted,
// and whether a catch-all is registered.
func (r *Relay) handlerTopics() (topics []string, all bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.topics), r.all // sorted by Handle
}

// unhandledLoop warns, through the relay's logger, about topics whose due
// messages have waited longer than unhandledAge while this relay has no
// handler for them: once unhandledFirst after Run starts, then every
// RelayConfig.UnhandledEvery, at most once an hour per topic. It costs one
// Stats query (a scan of the table) each time.
func (r *Relay) unhandledLoop(ctx context.Context) {
	warned := map[string]time.Time{}
	look := func() {
		sctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
		defer cancel()
		ts, err := r.d.Stats(sctx, r.db, r.ob.table)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Debug("outbox: looking for unhandled topics failed", "err", wrapOp(sctx, "stats", err))
			}
			return
		}
		age := r.unhandledAge()
		for _, s := range ts {
			if slices.Contains(r.topics, s.Topic) || s.OldestPending < age {
				continue
			}
			if time.Since(warned[s.Topic]) < unhandledWarnEvery {
				continue
			}
			warned[s.Topic] = time.Now()
			r.log.Warn("outbox: due messages of a topic this relay has no handler for; unless another relay handles it, they wait forever",
				"topic", s.Topic, "pending", s.Pending, "oldest", s.OldestPending)
		}
	}
	first := time.NewTimer(unhandledFirst)
	defer first.Stop()
	select {
	case <-ctx.Done():
		return
	case <-first.C:
	}
	look()
	tick(ctx, r.cfg.UnhandledEvery, look)
}
