package postgres

import (
	"strings"
	"testing"

	"github.com/oncommit/oncommit/outboxdriver"
)

// TestBytesDest: payloads scanned into a claim's buffer keep their bytes
// whatever is scanned after them (the driver's buffer is reused, the
// claim's buffer grows into new ones), NULL stays nil and empty stays
// non-nil, a slice is capped so that appending to it never overwrites the
// next row's, and a large text gets its own allocation.
func TestBytesDest(t *testing.T) {
	var arena []byte
	texts := []string{`{"a":1}`, "", strings.Repeat("x", 700), `{"b":2}`, strings.Repeat("y", maxArena), `{"c":3}`}
	got := make([][]byte, len(texts)+1)
	driver := make([]byte, 0, 2*maxArena) // one buffer reused for every row, as pgx does
	for i, s := range texts {
		driver = append(driver[:0], s...)
		before := arena
		if err := (bytesDest{&got[i], &arena}).ScanBytes(driver); err != nil {
			t.Fatal(err)
		}
		if len(s) > maxArena/4 && (len(arena) != len(before) || cap(arena) != cap(before)) {
			t.Errorf("row %d: a text over a quarter of maxArena went into the shared buffer (length %d -> %d, capacity %d -> %d)",
				i, len(before), len(arena), cap(before), cap(arena))
		}
		for j := range driver {
			driver[j] = '!'
		}
	}
	if err := (bytesDest{&got[len(texts)], &arena}).ScanBytes(nil); err != nil {
		t.Fatal(err)
	}
	for i, s := range texts {
		if string(got[i]) != s || got[i] == nil {
			t.Errorf("row %d: got %q (nil %v), want %q", i, got[i], got[i] == nil, s)
		}
		if cap(got[i]) != len(got[i]) {
			t.Errorf("row %d: capacity %d past its length %d", i, cap(got[i]), len(got[i]))
		}
	}
	if got[len(texts)] != nil {
		t.Errorf("NULL: got %q, want nil", got[len(texts)])
	}
	_ = append(got[0], "zzzz"...)
	if string(got[2]) != texts[2] || string(got[3]) != texts[3] {
		t.Error("appending to a payload changed the next rows'")
	}
	for _, src := range []any{[]byte(`{"d":4}`), `{"d":4}`} {
		var p []byte
		if err := (bytesDest{&p, &arena}).Scan(src); err != nil || string(p) != `{"d":4}` {
			t.Errorf("Scan(%T): %q, %v", src, p, err)
		}
	}
	var p []byte = []byte("x")
	if err := (bytesDest{&p, &arena}).Scan(nil); err != nil || p != nil {
		t.Errorf("Scan(nil): %q, %v", p, err)
	}
}

// TestBytesDestAllocs: a claim's payloads share a few buffers instead of
// an allocation each.
func TestBytesDestAllocs(t *testing.T) {
	payload := []byte(`{"order_id":"0193a1f2","total_cents":4200}`)
	allocs := testing.AllocsPerRun(20, func() {
		var arena []byte
		var p []byte
		for range 100 {
			if err := (bytesDest{&p, &arena}).ScanBytes(payload); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs > 4 { // 1, 2 and 4 KiB buffers for 4.3 KiB
		t.Errorf("%.0f allocations for 100 payloads, want at most 4", allocs)
	}
}

// TestIDDest: an id scans from its 16 bytes (uuid_send, the claim's
// column) and from its text form (id::text, the ordered claim's), through
// pgx's ScanBytes and database/sql's Scan alike; other lengths are refused.
func TestIDDest(t *testing.T) {
	want := outboxdriver.NewID()
	text := want.String()
	for _, src := range []any{want[:], []byte(text), text, []byte(strings.ToUpper(text))} {
		var got outboxdriver.ID
		if err := (idDest{&got}).Scan(src); err != nil || got != want {
			t.Errorf("Scan(%T %v) = %v, %v; want %v", src, src, got, err, want)
		}
		if b, ok := src.([]byte); ok {
			got = outboxdriver.ID{}
			if err := (idDest{&got}).ScanBytes(b); err != nil || got != want {
				t.Errorf("ScanBytes(%v) = %v, %v; want %v", b, got, err, want)
			}
		}
	}
	var got outboxdriver.ID
	for _, b := range [][]byte{want[:15], append(want[:16:16], 0), nil} {
		if err := (idDest{&got}).ScanBytes(b); err == nil {
			t.Errorf("ScanBytes of %d bytes: no error", len(b))
		}
	}
}
