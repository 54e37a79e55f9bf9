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
