package pgwal

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// The position moves only over a prefix of transactions that are all
// settled, whatever order their messages settle in.
func TestTrackerConfirmsSettledPrefix(t *testing.T) {
	var tr tracker
	tr.add(100, time.Unix(1, 0), 2)
	tr.add(200, time.Unix(2, 0), 0) // nothing of ours: settled, but behind 100
	tr.add(300, time.Unix(3, 0), 1)
	if pos, n := tr.position(); pos != 0 || n != 3 {
		t.Fatalf("before any settle: %v, %d", pos, n)
	}
	if at := tr.oldest(); !at.Equal(time.Unix(1, 0)) {
		t.Fatalf("oldest outstanding: %v, want the first transaction's commit", at)
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
	if at := tr.oldest(); !at.IsZero() {
		t.Fatalf("oldest with nothing outstanding: %v", at)
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
