package outbox

import (
	"encoding/json"
	"errors"
	"maps"
	"testing"
)

// headerSeeds are headers as the dialects return them (PostgreSQL's jsonb
// text with a space after colons and commas, MySQL's, SQLite's as stored)
// and the cases the fast path must leave to json.Unmarshal.
var headerSeeds = []string{
	`{}`, ` { } `, `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`,
	`{"a":"b","c":"d"}`, `{"a": "b", "c": "d", "e": ""}`, "{\n\t\"k\" :\r\"v\" }",
	`{"ü": "ß✓"}`, `{"a": "b\"c"}`, `{"a": "\u00e9"}`, `{"a": "b", "a": "c"}`, `{"a": 1}`,
	`{"a": null}`, `null`, `[]`, `{"a": "b",}`, `{"a" "b"}`, `{"a": "b"} x`, `{"a": "b"`,
	"{\"a\": \"\xff\"}", "{\"a\": \"\x01\"}", `{"a": "b", "c": {"d": "e"}}`, ``, ` `, `"s"`,
}

// TestDecodeHeadersLikeUnmarshal: decodeHeaders gives what json.Unmarshal
// gives (the same map, or an error for the same inputs), for every seed.
func TestDecodeHeadersLikeUnmarshal(t *testing.T) {
	for _, s := range headerSeeds {
		checkHeaders(t, []byte(s))
	}
	// The fast path takes the plain ones (no escape, no duplicate key).
	for _, s := range []string{`{}`, `{"a": "b", "c": "d", "e": ""}`, `{"ü": "ß✓"}`} {
		if _, ok := plainHeaders([]byte(s)); !ok {
			t.Errorf("%s: not read by the fast path", s)
		}
	}
	for _, s := range []string{`{"a": "b\"c"}`, `{"a": "b", "a": "c"}`, `{"a": null}`, "{\"a\": \"\xff\"}"} {
		if _, ok := plainHeaders([]byte(s)); ok {
			t.Errorf("%s: read by the fast path", s)
		}
	}
}

func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range headerSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkHeaders(t, b) })
}

func checkHeaders(t *testing.T, b []byte) {
	t.Helper()
	var want map[string]string
	werr := json.Unmarshal(b, &want)
	got, err := decodeHeaders(b)
	switch {
	case (err != nil) != (werr != nil):
		t.Errorf("%q: error %v, json.Unmarshal's %v", b, err, werr)
	case err != nil:
		var dl *DeadLetterError
		if !errors.As(err, &dl) {
			t.Errorf("%q: error %v is not a dead letter", b, err)
		}
	case !maps.Equal(got, want) || (got == nil) != (want == nil):
		t.Errorf("%q: %#v, json.Unmarshal gives %#v", b, got, want)
	}
}

// BenchmarkDecodeHeaders: a traceparent as PostgreSQL returns it, by the
// fast path and by json.Unmarshal.
//
//	go test ./outbox -run '^$' -bench DecodeHeaders -benchmem
func BenchmarkDecodeHeaders(b *testing.B) {
	in := []byte(`{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`)
	b.Run("decodeHeaders", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeHeaders(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var h map[string]string
			if err := json.Unmarshal(in, &h); err != nil {
				b.Fatal(err)
			}
		}
	})
}
