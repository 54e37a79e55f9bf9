package sqlbuild

import (
	"context"
	"slices"

	"github.com/oncommit/oncommit/outboxdriver"
)

// PurgeBatch is the most rows one statement of a purge deletes: a short
// write that commits on its own, well within any command timeout, however
// large the backlog.
const PurgeBatch = 1000

// Batches runs batch, one statement that deletes at most size rows and
// commits, again and again until one deletes fewer than size rows, fails,
// or ctx ends. It returns the rows deleted so far, with the error that
// stopped it (ctx.Err() when ctx ended between two batches).
func Batches(ctx context.Context, size int64, batch func() (int64, error)) (int64, error) {
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := batch()
		total += n
		if err != nil || n < size {
			return total, err
		}
	}
}

// TerminalStates returns the terminal states among states (the only ones a
// purge may delete), as text, sorted and without repeats.
func TerminalStates(states []outboxdriver.State) []string {
	var out []string
	for _, s := range states {
		if s == outboxdriver.StateDelivered || s == outboxdriver.StateDead {
			out = append(out, string(s))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
