package outbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/oncommit/oncommit/outboxdriver"
)

// TestFanOutRows: each message of a topic with subscribers becomes a row
// per subscriber, its key and dedup key behind the subscriber; a batch
// whose copies need more parameters than a statement holds is refused
// before any SQL.
func TestFanOutRows(t *testing.T) {
	d := stubDialect{outboxdriver.Capabilities{MaxParams: 70, ParamsPerRow: 7}} // 10 rows a statement
	ob, err := New(d, Config{MaxBatch: 10, Subscribers: map[string][]string{"t": {"a", "b"}}})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := ob.rows([]Message{{Topic: "t", Key: "k", DedupKey: "d"}, {Topic: "u", Key: "k"}, {Topic: "t"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r.Topic+"|"+strings.ReplaceAll(r.Key, "\x1f", "/")+"|"+strings.ReplaceAll(r.DedupKey, "\x1f", "/"))
	}
	if want := "t|a/k|a/d t|b/k|b/d u|k| t|a/| t|b/|"; strings.Join(got, " ") != want {
		t.Fatalf("rows %q, want %q", strings.Join(got, " "), want)
	}
	ids := map[ID]bool{}
	for _, r := range rows {
		if ids[r.ID] {
			t.Fatalf("id %v twice", r.ID)
		}
		ids[r.ID] = true
	}
	five := make([]Message, 5)
	for i := range five {
		five[i] = Message{Topic: "t"}
	}
	if _, err := ob.rows(five, nil); err != nil {
		t.Fatalf("5 messages, 10 rows: %v", err)
	}
	var me *MessageError
	if _, err := ob.rows(append(five, Message{Topic: "t"}), nil); !errors.As(err, &me) || me.Field != "batch" {
		t.Fatalf("6 messages, 12 rows: %v, want a MessageError on the batch", err)
	}
	if _, err := ob.rows(append(five, Message{Topic: "u"}), nil); err == nil {
		t.Fatal("6 messages, 11 rows: accepted")
	}
}
