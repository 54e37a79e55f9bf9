package fwd

import (
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

func TestPercentEncode(t *testing.T) {
	for in, want := range map[string]string{
		"Euro € 😀":                "Euro%20%E2%82%AC%20%F0%9F%98%80", // the binding's example
		"order.placed":            "order.placed",
		`a"b%c`:                   "a%22b%25c",
		"tab\there\x7f":           "tab%09here%7F",
		"2026-12-07T01:02:03.45Z": "2026-12-07T01:02:03.45Z",
	} {
		if got := PercentEncode(in); got != want {
			t.Errorf("PercentEncode(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestEnvelopeOf(t *testing.T) {
	id := outbox.NewID()
	at := time.Date(2026, 12, 7, 1, 2, 3, 456789000, time.FixedZone("x", 3600))
	d := outbox.Delivery{ID: id, Topic: "order.placed", Key: "A-1", Payload: []byte(`{}`), CreatedAt: at}
	e := EnvelopeOf(&d, "")
	want := Envelope{ID: id.String(), Type: "order.placed", Source: DefaultSource, Time: "2026-12-07T00:02:03.456789Z", ContentType: JSON, Key: "A-1"}
	if e != want {
		t.Fatalf("%+v, want %+v", e, want)
	}
	if n := len(e.CloudEvents()); n != 6 {
		t.Fatalf("%d attributes with a key, want 6", n)
	}
	d.Key, d.Payload = "", nil
	e = EnvelopeOf(&d, "/orders")
	if e.Source != "/orders" || e.ContentType != "" || len(e.CloudEvents()) != 5 {
		t.Fatalf("no key, no payload: %+v %v", e, e.CloudEvents())
	}
}
