package pgwal

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/oncommit/oncommit/outboxdriver"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 4, 10, 0, 0, 123456000, time.UTC)
	for _, e := range []Envelope{
		{ID: outboxdriver.ID{1, 2, 3}, Topic: "orders.created", Key: "k1", Payload: []byte(`{"a":1}`), Headers: []byte(`{"h":"v"}`), Ordered: true, CreatedAt: at},
		{ID: outboxdriver.ID{9}, Topic: "t", CreatedAt: at},                                       // no key, NULL payload, no headers
		{ID: outboxdriver.ID{9}, Topic: "t", Payload: []byte{}, Headers: []byte{}, CreatedAt: at}, // empty, not NULL
	} {
		got, err := Decode(Append(nil, e))
		if err != nil {
			t.Fatalf("%+v: %v", e, err)
		}
		if got.ID != e.ID || got.Topic != e.Topic || got.Key != e.Key || got.Ordered != e.Ordered || !got.CreatedAt.Equal(e.CreatedAt) ||
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

// The position moves only over a prefix of transactions that are all
// settled, whatever order their messages settle in.
func TestTrackerConfirmsSettledPrefix(t *testing.T) {
	var tr tracker
	tr.add(100, 2)
	tr.add(200, 0) // nothing of ours: settled, but behind 100
	tr.add(300, 1)
	if pos, n := tr.position(); pos != 0 || n != 3 {
		t.Fatalf("before any settle: %v, %d", pos, n)
	}
	tr.idle(1000) // outstanding transactions: idle must not move it
	if !tr.settled(300) {
		t.Fatal("settled(300) refused")
	}
	if pos, _ := tr.position(); pos != 0 {
		t.Fatalf("300 settled, 100 not: position %v", pos)
	}
	tr.settled(100)
	if pos, _ := tr.position(); pos != 0 {
		t.Fatalf("one of 100's two settled: position %v", pos)
	}
	tr.settled(100)
	if pos, n := tr.position(); pos != 300 || n != 0 {
		t.Fatalf("all settled: %v, %d; want 300, 0", pos, n)
	}
	if tr.settled(100) || tr.settled(999) {
		t.Error("settled a message of no outstanding transaction")
	}
	tr.idle(pglogrepl.LSN(400))
	if pos, _ := tr.position(); pos != 400 {
		t.Errorf("idle with nothing outstanding: %v, want 400", pos)
	}
	tr.idle(pglogrepl.LSN(350))
	if pos, _ := tr.position(); pos != 400 {
		t.Errorf("idle went back: %v", pos)
	}
}
