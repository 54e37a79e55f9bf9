package outbox

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds fan-out: topics with several subscribers
// (Config.Subscribers). Publish stores one copy of such a topic's message
// per subscriber, in the same statement; each copy is a message of its
// own (id, attempts, backoff, dead letter, place in its key's order), so
// one subscriber's failures never deliver again to another. A copy's
// message_key column holds its subscriber before the message's key
// (outboxdriver.SubscriberKey), which is how claims, ordering and the
// operators' statements tell the copies apart without a column of their
// own.

// subscriberSep is outboxdriver.SubscriberSep, reserved in keys.
const subscriberSep = outboxdriver.SubscriberSep

// checkSubscribers validates Config.Subscribers and returns a copy (the
// caller's map and slices may change later).
func checkSubscribers(in map[string][]string) (map[string][]string, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make(map[string][]string, len(in))
	for topic, subs := range in {
		if err := checkText(0, "Topic", topic, MaxTopicBytes, true); err != nil {
			return nil, &ConfigError{Field: "Subscribers", Reason: fmt.Sprintf("topic %q: %s", topic, err.(*MessageError).Reason)}
		}
		if topic == AllTopics {
			return nil, &ConfigError{Field: "Subscribers", Reason: "the catch-all topic " + AllTopics + " cannot have subscribers: name the topics"}
		}
		if len(subs) == 0 {
			return nil, &ConfigError{Field: "Subscribers", Reason: fmt.Sprintf("topic %q: no subscribers", topic)}
		}
		seen := make(map[string]bool, len(subs))
		for _, s := range subs {
			if reason := checkSubscriberName(s); reason != "" {
				return nil, &ConfigError{Field: "Subscribers", Reason: fmt.Sprintf("topic %q: subscriber %q: %s", topic, s, reason)}
			}
			if seen[s] {
				return nil, &ConfigError{Field: "Subscribers", Reason: fmt.Sprintf("topic %q: subscriber %q named twice", topic, s)}
			}
			seen[s] = true
		}
		out[topic] = slices.Clone(subs)
	}
	return out, nil
}

// checkSubscriberName returns why s cannot name a subscriber, "" when it
// can: 1 to MaxSubscriberBytes of ASCII letters, digits, '.', '_', '-'.
func checkSubscriberName(s string) string {
	if s == "" {
		return "must not be empty"
	}
	if len(s) > outboxdriver.MaxSubscriberBytes {
		return fmt.Sprintf("longer than %d bytes", outboxdriver.MaxSubscriberBytes)
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return "only ASCII letters, digits, '.', '_' and '-'"
		}
	}
	return ""
}

// Subscribers returns the subscribers of topic (Config.Subscribers), nil
// for a topic without.
func (o *Outbox) Subscribers(topic string) []string {
	return slices.Clone(o.subs[topic])
}

// copies returns how many rows msgs take: one per message, one per
// subscriber for a message of a topic with subscribers.
func (o *Outbox) copies(msgs []Message) int {
	n := len(msgs)
	if o.subs == nil {
		return n
	}
	for i := range msgs {
		if s := o.subs[msgs[i].Topic]; len(s) > 0 {
			n += len(s) - 1
		}
	}
	return n
}

// checkSubscribers runs the dialect's SubscriberChecker, when the Outbox
// has subscribers and the dialect one.
func (o *Outbox) checkSubscribers(ctx context.Context, db DB) error {
	if sc, ok := o.d.(outboxdriver.SubscriberChecker); ok && o.subs != nil {
		return sc.CheckSubscribers(ctx, db, o.table)
	}
	return nil
}

// anySubscribed reports whether a message of msgs has a topic with
// subscribers.
func (o *Outbox) anySubscribed(msgs []Message) bool {
	for i := range msgs {
		if len(o.subs[msgs[i].Topic]) > 0 {
			return true
		}
	}
	return false
}

// fanOut turns rows[k], the row of a message of a topic with subscribers
// subs, into the copies rows[k:k+len(subs)], each with its subscriber
// before its key and its dedup key.
func fanOut(rows []outboxdriver.Row, k int, subs []string) {
	base := rows[k]
	for j, s := range subs {
		r := &rows[k+j]
		*r = base
		r.Key = outboxdriver.SubscriberKey(s, base.Key)
		if base.DedupKey != "" {
			r.DedupKey = outboxdriver.SubscriberKey(s, base.DedupKey)
		}
	}
}

// checkReserved refuses a key or dedup key holding the subscriber
// separator.
func checkReserved(idx int, m *Message) error {
	for _, f := range [...]struct{ field, s string }{{"Key", m.Key}, {"DedupKey", m.DedupKey}} {
		if strings.IndexByte(f.s, subscriberSep) >= 0 {
			return &MessageError{idx, f.field, "contains U+001F (the unit separator), reserved for subscribers' copies"}
		}
	}
	return nil
}

// splitSubscriber sets d's Subscriber and Key from the stored key in
// d.Key.
func (d *Delivery) splitSubscriber() {
	if sub, key, ok := outboxdriver.SplitSubscriberKey(d.Key); ok {
		d.Subscriber, d.Key = sub, key
	}
}

// subscriberOf returns the subscriber of a stored key, "" for none.
func subscriberOf(storedKey string) string {
	sub, _, _ := outboxdriver.SplitSubscriberKey(storedKey)
	return sub
}

// Subscribe registers h as subscriber's handler for topic, before Run: it
// gets that subscriber's copies of the topic's messages (see
// Config.Subscribers), with Delivery.Subscriber set. A relay that claims
// such a topic (with one of its subscribers, or with a catch-all) must
// handle every subscriber of it: Run refuses otherwise. It returns a
// [*ConfigError] for a topic or subscriber not in Config.Subscribers or a
// nil handler, or an error wrapping [ErrDuplicateHandler] or
// [ErrRelayStarted].
func (r *Relay) Subscribe(topic, subscriber string, h Handler) error {
	if h == nil {
		return &ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	if err := r.checkSubscriber(topic, subscriber); err != nil {
		return err
	}
	h, err := r.wrapHandler(h)
	if err != nil {
		return err
	}
	return r.addSubscription(topic, subscriber, subscription{h: h})
}

// SubscribeBatch registers h as subscriber's batch handler for topic, as
// [Relay.Subscribe] does: h gets that subscriber's copies of each claim
// at once, as a [Relay.HandleBatch] handler gets a topic's messages (a
// forwarder's Handler, say).
func (r *Relay) SubscribeBatch(topic, subscriber string, h BatchHandler) error {
	if h == nil {
		return &ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	if err := r.checkSubscriber(topic, subscriber); err != nil {
		return err
	}
	return r.addSubscription(topic, subscriber, subscription{b: &batchHandler{h: h}})
}

// subscription is a subscriber's handler: h or b.
type subscription struct {
	h Handler
	b *batchHandler
}

func (r *Relay) checkSubscriber(topic, subscriber string) error {
	if !slices.Contains(r.ob.subs[topic], subscriber) {
		return &ConfigError{Field: "subscriber", Reason: fmt.Sprintf("%q is not a subscriber of topic %q in Config.Subscribers", subscriber, topic)}
	}
	return nil
}

// addSubscription records s for subscriber of topic, under r.mu.
func (r *Relay) addSubscription(topic, subscriber string, s subscription) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return ErrRelayStarted
	}
	if _, dup := r.subs[topic][subscriber]; dup {
		return fmt.Errorf("%w: %q, subscriber %q", ErrDuplicateHandler, topic, subscriber)
	}
	if r.subs == nil {
		r.subs = map[string]map[string]subscription{}
	}
	if r.subs[topic] == nil {
		r.subs[topic] = map[string]subscription{}
		r.addTopic(topic)
	}
	r.subs[topic][subscriber] = s
	r.batchSubs = r.batchSubs || s.b != nil
	return nil
}

// anyBatch reports whether some handler is a batch handler (written
// before Run only).
func (r *Relay) anyBatch() bool { return len(r.batches) > 0 || r.batchSubs }

// checkSubscribed refuses to run a relay that would claim copies of a
// subscriber it has no handler for (under r.mu).
func (r *Relay) checkSubscribed() error {
	for topic, subs := range r.ob.subs {
		if r.subs[topic] == nil && !r.all {
			continue
		}
		for _, s := range subs {
			if _, ok := r.subs[topic][s]; !ok {
				return &ConfigError{Field: "subscriber", Reason: fmt.Sprintf("topic %q has subscriber %q (Config.Subscribers) and this relay claims the topic without a handler for it: register one with Subscribe", topic, s)}
			}
		}
	}
	return nil
}

// subscriberHandler returns the Handler of subscriber's copies of topic:
// nil when a batch handler handles them; one that fails when this relay
// has no handler for them (the copy is retried, and dead-lettered in the
// end, not lost: a relay of another configuration claimed it).
func (r *Relay) subscriberHandler(topic, subscriber string) Handler {
	if s, ok := r.subs[topic][subscriber]; ok {
		return s.h
	}
	return func(context.Context, Delivery) error {
		return fmt.Errorf("outbox: no handler for subscriber %q of topic %q in this relay", subscriber, topic)
	}
}

// plainHandler is the handler of a topic's messages stored without
// subscribers in a relay that subscribes to the topic but has no handler
// of the topic's own (Handle) or catch-all: it fails (the message is
// retried, then dead-lettered, and can be redriven once a relay has one).
func plainHandler(topic string) Handler {
	return func(context.Context, Delivery) error {
		return fmt.Errorf("outbox: topic %q has subscribers, and this relay has no handler for its messages stored without one (published before the topic had subscribers, or through an Outbox without them): register one with Handle", topic)
	}
}

// fanOutResults fills res when some messages of msgs have subscribers:
// ID is the first stored copy's id and Copies every copy's (zero for a
// duplicate); Duplicate when no copy was stored.
func (o *Outbox) fanOutResults(ctx context.Context, msgs []Message, rows []outboxdriver.Row, res []Result, stored []string, dedup bool) error {
	var got map[ID]bool
	if dedup && len(stored) < len(rows) {
		var err error
		if got, err = storedSet(stored); err != nil {
			return wrapOp(ctx, "publish", err)
		}
	}
	k := 0
	for i := range msgs {
		n := max(len(o.subs[msgs[i].Topic]), 1)
		r := Result{Duplicate: true}
		if len(o.subs[msgs[i].Topic]) > 0 {
			r.Copies = make([]ID, n)
		}
		for j := range n {
			id := rows[k+j].ID
			if got != nil && !got[id] {
				continue
			}
			if r.Duplicate {
				r.ID, r.Duplicate = id, false
			}
			if r.Copies != nil {
				r.Copies[j] = id
			}
		}
		res[i] = r
		k += n
	}
	return nil
}
