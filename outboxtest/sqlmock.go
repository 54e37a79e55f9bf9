package outboxtest

import (
	"database/sql/driver"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/internal/publishsql"
	"github.com/oncommit/oncommit/internal/walenv"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// NotBeforeTolerance is how far a published Message.NotBefore may be from
// the expected one for [ExpectPublish] to match, so that code computing it
// from time.Now() is matched by an expectation computed from time.Now()
// too. Delay is matched exactly.
const NotBeforeTolerance = 5 * time.Second

// ExpectPublish registers on mock the statement that ob.Publish (one
// message) or ob.PublishBatch (several) sends for msgs, answering that
// every message was stored. The arguments must be those of msgs, except
// that:
//   - the generated ids match any id ([AnyID]);
//   - Payload and Headers match when equal as JSON ([JSONEq]): build the
//     expected payload from a Go value with [JSON];
//   - NotBefore matches within [NotBeforeTolerance].
//
// Publish sends the statement with ExecContext (an ExpectExec) when no
// message has a DedupKey, and with QueryContext (an ExpectQuery, answering
// with the stored ids) when one has, since only then does it need the ids
// back. On MySQL, where the INSERT cannot return ids, a message with a
// DedupKey makes it an ExpectExec of the INSERT followed by an ExpectQuery
// of the statement that lists the stored ids.
//
// The statement is matched literally under both of sqlmock's query
// matchers, sqlmock.QueryMatcherRegexp (the default) and
// sqlmock.QueryMatcherEqual, which ExpectPublish tells apart on a mock
// made by sqlmock.New; on a mock with another matcher it writes the
// regular expression. On PostgreSQL, where notifications are coalesced by
// default (Config.NotifyInterval), whether a publish notifies depends on
// timing: under QueryMatcherRegexp the expectation accepts the statement
// with and without the NOTIFY; under
// QueryMatcherEqual, which cannot, build the Outbox of such tests with
// NotifyInterval: outbox.NotifyEvery (or Notify: outbox.NotifyOff): with a
// coalescing Outbox the expectation fails every time, and its message says
// so.
//
// With Config.OrderByKey, when an ordered message has a DedupKey (on
// MySQL: whenever a message is ordered), the expectation of a publish that
// stored its messages is followed by the statements that number them
// each an ExpectExec; ExpectPublishDuplicate and ExpectPublishError register none,
// as Publish sends none.
//
// If a message is invalid, the expectation answers with Publish's
// validation error instead; since Publish refuses such a message without
// sending SQL, the expectation then stays unmet and
// mock.ExpectationsWereMet reports it. To test code that handles a
// refused message, register no expectation for its publish.
func ExpectPublish(mock sqlmock.Sqlmock, ob *outbox.Outbox, msgs ...outbox.Message) {
	expect(mock, ob, msgs, answerStored, nil)
}

// ExpectPublishDuplicate is [ExpectPublish] answering that every message
// was a duplicate (its DedupKey already stored): Publish reports
// Result.Duplicate. Every message must have a DedupKey.
func ExpectPublishDuplicate(mock sqlmock.Sqlmock, ob *outbox.Outbox, msgs ...outbox.Message) {
	expect(mock, ob, msgs, answerDuplicate, nil)
}

// ExpectPublishError is [ExpectPublish] answering that the publish
// statement failed in the database with err (a lost connection, a
// serialization failure, a constraint of the caller's schema...): Publish
// returns an error wrapping err, and the caller is expected to roll back.
func ExpectPublishError(mock sqlmock.Sqlmock, ob *outbox.Outbox, err error, msgs ...outbox.Message) {
	expect(mock, ob, msgs, answerError, err)
}

type answer int

const (
	answerStored answer = iota
	answerDuplicate
	answerError
)

func expect(mock sqlmock.Sqlmock, ob *outbox.Outbox, msgs []outbox.Message, ans answer, dbErr error) {
	equal := matchesEqual(mock)
	literal := func(query string) string {
		if equal {
			return query
		}
		return "^" + regexp.QuoteMeta(query) + "$"
	}
	st, err := ob.PublishSQL(msgs...)
	if err != nil {
		mock.ExpectExec(literal("outboxtest: no statement: " + err.Error())).WillReturnError(err)
		return
	}
	args := argMatchers(ob, msgs, st)
	x := publishsql.Of(st)
	rows := sqlmock.NewRows([]string{"id"})
	if ans == answerStored {
		for _, id := range st.IDs {
			rows.AddRow(id.String())
		}
	}
	dedup := slices.ContainsFunc(msgs, func(m outbox.Message) bool { return m.DedupKey != "" })
	if x.QuietQuery != "" && equal {
		mock.ExpectExec("outboxtest: under sqlmock.QueryMatcherEqual, build the Outbox with Config.NotifyInterval set to outbox.NotifyEvery (or Notify: outbox.NotifyOff): whether a coalescing Outbox's publish notifies depends on timing")
		return
	}
	query := literal(st.Query)
	if x.QuietQuery != "" {
		// Config.NotifyInterval: the publish notifies or not, by timing.
		query = "^(?:" + regexp.QuoteMeta(st.Query) + "|" + regexp.QuoteMeta(x.QuietQuery) + ")$"
	}
	if !dedup || x.StoredQuery != "" {
		// An Exec; on MySQL with a DedupKey, followed by the query for the
		// ids it stored.
		e := mock.ExpectExec(query).WithArgs(args...)
		if ans == answerError {
			e.WillReturnError(dbErr)
			return
		}
		e.WillReturnResult(sqlmock.NewResult(0, int64(len(msgs))))
		if x.StoredQuery == "" {
			expectSequence(mock, st.IDs, x.Sequence, ans, literal)
			return
		}
		ids := make([]driver.Value, len(x.StoredArgs))
		for i := range ids {
			ids[i] = AnyID() // generated ids
		}
		mock.ExpectQuery(literal(x.StoredQuery)).WithArgs(ids...).WillReturnRows(rows)
		expectSequence(mock, st.IDs, x.Sequence, ans, literal)
		return
	}
	e := mock.ExpectQuery(query).WithArgs(args...)
	if ans == answerError {
		e.WillReturnError(dbErr)
		return
	}
	e.WillReturnRows(rows)
	expectSequence(mock, st.IDs, x.Sequence, ans, literal)
}

// expectSequence registers the statements that number the stored ordered
// messages, when Publish sends them: after a
// publish that stored them (none is sent when every message was a
// duplicate).
func expectSequence(mock sqlmock.Sqlmock, stored []outbox.ID, seq []outboxdriver.Statement, ans answer, literal func(string) string) {
	if ans != answerStored {
		return
	}
	ids := make(map[string]bool, len(stored))
	for _, id := range stored {
		ids[id.String()] = true
	}
	for _, q := range seq {
		args := make([]driver.Value, len(q.Args))
		for i, a := range q.Args {
			args[i] = argMatcher(a, ids, probes{})
		}
		query := literal(q.Query)
		if inline := idsIn(q.Query, stored); inline != nil {
			// The ids are written in the statement's text (MySQL's, which
			// spares a prepare per statement): under regular expressions,
			// each matches any id; QueryMatcherEqual cannot.
			if query == q.Query {
				mock.ExpectExec("outboxtest: under sqlmock.QueryMatcherEqual, the statements numbering ordered messages cannot be matched: they hold the generated ids in their text; use the default sqlmock.QueryMatcherRegexp")
				return
			}
			query = regexp.QuoteMeta(q.Query)
			for _, id := range inline {
				query = strings.ReplaceAll(query, regexp.QuoteMeta(id), idPattern)
			}
			query = "^" + query + "$"
		}
		mock.ExpectExec(query).WithArgs(args...).WillReturnResult(sqlmock.NewResult(0, int64(len(stored))))
	}
}

// idPattern is a regular expression matching the text form of any id.
const idPattern = `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`

// idsIn returns the ids of ids that query holds in its text.
func idsIn(query string, ids []outbox.ID) []string {
	var in []string
	for _, id := range ids {
		if s := id.String(); strings.Contains(query, s) {
			in = append(in, s)
		}
	}
	return in
}

// argMatchers returns the expected arguments of st, the statement for
// msgs: the generated ids replaced by AnyID, the JSON columns by JSONEq and
// the NotBefore instants by a range of NotBeforeTolerance either side,
// element by element in an argument that is an array literal (PostgreSQL's
// ordered publish passes one array per column). The arguments of each kind
// are found by building the statement again with only that kind of value
// changed, so no dialect's argument layout is assumed.
func argMatchers(ob *outbox.Outbox, msgs []outbox.Message, st outbox.Statement) []driver.Value {
	ids := make(map[string]bool, len(st.IDs))
	for _, id := range st.IDs {
		ids[id.String()] = true
	}
	// changed rebuilds the statement with change applied to a copy of each
	// message and returns the arguments, or nil when it cannot.
	changed := func(change func(m *outbox.Message)) []any {
		probe := slices.Clone(msgs)
		for i := range probe {
			change(&probe[i])
		}
		p, err := ob.PublishSQL(probe...)
		if err != nil || len(p.Args) != len(st.Args) {
			return nil
		}
		return p.Args
	}
	// JSON columns: the same documents with a trailing space, and one
	// more header.
	json := changed(func(m *outbox.Message) {
		if len(m.Payload) > 0 {
			m.Payload = append(slices.Clip(m.Payload), ' ')
		}
		if len(m.Headers) > 0 {
			h := make(map[string]string, len(m.Headers)+1)
			for k, v := range m.Headers {
				h[k] = v
			}
			h["outboxtest.probe"] += "probe" // differs whatever the message has
			m.Headers = h
		}
	})
	shift := func(d time.Duration) []any {
		return changed(func(m *outbox.Message) {
			if !m.NotBefore.IsZero() {
				m.NotBefore = m.NotBefore.Add(d)
			}
		})
	}
	var lo, hi []any
	if slices.ContainsFunc(msgs, func(m outbox.Message) bool { return !m.NotBefore.IsZero() }) {
		lo, hi = shift(-NotBeforeTolerance), shift(NotBeforeTolerance)
	}
	args := make([]driver.Value, len(st.Args))
	for i, a := range st.Args {
		var p probes
		if json != nil {
			p.json, p.hasJSON = json[i], true
		}
		if lo != nil && hi != nil {
			p.lo, p.hi, p.hasTime = lo[i], hi[i], true
		}
		args[i] = argMatcher(a, ids, p)
	}
	return args
}

// probes are the values an argument took in the statements built with
// the JSON documents changed (json) and NotBefore moved back and forth
// (lo, hi), when they could be built.
type probes struct {
	json, lo, hi     any
	hasJSON, hasTime bool
}

// argMatcher returns the matcher of one expected argument a (see
// argMatchers): an id of ids matches any id; a value that changed with
// the JSON documents matches as JSON, one that moved with NotBefore
// matches the range; an array literal matches element by element.
func argMatcher(a any, ids map[string]bool, p probes) driver.Value {
	if b, ok := a.([]byte); ok {
		if es, err := walenv.DecodeAll(b); err == nil {
			return envelopeMatch{es}
		}
	}
	if el, ok := arrayElems(a); ok {
		elem := func(v any, has bool, j int) (any, bool) {
			if !has {
				return nil, false
			}
			vs, ok := arrayElems(v)
			if !ok || len(vs) != len(el) {
				return nil, false
			}
			return vs[j], true
		}
		m := make(arrayMatch, len(el))
		for j, e := range el {
			var q probes
			q.json, q.hasJSON = elem(p.json, p.hasJSON, j)
			q.lo, q.hasTime = elem(p.lo, p.hasTime, j)
			q.hi, q.hasTime = elem(p.hi, q.hasTime, j)
			m[j] = e
			if e != nil {
				m[j] = argMatcher(e, ids, q)
			}
		}
		return m
	}
	if s, ok := a.(string); ok && ids[s] {
		return AnyID()
	}
	if p.hasTime && !reflect.DeepEqual(p.lo, a) {
		return between{p.lo, p.hi}
	}
	if p.hasJSON && !reflect.DeepEqual(p.json, a) {
		return jsonArg(a)
	}
	return a
}

// matchesEqual reports whether mock, made by sqlmock.New, matches queries
// with sqlmock.QueryMatcherEqual. sqlmock does not export its matcher, so
// this compares the function in its unexported field with
// QueryMatcherEqual's; any other mock is taken to match with regular
// expressions, the default.
func matchesEqual(mock sqlmock.Sqlmock) bool {
	v := reflect.ValueOf(mock)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return false
	}
	f := v.Elem().FieldByName("queryMatcher")
	if !f.IsValid() || f.Kind() != reflect.Interface || f.IsNil() {
		return false
	}
	m, eq := f.Elem(), reflect.ValueOf(sqlmock.QueryMatcherEqual)
	return m.Kind() == reflect.Func && eq.Kind() == reflect.Func && m.Pointer() == eq.Pointer()
}

// between matches an argument from lo to hi, of their type: an instant as
// time.Time, as text (a date and time from the year down, ordered as text)
// or as a number.
type between struct{ lo, hi any }

func (b between) Match(v driver.Value) bool {
	switch lo := b.lo.(type) {
	case time.Time:
		t, ok := v.(time.Time)
		return ok && !t.Before(lo) && !t.After(b.hi.(time.Time))
	case string:
		s, ok := v.(string)
		if !ok {
			return false
		}
		// An instant as RFC 3339 text (an element of PostgreSQL's
		// timestamptz[] literal) does not order as text: compare instants.
		tl, el := time.Parse(time.RFC3339Nano, lo)
		th, eh := time.Parse(time.RFC3339Nano, b.hi.(string))
		if t, e := time.Parse(time.RFC3339Nano, s); el == nil && eh == nil && e == nil {
			return !t.Before(tl) && !t.After(th)
		}
		return s >= lo && s <= b.hi.(string)
	case int64:
		n, ok := v.(int64)
		return ok && n >= lo && n <= b.hi.(int64)
	case float64:
		n, ok := v.(float64)
		return ok && n >= lo && n <= b.hi.(float64)
	}
	return false
}
