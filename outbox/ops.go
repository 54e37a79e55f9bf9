package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/oncommit/oncommit/internal/opfmt"
	"github.com/oncommit/oncommit/outboxdriver"
)

// PurgeOptions say which messages [Outbox.Purge] deletes.
type PurgeOptions struct {
	// States are the terminal states to purge: StateDead, StateDelivered
	// or both. Defaults to both.
	States []State
	// OlderThan keeps messages settled more recently than this. Defaults to 0:
	// every message in those states.
	OlderThan time.Duration
	// Operator, when not nil, logs the purge as [Outbox.Act] logs an
	// action. Defaults to nil: not logged.
	Operator *ActOptions
}

func (o *Outbox) relayDialect() (outboxdriver.RelayDialect, error) {
	rd, ok := o.d.(outboxdriver.RelayDialect)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoRelay, o.d.Name())
	}
	return rd, nil
}

// Purge deletes dead and/or delivered messages settled more than
// opts.OlderThan ago, and returns how many it deleted. It commits in short
// batches: on an error it returns the count so far with the error. On
// PostgreSQL a Purge that finds another under way leaves the rest to it.
func (o *Outbox) Purge(ctx context.Context, db DB, opts PurgeOptions) (int64, error) {
	rd, err := o.relayDialect()
	if err != nil {
		return 0, err
	}
	if opts.OlderThan < 0 {
		return 0, &ConfigError{Field: "OlderThan", Reason: "must not be negative"}
	}
	states := opts.States
	if len(states) == 0 {
		states = []State{StateDead, StateDelivered}
	}
	for _, s := range states {
		if s != StateDead && s != StateDelivered {
			return 0, &ConfigError{Field: "States", Reason: fmt.Sprintf("%q is not a terminal state (dead, delivered)", s)}
		}
	}
	start := time.Now()
	n, err := rd.Purge(ctx, db, o.table, states, opts.OlderThan)
	if err != nil {
		err = wrapOp(ctx, "purge", o.d.Classify(err))
	}
	if opts.Operator != nil {
		o.logAction(ctx, opts.Operator, "purge", opfmt.Purge(states, opts.OlderThan), n, start, err)
	}
	return n, err
}

// Redrive makes the dead messages of topic ("" for all) pending again, due
// now, with fresh attempts (Delivery.Attempt starts at 1 again), and
// returns how many it revived. Ordered ones re-enter their keys in order.
func (o *Outbox) Redrive(ctx context.Context, db DB, topic string) (int64, error) {
	rd, err := o.relayDialect()
	if err != nil {
		return 0, err
	}
	redrive := rd.Redrive
	if od, ok := o.d.(outboxdriver.OrderedDialect); ok {
		// Ordered messages re-enter their keys in order, whether or not
		// this Outbox orders: another one on the table may (as Act does).
		redrive = od.RedriveOrdered
	}
	n, err := redrive(ctx, db, o.table, topic)
	if err != nil {
		return 0, wrapOp(ctx, "redrive", o.d.Classify(err))
	}
	return n, nil
}

// Stats returns, per topic, the messages in each state and the age of the
// oldest due pending message. It scans the table.
func (o *Outbox) Stats(ctx context.Context, db DB) ([]TopicStats, error) {
	rd, err := o.relayDialect()
	if err != nil {
		return nil, err
	}
	stats := rd.Stats
	if od := o.orderedDialect(); od != nil {
		stats = od.StatsOrdered // with blocked keys
	}
	s, err := stats(ctx, db, o.table)
	if err != nil {
		return nil, wrapOp(ctx, "stats", o.d.Classify(err))
	}
	return s, nil
}

// Check returns an error wrapping [ErrTableMissing] or [ErrSchemaMismatch]
// when the table is missing or needs the migrations, as [Relay.Run] does
// at its start. It reads no row.
func (o *Outbox) Check(ctx context.Context, db DB) error {
	rd, err := o.relayDialect()
	if err != nil {
		return err
	}
	err = rd.Check(ctx, db, o.table)
	if od := o.orderedDialect(); err == nil && od != nil {
		err = od.CheckOrdered(ctx, db, o.table)
	}
	if err == nil {
		err = o.checkSubscribers(ctx, db)
	}
	if err != nil {
		return wrapOp(ctx, "check", fmt.Errorf("%w (table %s)", err, o.table))
	}
	return nil
}
