package sqlbuild

import (
	"context"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

// ByKind splits settlements by outcome, keeping their order.
func ByKind(s []outbox.Settlement) (done, retry, dead []outbox.Settlement) {
	for _, x := range s {
		switch x.Kind {
		case outbox.SettleDone:
			done = append(done, x)
		case outbox.SettleRetry:
			retry = append(retry, x)
		case outbox.SettleDead:
			dead = append(dead, x)
		}
	}
	return done, retry, dead
}

// ByAttempts groups settlements by their attempts, in the order each value
// first appears. Settlements mostly share their attempts, so a dialect
// that fences with "attempts = N" writes one statement per group, usually
// one.
func ByAttempts(s []outbox.Settlement) [][]outbox.Settlement {
	var groups [][]outbox.Settlement
next:
	for _, x := range s {
		for i, g := range groups {
			if g[0].Attempts == x.Attempts {
				groups[i] = append(g, x)
				continue next
			}
		}
		groups = append(groups, []outbox.Settlement{x})
	}
	return groups
}

// FencesOf returns the fences of s.
func FencesOf(s []outbox.Settlement) []outbox.Fence {
	fs := make([]outbox.Fence, len(s))
	for i := range s {
		fs[i] = s[i].Fence
	}
	return fs
}

// Successes returns fences as successes to settle.
func Successes(fs []outbox.Fence) []outbox.Settlement {
	s := make([]outbox.Settlement, len(fs))
	for i, f := range fs {
		s[i] = outbox.Settlement{Fence: f, Kind: outbox.SettleDone}
	}
	return s
}

// Stats runs a per-topic statistics query whose rows are (topic, pending,
// processing, delivered, dead, age of the oldest due pending message as an
// integer number of unit).
func Stats(ctx context.Context, db outbox.DB, q string, unit time.Duration) ([]outbox.TopicStats, error) {
	rows, err := db.QueryDB(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []outbox.TopicStats
	for rows.Next() {
		var s outbox.TopicStats
		var age int64
		if err := rows.Scan(&s.Topic, &s.Pending, &s.Processing, &s.Delivered, &s.Dead, &age); err != nil {
			return nil, err
		}
		s.OldestPending = time.Duration(age) * unit
		out = append(out, s)
	}
	return out, rows.Err()
}
