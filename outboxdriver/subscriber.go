package outboxdriver

import (
	"context"
	"strings"
)

// SubscriberSep separates a subscriber's name from the message's key in
// the message_key column (and from the dedup key in dedup_key) of a
// subscriber's copy of a message (the outbox package's
// Config.Subscribers). Messages' own keys and dedup keys may not contain
// it, so a stored key holds it exactly when its row is a subscriber's
// copy.
const SubscriberSep = '\x1f'

// MaxSubscriberBytes is the longest subscriber name.
const MaxSubscriberBytes = 64

// SubscriberKey is the stored form of key (or of a dedup key) in
// subscriber sub's copy: sub, SubscriberSep, key. A copy's stored key is
// never empty, whatever key is; its rows are ordered by the key of the
// message, so each subscriber's copies of one key have an order of their
// own.
func SubscriberKey(sub, key string) string {
	return sub + string(SubscriberSep) + key
}

// SubscriberChecker is implemented by a [RelayDialect] whose table needs
// a migration before it stores subscribers' copies (MySQL's key columns,
// widened by its migrations 0007 and 0008). The relay's start and the
// outbox package's Check call it when the Outbox has subscribers; it
// returns an error wrapping [ErrSchemaMismatch] when the table is not
// ready.
type SubscriberChecker interface {
	CheckSubscribers(ctx context.Context, db DB, t Table) error
}

// SplitSubscriberKey splits a stored key into the subscriber and the
// message's key; ok is false when stored is not a copy's (the whole of it
// is then the key).
func SplitSubscriberKey(stored string) (sub, key string, ok bool) {
	i := strings.IndexByte(stored, SubscriberSep)
	if i < 0 {
		return "", stored, false
	}
	return stored[:i], stored[i+1:], true
}
