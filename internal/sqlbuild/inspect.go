package sqlbuild

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// InspectBatch is the most rows one statement (or transaction) of a bulk
// action changes.
const InspectBatch = 1000

// Inspect builds the inspection statements of one dialect: the filter's
// conditions, the listing and the count. Every value reaches SQL through
// Bind; states and the action's conditions are literals (known words), so
// that a partial index on state = 'dead' matches the query.
type Inspect struct {
	// Now is the database clock in the columns' type.
	Now string
	// Bind records v (a string, an int64 or a time given as int64
	// microseconds since the epoch) and returns its placeholder, or
	// writes it as a literal.
	Bind func(args *[]any, v any) string
	// BindID, when not nil, binds an id (its text form) instead of Bind.
	BindID func(args *[]any, id string) string
	// Topic compares column col with the bound topic p, byte for byte.
	Topic func(col, p string) string
	// Contains is true when column col contains the bound text p.
	Contains func(col, p string) string
	// Time converts bound microseconds since the epoch p to the time
	// columns' type.
	Time func(p string) string
	// Micros converts time column col to microseconds since the epoch.
	Micros func(col string) string
	// Text converts column col (id, payload, headers) to text.
	Text func(col string) string
}

// Where returns the conditions of f on columns prefixed by prefix ("" or
// "o."), ANDed, or "TRUE"-like "1 = 1" when f selects everything. The
// cursor f.After is included when withAfter.
func (s *Inspect) Where(args *[]any, f outboxdriver.Filter, prefix string, withAfter bool) string {
	var c []string
	if len(f.IDs) > 0 {
		ps := make([]string, len(f.IDs))
		for i, id := range f.IDs {
			ps[i] = s.bindID(args, id)
		}
		c = append(c, prefix+"id IN ("+strings.Join(ps, ", ")+")")
	}
	if len(f.States) > 0 {
		ps := make([]string, len(f.States))
		for i, st := range f.States {
			ps[i] = "'" + string(st) + "'" // validated: one of the four states
		}
		if len(ps) == 1 {
			c = append(c, prefix+"state = "+ps[0])
		} else {
			c = append(c, prefix+"state IN ("+strings.Join(ps, ", ")+")")
		}
	}
	if f.Topic != "" {
		c = append(c, s.Topic(prefix+"topic", s.Bind(args, f.Topic)))
	}
	switch {
	case f.Subscriber != "" && f.Key != "":
		c = append(c, prefix+"message_key = "+s.Bind(args, outboxdriver.SubscriberKey(f.Subscriber, f.Key)))
	case f.Subscriber != "":
		// A copy's stored key begins with its subscriber and the
		// separator (ASCII: as many characters as bytes).
		p := outboxdriver.SubscriberKey(f.Subscriber, "")
		c = append(c, "substr("+prefix+"message_key, 1, "+strconv.Itoa(len(p))+") = "+s.Bind(args, p))
	case f.Key != "":
		c = append(c, prefix+"message_key = "+s.Bind(args, f.Key))
	}
	if f.ErrorContains != "" {
		c = append(c, s.Contains(prefix+"last_error", s.Bind(args, f.ErrorContains)))
	}
	for _, r := range []struct {
		col, op string
		at      time.Time
	}{
		{"created_at", ">=", f.CreatedFrom}, {"created_at", "<", f.CreatedTo},
		{"settled_at", ">=", f.SettledFrom}, {"settled_at", "<", f.SettledTo},
	} {
		if !r.at.IsZero() {
			c = append(c, prefix+r.col+" "+r.op+" "+s.Time(s.Bind(args, r.at.UnixMicro())))
		}
	}
	if withAfter && !f.After.IsZero() {
		c = append(c, prefix+"id > "+s.bindID(args, f.After))
	}
	if len(c) == 0 {
		return "1 = 1"
	}
	return strings.Join(c, " AND ")
}

func (s *Inspect) bindID(args *[]any, id outboxdriver.ID) string {
	if s.BindID != nil {
		return s.BindID(args, id.String())
	}
	return s.Bind(args, id.String())
}

// ActWhere is the condition of the rows action a may change (its source
// state), on columns prefixed by prefix.
func (s *Inspect) ActWhere(a outboxdriver.Action, prefix string) string {
	switch a {
	case ActRedrive:
		return prefix + "state = 'dead'"
	case ActRetry:
		return prefix + "state = 'pending' AND " + prefix + "available_at > " + s.Now
	default:
		return prefix + "state <> 'processing'"
	}
}

// The actions, under short names.
const (
	ActRedrive = outboxdriver.ActRedrive
	ActRetry   = outboxdriver.ActRetry
	ActDelete  = outboxdriver.ActDelete
)

// ActSet is the SET list of an update action (redrive, retry), on columns
// prefixed by prefix.
func (s *Inspect) ActSet(a outboxdriver.Action, prefix string) string {
	if a == ActRedrive {
		return prefix + "state = 'pending', " + prefix + "attempts_base = " + prefix + "attempts, " + prefix + "available_at = " + s.Now + ", " + prefix + "settled_at = NULL, " + prefix + "last_error = NULL"
	}
	return prefix + "available_at = " + s.Now
}

// Columns returns the listing's select list (key_seq last: ordered
// delivery's column, which every dialect's migrations add).
func (s *Inspect) Columns(withPayload bool) string {
	payload, headers := "NULL", "NULL"
	if withPayload {
		payload, headers = s.Text("payload"), s.Text("headers")
	}
	return s.Text("id") + ", topic, message_key, " + payload + ", " + headers + ", dedup_key, state, attempts, attempts_base, " +
		s.Micros("available_at") + ", " + s.Micros("created_at") + ", " + s.Micros("settled_at") + ", last_error, key_seq"
}

// List builds the listing of at most limit rows matching f in id order.
func (s *Inspect) List(table string, f outboxdriver.Filter, limit int, withPayload bool) (string, []any) {
	var args []any
	where := s.Where(&args, f, "", true)
	// The table's id, not the select list's id (text on PostgreSQL: a sort
	// of every row instead of the primary key's order).
	return "SELECT " + s.Columns(withPayload) + " FROM " + table + " WHERE " + where + " ORDER BY " + table + ".id LIMIT " + strconv.Itoa(limit), args
}

// Count builds the count of the rows matching f.
func (s *Inspect) Count(table string, f outboxdriver.Filter) (string, []any) {
	var args []any
	return "SELECT count(*) FROM " + table + " WHERE " + s.Where(&args, f, "", true), args
}

// ScanMessages reads the rows of a List statement.
func ScanMessages(rows outboxdriver.Rows) ([]outboxdriver.MessageInfo, error) {
	defer rows.Close()
	var out []outboxdriver.MessageInfo
	for rows.Next() {
		var (
			id, topic                           string
			key, payload, headers, dedup, lastE sql.NullString
			state                               string
			attempts, base                      int64
			avail, created                      int64
			settled, keySeq                     sql.NullInt64
		)
		if err := rows.Scan(&id, &topic, &key, &payload, &headers, &dedup, &state, &attempts, &base, &avail, &created, &settled, &lastE, &keySeq); err != nil {
			return nil, err
		}
		pid, err := outboxdriver.ParseID(id)
		if err != nil {
			return nil, err
		}
		m := outboxdriver.MessageInfo{
			ID: pid, Topic: topic, Key: key.String, DedupKey: dedup.String, State: outboxdriver.State(state),
			Attempts: int(attempts), AttemptsBase: int(base), LastError: lastE.String,
			AvailableAt: time.UnixMicro(avail).UTC(), CreatedAt: time.UnixMicro(created).UTC(), KeySeq: keySeq.Int64,
		}
		if sub, k, ok := outboxdriver.SplitSubscriberKey(m.Key); ok {
			m.Subscriber, m.Key = sub, k
			_, m.DedupKey, _ = outboxdriver.SplitSubscriberKey(m.DedupKey)
		}
		if payload.Valid {
			m.Payload = []byte(payload.String)
		}
		if headers.Valid {
			m.Headers = []byte(headers.String)
		}
		if settled.Valid {
			m.SettledAt = time.UnixMicro(settled.Int64).UTC()
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// CountRows runs a statement returning one integer and returns it.
func CountRows(ctx context.Context, db outboxdriver.DB, q string, args ...any) (int64, error) {
	rows, err := db.QueryDB(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		if err := rows.Scan(&n); err != nil {
			return 0, err
		}
	}
	return n, rows.Err()
}
