package outbox

import (
	"bytes"
	"strings"
	"testing"

	"github.com/oncommit/oncommit/outboxdriver"
)

// TestNewIDsOrdered: a batch's ids are distinct and ordered as its rows,
// of the first one's millisecond, while other goroutines make ids.
func TestNewIDsOrdered(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // other publishers, moving the shared entropy meanwhile
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				NewID()
			}
		}
	}()
	defer func() { close(stop); <-done }()
	for range 200 {
		rows := make([]outboxdriver.Row, 1000)
		newIDs(rows)
		for i := 1; i < len(rows); i++ {
			if bytes.Compare(rows[i-1].ID[:], rows[i].ID[:]) >= 0 {
				t.Fatalf("ids %d and %d out of order: %v, %v", i-1, i, rows[i-1].ID, rows[i].ID)
			}
			if !rows[i].ID.Time().Equal(rows[0].ID.Time()) {
				t.Fatalf("id %d of another millisecond: %v, first %v", i, rows[i].ID.Time(), rows[0].ID.Time())
			}
		}
	}
}

// TestPlainText: the one-pass check accepts only what checkText's full
// checks accept, and refuses no ASCII text they accept.
func TestPlainText(t *testing.T) {
	texts := []string{"", " ", "\t\n\v\f\r ", "a", " a ", "a\x00", "\x00", "\x01", "\x1f", "\x7f", "caf\u00e9", "\u00a0", "\u0085", "\xff", strings.Repeat("x", 300)}
	for c := range 128 {
		texts = append(texts, string(rune(c)), " "+string(rune(c)))
	}
	for _, s := range texts {
		fast := plainText(s)
		slow := slowCheckText(s, len(s)+1) == nil // plainText leaves the length to checkText
		if fast && !slow {
			t.Errorf("plainText(%q) = true, full checks refuse it", s)
		}
		if !fast && slow && isASCII(s) && len(s) > 0 {
			t.Errorf("plainText(%q) = false for an ASCII text the full checks accept", s)
		}
		if got, want := checkText(0, "Topic", s, MaxTopicBytes, true) == nil, slowCheckText(s, MaxTopicBytes) == nil; got != want {
			t.Errorf("checkText(%q) accepts: %v, full checks: %v", s, got, want)
		}
	}
}

// slowCheckText is checkText without its fast path.
func slowCheckText(s string, max int) error {
	return checkTextFull(0, "Topic", s, max, true)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
