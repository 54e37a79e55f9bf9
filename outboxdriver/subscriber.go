package outboxdriver

import "strings"

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
