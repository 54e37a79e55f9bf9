package outboxtest

import (
	"bytes"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"math/big"
	"reflect"
	"strings"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/internal/walenv"
	"github.com/oncommit/oncommit/outbox"
)

// AnyID returns a sqlmock argument matcher that accepts any valid message
// id in its text form ([outbox.ID.String]), such as the ids Publish
// generates: use it in your own WithArgs where the id is not known.
func AnyID() sqlmock.Argument { return anyID{} }

type anyID struct{}

func (anyID) Match(v driver.Value) bool {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return false
	}
	id, err := outbox.ParseID(s)
	return err == nil && !id.IsZero() && id.String() == s
}

// JSON returns v encoded as JSON by encoding/json, for
// Message.Payload in the messages given to [ExpectPublish], which compares
// payloads as JSON: the test states the payload as a Go value (the struct
// the code under test marshals, or a map) instead of its bytes. It panics
// if v cannot be encoded, like regexp.MustCompile: that is a mistake in
// the test.
func JSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("outboxtest.JSON: %v", err))
	}
	return b
}

// JSONEq returns a sqlmock argument matcher that accepts a JSON document
// (as string or []byte) equal, as JSON, to want: the same values whatever
// the spacing and the order of object members, numbers compared by value
// (1.0 equals 1). A []byte or json.RawMessage want is taken as JSON text;
// any other value is encoded with encoding/json first. It panics if want
// cannot be encoded or is not valid JSON, like regexp.MustCompile.
//
// Its Match also suits a delivered payload: JSONEq(want).Match(d.Payload).
func JSONEq(want any) sqlmock.Argument {
	var text []byte
	switch w := want.(type) {
	case []byte:
		text = w
	case json.RawMessage:
		text = w
	default:
		text = JSON(want)
	}
	v, err := decodeJSON(text)
	if err != nil {
		panic(fmt.Sprintf("outboxtest.JSONEq: %v", err))
	}
	return jsonEq{v}
}

// jsonArg matches a JSON argument of the statement Publish builds for the
// expected message: string or []byte, JSON text.
func jsonArg(a any) driver.Value {
	switch a := a.(type) {
	case string:
		if v, err := decodeJSON([]byte(a)); err == nil {
			return jsonEq{v}
		}
	case []byte:
		if v, err := decodeJSON(a); err == nil {
			return jsonEq{v}
		}
	}
	return a
}

type jsonEq struct{ want any }

func (m jsonEq) Match(v driver.Value) bool {
	var got any
	var err error
	switch v := v.(type) {
	case string:
		got, err = decodeJSON([]byte(v))
	case []byte:
		got, err = decodeJSON(v)
	default:
		return false
	}
	return err == nil && equalJSON(m.want, got)
}

// String shows the expected document in sqlmock's messages.
func (m jsonEq) String() string {
	b, _ := json.Marshal(m.want)
	return "JSON " + string(b)
}

func decodeJSON(b []byte) (any, error) {
	if !json.Valid(b) {
		return nil, fmt.Errorf("not valid JSON: %.40q", b)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// equalJSON compares decoded documents, numbers by value.
func equalJSON(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		x, okx := new(big.Rat).SetString(a.String())
		y, oky := new(big.Rat).SetString(b.String())
		return okx && oky && x.Cmp(y) == 0
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !equalJSON(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, av := range a {
			bv, ok := b[k]
			if !ok || !equalJSON(av, bv) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

// arrayElems returns the elements of a, when a is a one-dimensional
// PostgreSQL array literal of quoted elements and NULLs, as the dialect
// writes them ({"a",NULL,"b\"c"}): each a string, or nil for NULL. A JSON
// document is never one (an object's members have a colon; {} has no
// element and no message makes an empty array).
func arrayElems(a any) ([]any, bool) {
	s, ok := a.(string)
	if !ok || len(s) < 3 || s[0] != '{' || s[len(s)-1] != '}' {
		return nil, false
	}
	var out []any
	for i := 1; ; {
		switch {
		case strings.HasPrefix(s[i:], "NULL"):
			out = append(out, nil)
			i += len("NULL")
		case s[i] == '"':
			var b strings.Builder
			for i++; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' {
					i++
					if i == len(s) {
						return nil, false
					}
				}
				b.WriteByte(s[i])
			}
			if i >= len(s)-1 {
				return nil, false
			}
			out = append(out, b.String())
			i++
		default:
			return nil, false
		}
		switch {
		case i == len(s)-1:
			return out, true
		case s[i] == ',':
			i++
		default:
			return nil, false
		}
	}
}

// arrayMatch matches an array literal element by element: a nil element
// matches NULL, a sqlmock.Argument matches the element's text, and any
// other value is compared with it.
type arrayMatch []driver.Value

func (m arrayMatch) Match(v driver.Value) bool {
	if b, ok := v.([]byte); ok {
		v = string(b)
	}
	got, ok := arrayElems(v)
	if !ok || len(got) != len(m) {
		return false
	}
	for i, want := range m {
		switch w := want.(type) {
		case nil:
			if got[i] != nil {
				return false
			}
		case sqlmock.Argument:
			if got[i] == nil || !w.Match(got[i]) {
				return false
			}
		default:
			if got[i] != want {
				return false
			}
		}
	}
	return true
}

// String shows the expected elements in sqlmock's messages.
func (m arrayMatch) String() string {
	parts := make([]string, len(m))
	for i, w := range m {
		switch w := w.(type) {
		case nil:
			parts[i] = "NULL"
		case fmt.Stringer:
			parts[i] = w.String()
		case anyID:
			parts[i] = "any id"
		default:
			parts[i] = fmt.Sprintf("%q", w)
		}
	}
	return "array {" + strings.Join(parts, ", ") + "}"
}

// envelopeMatch matches the messages of PostgreSQL's WAL transport
// (postgres.WALDialect) as the publish statement carries them, envelopes
// back to back: as many, in order, each with the same topic, key and
// ordering, payload and headers equal as JSON, any id.
type envelopeMatch struct{ want []walenv.Envelope }

func (m envelopeMatch) Match(v driver.Value) bool {
	b, ok := v.([]byte)
	if !ok {
		return false
	}
	got, err := walenv.DecodeAll(b)
	if err != nil || len(got) != len(m.want) {
		return false
	}
	for i, w := range m.want {
		g := got[i]
		if g.Topic != w.Topic || g.Key != w.Key || g.Ordered != w.Ordered || !sameJSON(w.Payload, g.Payload) || !sameJSON(w.Headers, g.Headers) {
			return false
		}
	}
	return true
}

// sameJSON reports whether two stored documents (nil for NULL) are the
// same: both NULL, or equal as JSON.
func sameJSON(a, b []byte) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	da, errA := decodeJSON(a)
	db, errB := decodeJSON(b)
	if errA != nil || errB != nil {
		return bytes.Equal(a, b)
	}
	return equalJSON(da, db)
}

// String shows the expected messages in sqlmock's messages.
func (m envelopeMatch) String() string {
	parts := make([]string, len(m.want))
	for i, w := range m.want {
		parts[i] = fmt.Sprintf("topic=%q key=%q payload=%s headers=%s", w.Topic, w.Key, w.Payload, w.Headers)
	}
	return "WAL messages {" + strings.Join(parts, "; ") + "}"
}
