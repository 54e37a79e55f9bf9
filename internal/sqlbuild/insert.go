// Package sqlbuild writes the multi-row publish INSERT that the dialects
// share, from each dialect's spelling of placeholders, times and clauses.
package sqlbuild

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/oncommit/oncommit/outboxdriver"
)

// Insert is one dialect's spelling of the publish INSERT.
type Insert struct {
	// Placeholder writes bind parameter n (1-based, in text order): "$n",
	// "?n" or "?".
	Placeholder func(b *strings.Builder, n int)
	// Now is the database clock, as stored in available_at; the column's
	// default must be the same expression.
	Now string
	// Delay writes available_at for a delay held in parameter p.
	Delay func(b *strings.Builder, p func())
	// NotBefore writes available_at for an instant held in parameter p.
	NotBefore func(b *strings.Builder, p func())
	// DelayArg and NotBeforeArg give the argument for those parameters.
	DelayArg     func(r *outboxdriver.Row) any
	NotBeforeArg func(r *outboxdriver.Row) any
	// OnConflict skips rows whose dedup key is taken, and Returning then
	// returns the ids of the rows stored. Both are used only when some row
	// has a dedup key: without one no row can conflict, every row is stored
	// or the statement fails, and a plain INSERT is cheaper.
	OnConflict string
	Returning  string
	// Notify, when not nil, wraps the INSERT (with or without its
	// Returning clause) with the wake-up notification carrying payload.
	Notify func(b *strings.Builder, insert string, t outboxdriver.Table, returning bool, payload string)
	// OrderedBlocked, for a dialect that numbers ordered messages in the
	// database as they are stored (SQLite's trigger), lists the state
	// column when some row is Ordered: 'blocked' for the ordered rows,
	// 'pending' for the others, as literals. A batch without an ordered
	// row has the same text as without it.
	OrderedBlocked bool

	// stmts caches the text of statements whose rows are all immediate: a
	// batch of n such rows always has the same text.
	stmts sync.Map
	// last holds, per statement shape (shapeOf), the statement of that
	// shape last returned from stmts: a publisher that keeps sending the
	// same statement finds it with a comparison of keys, where the
	// sync.Map's lookup hashes the key through an interface.
	last [shapes]atomic.Pointer[cachedStmt]
}

// idLen is the length of an id's text form (ID.String).
const idLen = 36

// cachedStmt is one entry of Insert.last.
type cachedStmt struct {
	key stmtKey
	q   string
}

// shapes is the number of statement shapes: the optional columns (4 bits),
// notify and ordered.
const shapes = 1 << 6

func shapeOf(k *stmtKey) int {
	i := int(k.cols)
	if k.notify {
		i |= 1 << 4
	}
	if k.ordered {
		i |= 1 << 5
	}
	return i
}

// cached returns the cached text of the statement of key k, if any.
func (in *Insert) cached(k *stmtKey) (string, bool) {
	slot := &in.last[shapeOf(k)]
	if c := slot.Load(); c != nil && c.key == *k {
		return c.q, true
	}
	q, ok := in.stmts.Load(*k)
	if !ok {
		return "", false
	}
	slot.Store(&cachedStmt{*k, q.(string)})
	return q.(string), true
}

type stmtKey struct {
	table         outboxdriver.Table
	n             int
	cols          uint8
	dedup, notify bool
	payload       string
	ordered       bool // every row is Ordered (a mixed batch is not cached)
}

// Optional columns, present in the statement only when some row has a
// value for them; id and topic are always present.
const (
	colKey uint8 = 1 << iota
	colPayload
	colHeaders
	colDedup
)

var optional = [...]struct {
	bit  uint8
	name string
}{{colKey, "message_key"}, {colPayload, "payload"}, {colHeaders, "headers"}, {colDedup, "dedup_key"}}

// Build returns the statement storing rows in table t and its arguments.
//
// Only the columns some row has a value for are listed (rows without one
// get NULL), and available_at only when some row is delayed: otherwise the
// column's default, the database clock, applies. The parameters are the
// rows' values, row after row, in the order they appear in the text (a
// delayed row's scheduling parameter after its columns), so positional "?"
// placeholders work as well as numbered ones.
func (in *Insert) Build(quotedTable string, t outboxdriver.Table, rows []outboxdriver.Row, wake outboxdriver.Wake, text func(b []byte) any) (string, []any) {
	var cols uint8
	immediate := true
	ordered := 0
	for i := range rows {
		r := &rows[i]
		if r.Key != "" {
			cols |= colKey
		}
		if r.Payload != nil {
			cols |= colPayload
		}
		if r.Headers != nil {
			cols |= colHeaders
		}
		if r.DedupKey != "" {
			cols |= colDedup
		}
		immediate = immediate && r.Delay == 0 && r.NotBefore.IsZero()
		if in.OrderedBlocked && r.Ordered {
			ordered++
		}
	}
	// cached: the text depends only on the key (a mixed batch's literals
	// depend on which rows are ordered).
	cached := immediate && (ordered == 0 || ordered == len(rows))
	width := 2
	for _, c := range optional {
		if cols&c.bit != 0 {
			width++
		}
	}
	args := make([]any, 0, len(rows)*width)
	// The rows of a batch often share a topic, a key or a payload: a value
	// equal to the previous row's (a payload: the same bytes in memory)
	// reuses that row's argument instead of boxing or copying it again.
	var topicArg, keyArg, payloadArg, headersArg prevArg
	// The ids' text, all in one string: each argument is a slice of it,
	// one allocation for the batch instead of one per row.
	var idText strings.Builder
	idText.Grow(idLen * len(rows))
	var idBuf [idLen]byte
	for i := range rows {
		idText.Write(rows[i].ID.AppendText(idBuf[:0]))
	}
	ids := idText.String()
	for i := range rows {
		r := &rows[i]
		args = append(args, ids[i*idLen:(i+1)*idLen], topicArg.str(r.Topic, boxString))
		if cols&colKey != 0 {
			args = append(args, keyArg.str(r.Key, nullString))
		}
		if cols&colPayload != 0 {
			args = append(args, payloadArg.bytes(r.Payload, text))
		}
		if cols&colHeaders != 0 {
			args = append(args, headersArg.bytes(r.Headers, text))
		}
		if cols&colDedup != 0 {
			args = append(args, nullString(r.DedupKey))
		}
		switch {
		case immediate:
		case r.Delay > 0:
			args = append(args, in.DelayArg(r))
		case !r.NotBefore.IsZero():
			args = append(args, in.NotBeforeArg(r))
		}
	}
	dedup := cols&colDedup != 0
	notify := wake.Send && in.Notify != nil
	key := stmtKey{t, len(rows), cols, dedup, notify, "", ordered > 0}
	if notify {
		key.payload = wake.Payload
	}
	if cached {
		if q, ok := in.cached(&key); ok {
			return q, args
		}
	}
	var b strings.Builder
	b.Grow(200 + 8*width*len(rows))
	b.WriteString("INSERT INTO ")
	b.WriteString(quotedTable)
	b.WriteString(" (id, topic")
	for _, c := range optional {
		if cols&c.bit != 0 {
			b.WriteString(", ")
			b.WriteString(c.name)
		}
	}
	if !immediate {
		b.WriteString(", available_at")
	}
	if ordered > 0 {
		b.WriteString(", state")
	}
	b.WriteString(") VALUES ")
	n := 0
	p := func() { n++; in.Placeholder(&b, n) }
	for i := range rows {
		r := &rows[i]
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for c := range width {
			if c > 0 {
				b.WriteString(", ")
			}
			p()
		}
		if !immediate {
			b.WriteString(", ")
			switch {
			case r.Delay > 0:
				in.Delay(&b, p)
			case !r.NotBefore.IsZero():
				in.NotBefore(&b, p)
			default:
				b.WriteString(in.Now)
			}
		}
		switch {
		case ordered == 0:
		case r.Ordered:
			b.WriteString(", 'blocked'")
		default:
			b.WriteString(", 'pending'")
		}
		b.WriteByte(')')
	}
	if dedup {
		b.WriteString(in.OnConflict)
		b.WriteString(in.Returning)
	}
	q := b.String()
	if notify {
		var w strings.Builder
		in.Notify(&w, q, t, dedup, wake.Payload)
		q = w.String()
	}
	if cached {
		in.stmts.Store(key, q)
		in.last[shapeOf(&key)].Store(&cachedStmt{key, q})
	}
	return q, args
}

// prevArg is the argument Build made for a column of the previous row, and
// the value it made it from.
type prevArg struct {
	s   string
	b   []byte
	arg any
	set bool
}

// str returns the argument for s: the previous one when s is equal to its
// value, else conv(s).
func (p *prevArg) str(s string, conv func(string) any) any {
	if !p.set || s != p.s {
		p.s, p.arg, p.set = s, conv(s), true
	}
	return p.arg
}

// bytes returns the argument for b: the previous one when b is the same
// bytes in memory as its value (so their text is equal), else
// nullBytes(b, text).
func (p *prevArg) bytes(b []byte, text func([]byte) any) any {
	if !p.set || len(b) != len(p.b) || len(b) > 0 && &b[0] != &p.b[0] || (b == nil) != (p.b == nil) {
		p.b, p.arg, p.set = b, nullBytes(b, text), true
	}
	return p.arg
}

func boxString(s string) any { return s }

// nullString maps "" to SQL NULL.
func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// nullBytes maps nil to SQL NULL and passes JSON through text.
func nullBytes(b []byte, text func([]byte) any) any {
	if b == nil {
		return nil
	}
	return text(b)
}
