package walenv

import (
	"bytes"
	"errors"
	"testing"

	"github.com/oncommit/oncommit/outboxdriver"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	for _, e := range []Envelope{
		{ID: outboxdriver.ID{1, 2, 3}, Topic: "orders.created", Key: "k1", Payload: []byte(`{"a":1}`), Headers: []byte(`{"h":"v"}`), Ordered: true},
		{ID: outboxdriver.ID{9}, Topic: "t"},                                       // no key, NULL payload, no headers
		{ID: outboxdriver.ID{9}, Topic: "t", Payload: []byte{}, Headers: []byte{}}, // empty, not NULL
	} {
		got, err := Decode(Append(nil, e))
		if err != nil {
			t.Fatalf("%+v: %v", e, err)
		}
		if got.ID != e.ID || got.Topic != e.Topic || got.Key != e.Key || got.Ordered != e.Ordered ||
			!bytes.Equal(got.Payload, e.Payload) || (got.Payload == nil) != (e.Payload == nil) ||
			!bytes.Equal(got.Headers, e.Headers) || (got.Headers == nil) != (e.Headers == nil) {
			t.Errorf("round trip of %+v gave %+v", e, got)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := Append(nil, Envelope{Topic: "t", Payload: []byte("{}")})
	bad := map[string][]byte{
		"empty":     nil,
		"short":     good[:10],
		"version":   append([]byte{2}, good[1:]...),
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
		"no topic":  Append(nil, Envelope{}),
	}
	for name, b := range bad {
		if _, err := Decode(b); !errors.Is(err, ErrEnvelope) {
			t.Errorf("%s: %v, want ErrEnvelope", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Append(nil, Envelope{Topic: "t", Key: "k", Payload: []byte("{}")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := Decode(b)
		if err != nil {
			return
		}
		if again, err := Decode(Append(nil, e)); err != nil || again.Topic != e.Topic || !bytes.Equal(again.Payload, e.Payload) {
			t.Fatalf("re-encoding %+v: %+v, %v", e, again, err)
		}
	})
}

// A publish's content is its envelopes back to back: DecodeAll gives
// them in order, and refuses content with a broken one anywhere.
func TestDecodeAll(t *testing.T) {
	es := []Envelope{
		{ID: outboxdriver.ID{1}, Topic: "a", Key: "k", Payload: []byte(`{"n":1}`), Ordered: true},
		{ID: outboxdriver.ID{2}, Topic: "b"},
		{ID: outboxdriver.ID{3}, Topic: "c", Headers: []byte(`{"h":"v"}`), Payload: []byte(`[]`)},
	}
	var b []byte
	for _, e := range es {
		b = Append(b, e)
	}
	got, err := DecodeAll(b)
	if err != nil || len(got) != len(es) {
		t.Fatalf("DecodeAll: %d envelopes, %v; want %d", len(got), err, len(es))
	}
	for i := range es {
		if got[i].ID != es[i].ID || got[i].Topic != es[i].Topic || got[i].Ordered != es[i].Ordered || !bytes.Equal(got[i].Payload, es[i].Payload) {
			t.Errorf("envelope %d: %+v, want %+v", i, got[i], es[i])
		}
	}
	if _, err := Decode(b); !errors.Is(err, ErrEnvelope) {
		t.Errorf("Decode of three envelopes: %v, want ErrEnvelope (trailing bytes)", err)
	}
	for name, bad := range map[string][]byte{"empty": nil, "truncated": b[:len(b)-1], "garbage after": append(append([]byte{}, b...), 7)} {
		if _, err := DecodeAll(bad); !errors.Is(err, ErrEnvelope) {
			t.Errorf("%s: %v, want ErrEnvelope", name, err)
		}
	}
}
