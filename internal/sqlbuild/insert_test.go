package sqlbuild

import (
	"strconv"
	"strings"
	"testing"

	"github.com/oncommit/oncommit/outboxdriver"
)

func testInsert() *Insert {
	return &Insert{
		Placeholder: func(b *strings.Builder, n int) { b.WriteString("$" + strconv.Itoa(n)) },
		Now:         "now()",
		OnConflict:  " ON CONFLICT DO NOTHING",
		Returning:   " RETURNING id",
		Notify: func(b *strings.Builder, insert string, t outboxdriver.Table, returning bool, payload string) {
			b.WriteString("NOTIFY " + t.String() + " " + payload + " " + strconv.FormatBool(returning) + ": " + insert)
		},
	}
}

// TestBuildCache checks that the statement cache gives back, for every
// table, batch size, column set and notification, the text an Insert that
// never built anything writes, however the calls alternate (the per-shape
// slot holds only the last statement of its shape).
func TestBuildCache(t *testing.T) {
	tables := []outboxdriver.Table{{Name: "a"}, {Schema: "s", Name: "a"}, {Name: "b"}}
	row := func(key, dedup string) outboxdriver.Row {
		return outboxdriver.Row{ID: outboxdriver.NewID(), Topic: "t", Key: key, DedupKey: dedup, Payload: []byte(`{}`)}
	}
	wakes := []outboxdriver.Wake{{}, {Send: true, Payload: "2000"}, {Send: true, Payload: "5000"}}
	cached := testInsert()
	for round := range 3 {
		for _, tb := range tables {
			for _, n := range []int{1, 2, 1, 3} {
				for _, w := range wakes {
					for _, cols := range [][2]string{{"", ""}, {"k", ""}, {"k", "d"}} {
						rows := make([]outboxdriver.Row, n)
						for i := range rows {
							rows[i] = row(cols[0], cols[1])
						}
						got, gotArgs := cached.Build(`"`+tb.String()+`"`, tb, rows, w, func(b []byte) any { return string(b) })
						want, wantArgs := testInsert().Build(`"`+tb.String()+`"`, tb, rows, w, func(b []byte) any { return string(b) })
						if got != want {
							t.Fatalf("round %d, table %s, %d rows, wake %+v, columns %q:\n got %s\nwant %s", round, tb, n, w, cols, got, want)
						}
						if len(gotArgs) != len(wantArgs) || gotArgs[0] != wantArgs[0] {
							t.Fatalf("args %v, want %v", gotArgs, wantArgs)
						}
					}
				}
			}
		}
	}
}

// TestBuildArgsShared checks the arguments of rows that share values with
// the row before them and of rows that do not: each argument is the row's
// own value (NULL for an empty key, a nil payload or nil headers), whether
// it was reused from the previous row or made anew.
func TestBuildArgsShared(t *testing.T) {
	p1, p2 := []byte(`{"a":1}`), []byte(`{"a":1}`) // equal text, other memory
	h := []byte(`{"h":"v"}`)
	rows := []outboxdriver.Row{
		{Topic: "t", Key: "k", Payload: p1, Headers: h},
		{Topic: "t", Key: "k", Payload: p1, Headers: h},
		{Topic: "u", Key: "", Payload: p2},
		{Topic: "u", Key: "", Payload: p2[:0]},
		{Topic: "t", Key: "k", Payload: nil, Headers: h[:0]},
		{Topic: "t", Key: "k2", Payload: p1[:3]},
		{Topic: "t", Key: "k2", Payload: p1},
	}
	for i := range rows {
		rows[i].ID = outboxdriver.NewID()
	}
	text := func(b []byte) any { return "text:" + string(b) }
	_, args := testInsert().Build(`"o"`, outboxdriver.Table{Name: "o"}, rows, outboxdriver.Wake{}, text)
	const width = 5 // id, topic, key, payload, headers
	if len(args) != width*len(rows) {
		t.Fatalf("%d arguments for %d rows", len(args), len(rows))
	}
	for i, r := range rows {
		want := []any{r.ID.String(), r.Topic, nullString(r.Key), nullBytes(r.Payload, text), nullBytes(r.Headers, text)}
		for c, w := range want {
			if got := args[width*i+c]; got != w {
				t.Errorf("row %d, column %d: %#v, want %#v", i, c, got, w)
			}
		}
	}
}
