package outboxdriver

import (
	"context"
	"time"
)

// Inspector is implemented by a [RelayDialect] that lets operators look at
// single messages and act on them: the outbox package's List, Count, Get
// and Act, the CLI and the dashboard use it. The outbox package validates
// every [Filter] before it reaches the dialect, so a dialect may rely on
// its States being known states, its IDs at most [MaxFilterIDs], and its
// times in order.
type Inspector interface {
	// List returns at most limit messages matching f with an id greater
	// than f.After, in id order (ids are time-ordered, so this is creation
	// order). Paging by the last id returned is stable under concurrent
	// inserts: new messages have greater ids than the ones already listed,
	// so a page never repeats or skips a message that existed when the
	// listing began. Payloads are left out unless withPayload.
	List(ctx context.Context, db DB, t Table, f Filter, limit int, withPayload bool) ([]MessageInfo, error)

	// Count returns how many messages match f (f.After included).
	Count(ctx context.Context, db DB, t Table, f Filter) (int64, error)

	// Act applies a to the messages matching f that are in a's source
	// state (see [Action]), in batches of at most a few thousand rows,
	// each one statement or one short transaction that commits on its own
	// and re-checks the source state of every row it changes: a message
	// whose state changed since it was read is left as it is. It repeats
	// until a batch finds nothing more to change or ctx ends, and returns
	// how many messages it changed: on an error, the count so far with it.
	Act(ctx context.Context, db DB, t Table, a Action, f Filter) (int64, error)
}

// Action is what [Inspector.Act] does to each message it selects.
type Action int

// The actions. Each names the only state it changes a message from.
const (
	// ActRedrive makes a dead message pending, due now, with attempts_base
	// = attempts (fresh attempts; attempts itself never decreases), its
	// settled_at and last_error cleared.
	ActRedrive Action = iota + 1
	// ActRetry makes a pending message that is not yet due (waiting for a
	// retry or scheduled later) due now.
	ActRetry
	// ActDelete deletes a message in any state but processing (a message
	// a handler is running is never deleted under it).
	ActDelete
	// ActSkip skips dead messages that halt their key (ordered delivery,
	// HaltKey): each stays dead and its key's next message becomes the
	// head. It is never passed to [Inspector.Act]: the outbox package
	// runs it through [OrderedDialect.SkipHead], one key at a time.
	ActSkip
)

// String returns "redrive", "retry", "delete" or "skip".
func (a Action) String() string {
	switch a {
	case ActSkip:
		return "skip"
	case ActRedrive:
		return "redrive"
	case ActRetry:
		return "retry"
	case ActDelete:
		return "delete"
	}
	return "unknown"
}

// MaxFilterIDs is the most ids one [Filter] may name.
const MaxFilterIDs = 1000

// Filter selects messages. Its zero value selects every message; each set
// field narrows the selection (the conditions are ANDed).
type Filter struct {
	// IDs, when not empty, selects only these messages.
	IDs []ID
	// States, when not empty, selects only messages in one of these states.
	States []State
	// Topic, when not empty, selects only this topic (byte for byte).
	Topic string
	// Key, when not empty, selects only messages with this key (with
	// Subscriber: that subscriber's copies of the messages with this key).
	Key string
	// Subscriber, when not empty, selects only the copies of this
	// subscriber (see the outbox package's Config.Subscribers).
	Subscriber string
	// ErrorContains, when not empty, selects only messages whose last
	// error contains this text (case-sensitive).
	ErrorContains string
	// CreatedFrom and CreatedTo, when not zero, select messages created
	// at or after CreatedFrom and before CreatedTo.
	CreatedFrom, CreatedTo time.Time
	// SettledFrom and SettledTo, when not zero, select messages settled
	// (dead-lettered, or delivered with KeepDelivered) at or after
	// SettledFrom and before SettledTo; messages never settled do not
	// match.
	SettledFrom, SettledTo time.Time
	// After, when not zero, selects messages with a greater id: the
	// cursor of the next page of a listing.
	After ID
}

// MessageInfo is one message as stored, for operators.
type MessageInfo struct {
	ID    ID
	Topic string
	// Subscriber is the subscriber a copy is for (see the outbox
	// package's Config.Subscribers), "" for a message without subscribers.
	// Key and DedupKey are then the message's, without the subscriber.
	Subscriber string
	Key        string // "" when NULL
	Payload    []byte // nil when NULL or not asked for
	Headers    []byte // JSON object, nil when NULL or not asked for
	DedupKey   string // "" when NULL
	State      State
	// Attempts counts every claim of the message; AttemptsBase is
	// Attempts when it was last redriven. Attempts - AttemptsBase is the
	// attempt its handler last saw.
	Attempts     int
	AttemptsBase int
	// AvailableAt is when the message is due (pending) or its lease
	// lapses (processing).
	AvailableAt time.Time
	CreatedAt   time.Time
	SettledAt   time.Time // zero when never settled
	LastError   string
	// KeySeq is the message's place in its key when it is ordered (see
	// [OrderedDialect]): its key_seq, 0 when it is not ordered.
	KeySeq int64
}

// HaltsKey reports whether m is the dead head that halts its ordered key
// (dead under the Halt policy, neither skipped nor redriven): the key's
// other messages wait, blocked, until it is skipped or redriven. A dead
// ordered message that no longer halts its key (dead under Continue, or
// skipped) has a settled time; a halted head has none.
func (m MessageInfo) HaltsKey() bool {
	return m.State == StateDead && m.KeySeq != 0 && m.SettledAt.IsZero()
}
