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

	"github.com/oncommit/oncommit/outboxdriver"
)

// The inspection types, defined with the plug-in API in package
// outboxdriver.
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
	// ActSkip skips dead messages that halt their key (an Outbox with
	// Config.OrderByKey, HaltKey policy), as [Outbox.SkipHead] does: each
	// stays dead and its key flows again.
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

// FilterError reports a [Filter] (or a page size) that [Outbox.List],
// [Outbox.Count], [Outbox.Get] or [Outbox.Act] refused before sending any
// SQL. It wraps [ErrInvalidFilter].
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

// ActOptions say who runs [Outbox.Act] (or an operator's [Outbox.Purge],
// see PurgeOptions.Operator) and where it is logged. The log line is the
// audit record of operators' actions: message "outbox: operator action"
// at level Info ("outbox: operator action failed" at level Error, with an
// "error" attribute), with the attributes action (redrive, retry, delete,
// skip, purge), actor, table, filter (as [FilterString] writes it),
// changed (how many messages changed, so far when it failed) and took. A
// service that keeps an audit trail elsewhere gives a Logger whose
// handler writes there.
type ActOptions struct {
	// Actor names who asks (an operator's name, "cli:alice",
	// "dashboard"), for the log line. Defaults to "".
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

// List returns up to limit messages matching f (0 means
// [DefaultPageSize], at most [MaxPageSize]) in id order, which is creation
// order, without their payloads and headers (see [Outbox.Get]). Pass
// Page.Next as f.After for the next page: pages are stable under
// concurrent publishes, since a new message has a greater id than every
// message listed before it, so no message is listed twice or skipped.
// A bad filter is a [*FilterError], before any SQL.
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

// Count returns how many messages match f. It reads every matching index
// entry (or row): a count of a large backlog takes as long as that.
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

// Act applies a to the messages matching f and returns how many it
// changed. Each action changes only messages in its source state, checked
// again in the statement that changes them, so a message a relay claimed,
// settled or reclaimed meanwhile is left as it is:
//
//   - [ActRedrive]: dead -> pending, due now, with RelayConfig.MaxAttempts
//     fresh attempts (as [Outbox.Redrive]);
//   - [ActRetry]: pending but not yet due -> due now;
//   - [ActDelete]: deleted, unless processing;
//   - [ActSkip]: dead messages that halt their key are skipped, each as
//     [Outbox.SkipHead] does it and only while it is still its key's
//     head, one short transaction per key; other messages are left alone.
//     It needs Config.OrderByKey ([ErrUnsupported] otherwise, and on the
//     dialects without ordered delivery).
//
// Ordered messages (Config.OrderByKey) keep their keys' order through
// every action: on PostgreSQL a redrive re-enters dead ordered messages in
// their keys, as [Outbox.Redrive] does (a halted head first), and a delete
// leaves a key's pending, blocked and halted messages alone (the key would
// wait forever for them); skip or redrive a halted head instead.
//
// It works in batches of at most a few thousand messages, each one short
// statement (or transaction) that commits on its own, until none is left or
// ctx ends: interrupted, it returns the messages changed so far with the
// error, and running it again goes on from there. f must set some field
// (acting on every message is never implied) and not After. One line is
// logged per call (see [ActOptions]).
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
	o.logAction(ctx, opts, a.String(), FilterString(f), n, start, err)
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
// would change if it ran now, those in its source state: the dead ones
// for [ActRedrive]; the pending ones, due or not, for [ActRetry]; the
// pending, dead and delivered ones for [ActDelete]; the dead ones that
// halt their key for [ActSkip]. A confirmation shows them, or their
// count, and then hands them to [Outbox.ActOn], so that the action changes
// no message the operator was not shown: one published, dead-lettered or
// redriven after the confirmation was shown is left alone. f is checked as
// [Outbox.Act] checks it. It pages through the matching messages,
// [MaxPageSize] at a time.
func (o *Outbox) Targets(ctx context.Context, db DB, a Action, f Filter) ([]ID, error) {
	if err := checkAct(a, f, true); err != nil {
		return nil, err
	}
	if a == ActSkip && o.orderedDialect() == nil {
		return nil, fmt.Errorf("%w: skip needs an Outbox with Config.OrderByKey", ErrUnsupported)
	}
	from := []State{StatePending, StateDead, StateDelivered}
	switch a {
	case ActRedrive, ActSkip:
		from = []State{StateDead}
	case ActRetry:
		from = []State{StatePending}
	}
	if len(f.States) > 0 {
		from = slices.DeleteFunc(from, func(s State) bool { return !slices.Contains(f.States, s) })
		if len(from) == 0 {
			return nil, nil
		}
	}
	f.States = from
	var ids []ID
	for {
		p, err := o.List(ctx, db, f, MaxPageSize)
		if err != nil {
			return nil, err
		}
		for _, m := range p.Messages {
			if a == ActSkip && (m.Key == "" || !m.SettledAt.IsZero()) {
				continue // a halted head is dead, keyed and never settled
			}
			ids = append(ids, m.ID)
		}
		if p.Next.IsZero() {
			return ids, nil
		}
		f.After = p.Next
	}
}

// ActOn is [Outbox.Act] on the messages of ids that still match f (and
// are among f.IDs when f names ids): the ids a confirmation showed, from
// [Outbox.Targets]. ids may be more than [MaxFilterIDs]: it acts on them
// that many at a time. When ids is empty it changes nothing, sends no SQL
// and logs nothing (where Act would take an empty Filter.IDs as every
// id). f may be empty, since ids bound it, but not set After. One line is
// logged per call, its filter f with ids=N for ids.
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
	o.logAction(ctx, opts, a.String(), FilterString(f), n, start, err)
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
	return len(f.IDs) == 0 && len(f.States) == 0 && f.Topic == "" && f.Key == "" && f.ErrorContains == "" &&
		f.CreatedFrom.IsZero() && f.CreatedTo.IsZero() && f.SettledFrom.IsZero() && f.SettledTo.IsZero()
}

// FilterString returns f in a short form for logs and confirmations, such
// as `state=dead topic="order.placed"`; "all" when f selects every message.
func FilterString(f Filter) string {
	var b []string
	if len(f.IDs) == 1 {
		b = append(b, "id="+f.IDs[0].String())
	} else if len(f.IDs) > 1 {
		b = append(b, fmt.Sprintf("ids=%d", len(f.IDs)))
	}
	if len(f.States) > 0 {
		ss := make([]string, len(f.States))
		for i, s := range f.States {
			ss[i] = string(s)
		}
		b = append(b, "state="+strings.Join(ss, ","))
	}
	for _, kv := range [][2]string{{"topic", f.Topic}, {"key", f.Key}, {"error", f.ErrorContains}} {
		if kv[1] != "" {
			b = append(b, fmt.Sprintf("%s=%q", kv[0], kv[1]))
		}
	}
	for _, kv := range []struct {
		k string
		t time.Time
	}{{"created>=", f.CreatedFrom}, {"created<", f.CreatedTo}, {"settled>=", f.SettledFrom}, {"settled<", f.SettledTo}} {
		if !kv.t.IsZero() {
			b = append(b, kv.k+kv.t.UTC().Format(time.RFC3339Nano))
		}
	}
	if !f.After.IsZero() {
		b = append(b, "after="+f.After.String())
	}
	if len(b) == 0 {
		return "all"
	}
	return strings.Join(b, " ")
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
		case StatePending, StateProcessing, StateDelivered, StateDead:
		default:
			return &FilterError{"States", fmt.Sprintf("%q is not a state (pending, processing, delivered, dead)", string(s))}
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
