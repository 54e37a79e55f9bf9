package sqlbuild

import (
	"context"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// ByKind splits settlements by outcome, keeping their order.
func ByKind(s []outboxdriver.Settlement) (done, retry, dead []outboxdriver.Settlement) {
	for _, x := range s {
		switch x.Kind {
		case outboxdriver.SettleDone:
			done = append(done, x)
		case outboxdriver.SettleRetry:
			retry = append(retry, x)
		case outboxdriver.SettleDead:
			dead = append(dead, x)
		}
	}
	return done, retry, dead
}

// ByAttempts groups settlements by their attempts, in the order each value
// first appears. Settlements mostly share their attempts, so a dialect
// that fences with "attempts = N" writes one statement per group, usually
// one.
func ByAttempts(s []outboxdriver.Settlement) [][]outboxdriver.Settlement {
	var groups [][]outboxdriver.Settlement
next:
	for _, x := range s {
		for i, g := range groups {
			if g[0].Attempts == x.Attempts {
				groups[i] = append(g, x)
				continue next
			}
		}
		groups = append(groups, []outboxdriver.Settlement{x})
	}
	return groups
}

// FencesOf returns the fences of s.
func FencesOf(s []outboxdriver.Settlement) []outboxdriver.Fence {
	fs := make([]outboxdriver.Fence, len(s))
	for i := range s {
		fs[i] = s[i].Fence
	}
	return fs
}

// Successes returns fences as successes to settle.
func Successes(fs []outboxdriver.Fence) []outboxdriver.Settlement {
	s := make([]outboxdriver.Settlement, len(fs))
	for i, f := range fs {
		s[i] = outboxdriver.Settlement{Fence: f, Kind: outboxdriver.SettleDone}
	}
	return s
}

// Stats runs a per-topic statistics query whose rows are (topic,
// subscriber (empty for none), pending,
// processing, delivered, dead, due (pending and due now), age of the
// oldest due pending message as an integer number of unit).
func Stats(ctx context.Context, db outboxdriver.DB, q string, unit time.Duration) ([]outboxdriver.TopicStats, error) {
	rows, err := db.QueryDB(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []outboxdriver.TopicStats
	for rows.Next() {
		var s outboxdriver.TopicStats
		var age int64
		if err := rows.Scan(&s.Topic, &s.Subscriber, &s.Pending, &s.Processing, &s.Delivered, &s.Dead, &s.Due, &age); err != nil {
			return nil, err
		}
		s.OldestPending = time.Duration(age) * unit
		out = append(out, s)
	}
	return out, rows.Err()
}

// OrderedStats adds to ts (from Stats) the fields of ordered delivery,
// from a query whose rows are (topic, subscriber, blocked messages, held keys,
// blocked keys, age of the oldest blocked key's head as an integer number
// of unit); a topic with only blocked messages, not in ts, is appended.
func OrderedStats(ctx context.Context, db outboxdriver.DB, q string, ts []outboxdriver.TopicStats, unit time.Duration) ([]outboxdriver.TopicStats, error) {
	type topicSub struct{ topic, sub string }
	at := make(map[topicSub]int, len(ts))
	for i := range ts {
		at[topicSub{ts[i].Topic, ts[i].Subscriber}] = i
	}
	rows, err := db.QueryDB(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var s outboxdriver.TopicStats
		var age int64
		if err := rows.Scan(&s.Topic, &s.Subscriber, &s.Blocked, &s.HeldKeys, &s.BlockedKeys, &age); err != nil {
			return nil, err
		}
		i, found := at[topicSub{s.Topic, s.Subscriber}]
		if !found {
			i = len(ts)
			ts = append(ts, outboxdriver.TopicStats{Topic: s.Topic, Subscriber: s.Subscriber})
		}
		ts[i].Blocked, ts[i].HeldKeys, ts[i].BlockedKeys = s.Blocked, s.HeldKeys, s.BlockedKeys
		ts[i].OldestBlockedKey = time.Duration(age) * unit
	}
	return ts, rows.Err()
}
