package outboxtest

import (
	"bytes"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"math/big"
	"reflect"

	"github.com/DATA-DOG/go-sqlmock"
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
