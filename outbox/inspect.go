package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oncommit/oncommit/internal/opfmt"
	"github.com/oncommit/oncommit/outboxdriver"
)

// The inspection types, from package outboxdriver.
type (
	// Filter selects messages for [Outbox.List], [Outbox.Count] and
	// [Outbox.Act]; see [outboxdriver.Filter].
	Filter = outboxdriver.Filter
	// MessageInfo is one message as stored; see [outboxdriver.MessageInfo].
	MessageInfo = outboxdriver.MessageInfo
	// Action is what [Outbox.Act] does; see [outboxdriver.Action].
	Action = outboxdriver.Action
)

// The actions of [Outbox.Act].
const (
	// ActRedrive makes dead messages pending, due now, with fresh attempts.
	ActRedrive = outboxdriver.ActRedrive
	// ActRetry makes pending messages that are not yet due due now.
	ActRetry = outboxdriver.ActRetry
	// ActDelete deletes messages in any state but processing.
	ActDelete = outboxdriver.ActDelete
	// ActSkip skips dead messages that halt their key, as
	// [Outbox.SkipHead] does.
	ActSkip = outboxdriver.ActSkip
)

// Page sizes of [Outbox.List].
const (
	// DefaultPageSize is the page size when none is given.
	DefaultPageSize = 50
	// MaxPageSize is the largest page [Outbox.List] returns.
	MaxPageSize = 1000
	// MaxFilterIDs is the most ids one [Filter] may name.
	MaxFilterIDs = outboxdriver.MaxFilterIDs
	// MaxErrorContainsBytes is the longest Filter.ErrorContains.
	MaxErrorContainsBytes = 1024
)

var (
	// ErrNotFound is returned by [Outbox.Get] when no message has the id.
	ErrNotFound = errors.New("outbox: no message with this id")

	// ErrInvalidFilter is wrapped by every [*FilterError].
	ErrInvalidFilter = errors.New("outbox: invalid filter")
)

// FilterError reports a [Filter] (or a page size) refused before any SQL.
// It wraps [ErrInvalidFilter].
type FilterError struct {
	// Field names the offending field of Filter, or "Limit" or "Action".
	Field string
	// Reason says what is wrong, in lower case.
	Reason string
}

func (e *FilterError) Error() string {
	return fmt.Sprintf("outbox: invalid filter: %s: %s", e.Field, e.Reason)
}

// Unwrap returns [ErrInvalidFilter].
func (e *FilterError) Unwrap() error { return ErrInvalidFilter }

// Page is one page of [Outbox.List].
type Page struct {
	// Messages are in id order (creation order).
	Messages []MessageInfo
	// Next is the cursor of the next page (pass it as Filter.After), zero
	// when this page is the last.
	Next ID
}

// ActOptions say who runs [Outbox.Act] (or an operator's [Outbox.Purge])
// and where its audit line goes: "outbox: operator action" at level Info
// ("... failed" at Error, with "error"), with the attributes action, actor,
// table, filter, changed and took.
type ActOptions struct {
	// Actor names who asks ("cli:alice", "dashboard"). Defaults to "".
	Actor string
	// Logger receives one line per call. Defaults to slog.Default().
	Logger *slog.Logger
}

func (o *Outbox) inspector() (outboxdriver.Inspector, error) {
	in, ok := o.d.(outboxdriver.Inspector)
	if !ok {
		return nil, fmt.Errorf("%w: the %s dialect cannot inspect messages", ErrUnsupported, o.d.Name())
	}
	return in, nil
}

// List returns up to limit messages matching f (0 means [DefaultPageSize],
// at most [MaxPageSize]) in id (creation) order, without payloads and
// headers. Pass Page.Next as f.After for the next page; concurrent
// publishes make no message listed twice or skipped. A bad filter is a
// [*FilterError], before any SQL.
func (o *Outbox) List(ctx context.Context, db DB, f Filter, limit int) (Page, error) {
	in, err := o.inspector()
	if err != nil {
		return Page{}, err
	}
	if limit == 0 {
		limit = DefaultPageSize
	}
	if limit < 0 || limit > MaxPageSize {
		return Page{}, &FilterError{"Limit", fmt.Sprintf("%d is not between 1 and %d", limit, MaxPageSize)}
	}
	if err := checkFilter(f); err != nil {
		return Page{}, err
	}
	ms, err := in.List(ctx, db, o.table, f, limit+1, false)
	if err != nil {
		return Page{}, wrapOp(ctx, "list", o.d.Classify(err))
	}
	p := Page{Messages: ms}
	if len(ms) > limit {
		p.Messages = ms[:limit]
		p.Next = ms[limit-1].ID
	}
	return p, nil
}

// Count returns how many messages match f, reading every match.
func (o *Outbox) Count(ctx context.Context, db DB, f Filter) (int64, error) {
	in, err := o.inspector()
	if err != nil {
		return 0, err
	}
	if err := checkFilter(f); err != nil {
		return 0, err
	}
	n, err := in.Count(ctx, db, o.table, f)
	if err != nil {
		return 0, wrapOp(ctx, "count", o.d.Classify(err))
	}
	return n, nil
}

// Get returns the message with id, with its payload and headers, or
// [ErrNotFound].
func (o *Outbox) Get(ctx context.Context, db DB, id ID) (MessageInfo, error) {
	in, err := o.inspector()
	if err != nil {
		return MessageInfo{}, err
	}
	if id.IsZero() {
		return MessageInfo{}, &FilterError{"IDs", "the zero id names no message"}
	}
	ms, err := in.List(ctx, db, o.table, Filter{IDs: []ID{id}}, 1, true)
	if err != nil {
		return MessageInfo{}, wrapOp(ctx, "get", o.d.Classify(err))
	}
	if len(ms) == 0 {
		return MessageInfo{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return ms[0], nil
}

// Act applies a to the messages matching f that are in its source state
// when the statement runs, and returns how many it changed. Ordered
// messages keep their keys' order: a delete leaves a key's pending, blocked
// and halted messages alone ([Outbox.Plan] says why); ActSkip needs
// Config.OrderByKey. It commits in short batches: interrupted, it returns
// the count so far with the error. f must set some field and not After.
// It logs one line (see [ActOptions]).
func (o *Outbox) Act(ctx context.Context, db DB, a Action, f Filter, opts *ActOptions) (int64, error) {
	in, err := o.inspector()
	if err != nil {
		return 0, err
	}
	if err := checkAct(a, f, true); err != nil {
		return 0, err
	}
	start := time.Now()
	n, err := o.act(ctx, db, in, a, f)
	o.logAction(ctx, opts, a.String(), opfmt.Filter(f), n, start, err)
	return n, err
}

// act runs a on the messages matching f, checked.
func (o *Outbox) act(ctx context.Context, db DB, in outboxdriver.Inspector, a Action, f Filter) (int64, error) {
	if a == ActSkip {
		return o.skipHeads(ctx, db, f)
	}
	n, err := in.Act(ctx, db, o.table, a, f)
	if err != nil {
		err = wrapOp(ctx, a.String(), o.d.Classify(err))
	}
	return n, err
}

// checkAct refuses, before any SQL, an action or filter [Outbox.Act]
// cannot take; selects says f alone chooses the messages (it must then
// set some field).
func checkAct(a Action, f Filter, selects bool) error {
	if a != ActRedrive && a != ActRetry && a != ActDelete && a != ActSkip {
		return &FilterError{"Action", fmt.Sprintf("%d is not an action", int(a))}
	}
	if err := checkFilter(f); err != nil {
		return err
	}
	if !f.After.IsZero() {
		return &FilterError{"After", "is a listing's cursor; an action takes the whole selection"}
	}
	if selects && filterEmpty(f) {
		return &FilterError{"Filter", "selects every message; name the states, topic, ids... to act on"}
	}
	return nil
}

// Targets returns, in id order, the ids of the messages matching f that a
// would change now: Plan.IDs of [Outbox.Plan]. Hand them to [Outbox.ActOn]
// to change no message an operator was not shown.
func (o *Outbox) Targets(ctx context.Context, db DB, a Action, f Filter) ([]ID, error) {
	p, err := o.plan(ctx, db, a, f, false)
	return p.IDs, err
}

// Plan is what an action would do now, from [Outbox.Plan].
type Plan struct {
	// IDs are the messages the action would change, in id order.
	IDs []ID
	// Refused are the messages of the selection it would leave alone, by
	// reason.
	Refused []Refusal
}

// Refusal is messages an action leaves as they are, and why.
type Refusal struct {
	// Reason says why, in lower case.
	Reason string
	// IDs are the messages, in id order.
	IDs []ID
}

// Plan returns what a would do now to the messages matching f: the ids
// it would change, and those it would leave alone with why (with f.IDs,
// every named message that exists is in one or the other). f is checked
// as [Outbox.Act] checks it.
func (o *Outbox) Plan(ctx context.Context, db DB, a Action, f Filter) (Plan, error) {
	return o.plan(ctx, db, a, f, true)
}

// sourceStates are the states a message must be in for a to change it.
func sourceStates(a Action) []State {
	switch a {
	case ActRedrive, ActSkip:
		return []State{StateDead}
	case ActRetry:
		return []State{StatePending}
	}
	return []State{StatePending, StateDead, StateDelivered}
}

// plan pages through the messages matching f in a's source states (and,
// when explain, those whose refusal an operator needs to hear of: see
// [Outbox.Plan]) and sorts them into the ids a would change and the
// refused.
func (o *Outbox) plan(ctx context.Context, db DB, a Action, f Filter, explain bool) (Plan, error) {
	if err := checkAct(a, f, true); err != nil {
		return Plan{}, err
	}
	if a == ActSkip && o.orderedDialect() == nil {
		return Plan{}, fmt.Errorf("%w: skip needs an Outbox with Config.OrderByKey", ErrUnsupported)
	}
	from := sourceStates(a)
	read := from
	switch {
	case explain && len(f.IDs) > 0:
		read = []State{StatePending, StateBlocked, StateProcessing, StateDead, StateDelivered}
	case explain && a == ActDelete:
		read = []State{StatePending, StateBlocked, StateProcessing, StateDead, StateDelivered}
	}
	if len(f.States) > 0 {
		read = slices.DeleteFunc(slices.Clone(read), func(s State) bool { return !slices.Contains(f.States, s) })
		if len(read) == 0 {
			return Plan{}, nil
		}
	}
	f.States = read
	var p Plan
	at := map[string]int{} // reason -> index in p.Refused
	for {
		page, err := o.List(ctx, db, f, MaxPageSize)
		if err != nil {
			return Plan{}, err
		}
		for _, m := range page.Messages {
			why := refusal(a, m, from)
			if why == "" {
				p.IDs = append(p.IDs, m.ID)
				continue
			}
			i, ok := at[why]
			if !ok {
				i = len(p.Refused)
				at[why] = i
				p.Refused = append(p.Refused, Refusal{Reason: why})
			}
			p.Refused[i].IDs = append(p.Refused[i].IDs, m.ID)
		}
		if page.Next.IsZero() {
			return p, nil
		}
		f.After = page.Next
	}
}

// refusal returns why a would leave m as it is, "" when a would change it
// (m's state is among from, a's source states).
func refusal(a Action, m MessageInfo, from []State) string {
	switch {
	case a == ActDelete && m.HaltsKey():
		return "halts its ordered key: a delete would leave the key waiting forever; skip it (the key goes on) or redrive it"
	case a == ActDelete && m.KeySeq != 0 && (m.State == StatePending || m.State == StateBlocked):
		return "holds its place in its ordered key (its head, or blocked behind it): a delete would leave the key waiting forever; it is delivered in its turn"
	case m.State == StateProcessing:
		return "is processing: a handler is running it, and no action changes a message under its handler"
	case a == ActSkip && m.State == StateDead && !m.HaltsKey():
		return "is dead but halts no key (not ordered, skipped already, or dead under ContinueKey): there is nothing to skip"
	case a == ActSkip && m.State == StateBlocked:
		return "is blocked behind the head of its ordered key: only a dead head that halts its key can be skipped"
	case a == ActRedrive && m.State == StateBlocked:
		return "is blocked behind the head of its ordered key, not dead: it is delivered once its key's head is"
	case !slices.Contains(from, m.State):
		ss := make([]string, len(from))
		for i, s := range from {
			ss[i] = string(s)
		}
		return fmt.Sprintf("is %s: %s changes %s messages only", m.State, a, strings.Join(ss, ", "))
	}
	return ""
}

// KeyState is where an ordered key stands, from [Outbox.KeyState].
type KeyState struct {
	// Head is the message delivered next, or the dead one that halts the
	// key; its ID is zero when the key has none.
	Head MessageInfo
	// Blocked counts the key's messages blocked behind the head.
	Blocked int64
}

// KeyState returns where ordered key stands: its head, without payload,
// and how many messages wait behind it (a Filter of the key and
// [StateBlocked] lists them). For a subscriber's copies of the key, see
// [Outbox.SubscriberKeyState].
func (o *Outbox) KeyState(ctx context.Context, db DB, key string) (KeyState, error) {
	return o.SubscriberKeyState(ctx, db, "", key)
}

// SubscriberKeyState is [Outbox.KeyState] for subscriber's copies of key
// (each subscriber's copies of a key have an order of their own; see
// Config.Subscribers); "" is KeyState.
func (o *Outbox) SubscriberKeyState(ctx context.Context, db DB, subscriber, key string) (KeyState, error) {
	var ks KeyState
	if key == "" {
		return ks, &FilterError{"Key", "ordered keys are not empty"}
	}
	f := Filter{Key: key, Subscriber: subscriber, States: []State{StatePending, StateProcessing, StateDead}}
	for ks.Head.ID.IsZero() {
		p, err := o.List(ctx, db, f, MaxPageSize)
		if err != nil {
			return ks, err
		}
		for _, m := range p.Messages {
			if m.KeySeq != 0 && m.SettledAt.IsZero() { // a head; a dead one halts its key
				ks.Head = m
				break
			}
		}
		if p.Next.IsZero() {
			break
		}
		f.After = p.Next
	}
	n, err := o.Count(ctx, db, Filter{Key: key, Subscriber: subscriber, States: []State{StateBlocked}})
	ks.Blocked = n
	return ks, err
}

// ActOn is [Outbox.Act] on the messages of ids (any number, such as
// Plan.IDs) that still match f; f may be empty. Empty ids change nothing
// and log nothing.
func (o *Outbox) ActOn(ctx context.Context, db DB, a Action, f Filter, ids []ID, opts *ActOptions) (int64, error) {
	in, err := o.inspector()
	if err != nil {
		return 0, err
	}
	if err := checkAct(a, f, false); err != nil {
		return 0, err
	}
	if len(f.IDs) > 0 {
		ids = slices.DeleteFunc(slices.Clone(ids), func(id ID) bool { return !slices.Contains(f.IDs, id) })
	}
	for _, id := range ids {
		if id.IsZero() {
			return 0, &FilterError{"IDs", "the zero id names no message"}
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	start := time.Now()
	var n int64
	for chunk := range slices.Chunk(ids, MaxFilterIDs) {
		part := f
		part.IDs = chunk
		var k int64
		k, err = o.act(ctx, db, in, a, part)
		if n += k; err != nil {
			break
		}
	}
	f.IDs = ids
	o.logAction(ctx, opts, a.String(), opfmt.Filter(f), n, start, err)
	return n, err
}

// logAction logs the line of an operator's action (see [ActOptions]).
func (o *Outbox) logAction(ctx context.Context, opts *ActOptions, action, what string, n int64, start time.Time, err error) {
	var ao ActOptions
	if opts != nil {
		ao = *opts
	}
	log := ao.Logger
	if log == nil {
		log = slog.Default()
	}
	attrs := []any{"action", action, "actor", ao.Actor, "table", o.table.String(), "filter", what, "changed", n, "took", time.Since(start)}
	if err != nil {
		log.ErrorContext(ctx, "outbox: operator action failed", append(attrs, "error", err)...)
	} else {
		log.InfoContext(ctx, "outbox: operator action", attrs...)
	}
}

func filterEmpty(f Filter) bool {
	return len(f.IDs) == 0 && len(f.States) == 0 && f.Topic == "" && f.Key == "" && f.Subscriber == "" && f.ErrorContains == "" &&
		f.CreatedFrom.IsZero() && f.CreatedTo.IsZero() && f.SettledFrom.IsZero() && f.SettledTo.IsZero()
}

// checkFilter refuses, before any SQL, what no dialect could take.
func checkFilter(f Filter) error {
	if len(f.IDs) > MaxFilterIDs {
		return &FilterError{"IDs", fmt.Sprintf("%d ids, more than %d", len(f.IDs), MaxFilterIDs)}
	}
	for _, id := range f.IDs {
		if id.IsZero() {
			return &FilterError{"IDs", "the zero id names no message"}
		}
	}
	for _, s := range f.States {
		switch s {
		case StatePending, StateBlocked, StateProcessing, StateDelivered, StateDead:
		default:
			return &FilterError{"States", fmt.Sprintf("%q is not a state (pending, blocked, processing, delivered, dead)", string(s))}
		}
	}
	for _, c := range []struct {
		field, s string
		max      int
	}{{"Topic", f.Topic, MaxTopicBytes}, {"Key", f.Key, MaxKeyBytes}, {"ErrorContains", f.ErrorContains, MaxErrorContainsBytes}} {
		switch {
		case len(c.s) > c.max:
			return &FilterError{c.field, fmt.Sprintf("%d bytes, more than %d", len(c.s), c.max)}
		case !utf8.ValidString(c.s):
			return &FilterError{c.field, "not valid UTF-8"}
		case strings.IndexByte(c.s, 0) >= 0:
			return &FilterError{c.field, "contains a NUL byte"}
		}
	}
	if f.Subscriber != "" {
		if reason := checkSubscriberName(f.Subscriber); reason != "" {
			return &FilterError{"Subscriber", reason}
		}
	}
	for _, r := range []struct {
		field, toField string
		from, to       time.Time
	}{{"CreatedFrom", "CreatedTo", f.CreatedFrom, f.CreatedTo}, {"SettledFrom", "SettledTo", f.SettledFrom, f.SettledTo}} {
		for _, at := range []struct {
			field string
			t     time.Time
		}{{r.field, r.from}, {r.toField, r.to}} {
			if !at.t.IsZero() && (at.t.Year() < 1970 || at.t.Year() > 9999) {
				return &FilterError{at.field, fmt.Sprintf("%s is outside the years 1970 to 9999", at.t.Format(time.RFC3339))}
			}
		}
		if !r.from.IsZero() && !r.to.IsZero() && !r.from.Before(r.to) {
			return &FilterError{r.field, "is not before the end of its range"}
		}
	}
	return nil
}
