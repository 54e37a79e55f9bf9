package outboxtest_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/publishsql"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxtest"
)

func TestExpectations(t *testing.T) {
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Notify: outbox.NotifyOff})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	good := outbox.Message{Topic: "a", DedupKey: "k", Payload: []byte(`{}`)}

	t.Run("duplicate", func(t *testing.T) {
		db, mock, _ := sqlmock.New()
		defer db.Close()
		mock.ExpectBegin()
		outboxtest.ExpectPublishDuplicate(mock, ob, good)
		tx, _ := db.Begin()
		res, err := ob.Publish(ctx, sqltx.From(tx), good)
		if err != nil || !res.Duplicate {
			t.Fatalf("%+v %v", res, err)
		}
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("other arguments do not match", func(t *testing.T) {
		db, mock, _ := sqlmock.New()
		defer db.Close()
		mock.ExpectBegin()
		outboxtest.ExpectPublish(mock, ob, good)
		tx, _ := db.Begin()
		other := good
		other.Payload = []byte(`{"x":1}`)
		if _, err := ob.Publish(ctx, sqltx.From(tx), other); err == nil {
			t.Fatal("a different payload matched the expectation")
		}
	})
	t.Run("invalid message stays unmet", func(t *testing.T) {
		db, mock, _ := sqlmock.New()
		defer db.Close()
		mock.ExpectBegin()
		outboxtest.ExpectPublish(mock, ob, outbox.Message{})
		tx, _ := db.Begin()
		if _, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{}); err == nil {
			t.Fatal("invalid message published")
		}
		if err := mock.ExpectationsWereMet(); err == nil {
			t.Fatal("expectation for an invalid message reported as met")
		}
	})
	t.Run("NotifyInterval: notifying or silent, both match", func(t *testing.T) {
		ob, err := outbox.New(postgres.Dialect(), outbox.Config{NotifyInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		st, err := ob.PublishSQL(good)
		if err != nil {
			t.Fatal(err)
		}
		if quiet := publishsql.Of(st).QuietQuery; !strings.Contains(st.Query, "pg_notify('outbox', '2000')") || quiet == "" || strings.Contains(quiet, "pg_notify") {
			t.Fatalf("Query %q\nQuietQuery %q", st.Query, quiet)
		}
		db, mock, _ := sqlmock.New()
		defer db.Close()
		mock.ExpectBegin()
		for range 3 {
			outboxtest.ExpectPublish(mock, ob, good)
		}
		tx, _ := db.Begin()
		for i := range 3 { // the first notifies, the others are silent
			if _, err := ob.Publish(ctx, sqltx.From(tx), good); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestExpectPublishEqualCoalescing: under QueryMatcherEqual an expectation
// for a coalescing Outbox (the default on PostgreSQL) fails every time,
// with a message that says what to set, instead of failing by timing.
func TestExpectPublishEqualCoalescing(t *testing.T) {
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	db, mock := newMock(t, sqlmock.QueryMatcherEqual)
	mock.ExpectBegin()
	outboxtest.ExpectPublish(mock, ob, outbox.Message{Topic: "a"})
	tx, _ := db.Begin()
	_, err = ob.Publish(context.Background(), sqltx.From(tx), outbox.Message{Topic: "a"}) // the first publish notifies
	if err == nil || !strings.Contains(err.Error(), "outbox.NotifyEvery") {
		t.Fatalf("publish: %v, want the expectation's advice to set NotifyEvery", err)
	}
}

// matchers are sqlmock's two query matchers: ExpectPublish must work
// under both.
var matchers = []struct {
	name string
	opt  sqlmock.QueryMatcher
}{{"regexp", sqlmock.QueryMatcherRegexp}, {"equal", sqlmock.QueryMatcherEqual}}

func newMock(t *testing.T, m sqlmock.QueryMatcher) (*sql.DB, sqlmock.Sqlmock) {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, mock
}

type placed struct {
	OrderID string   `json:"order_id"`
	Total   float64  `json:"total"`
	Items   []string `json:"items"`
}

// TestExpectPublishIgnoresIdsAndBytes: under both query matchers, an
// expectation built from a Go value matches the publish of a payload with
// other bytes (member order, spacing, 2.50 against 2.5), any generated id,
// and a NotBefore computed from a later time.Now(); a different payload,
// key or NotBefore does not match.
func TestExpectPublishIgnoresIdsAndBytes(t *testing.T) {
	ctx := context.Background()
	sent := outbox.Message{
		Topic: "order.placed", Key: "A-1",
		Payload: []byte(`{ "items": ["x", "y"], "total": 2.50, "order_id": "A-1" }`),
		Headers: map[string]string{"trace": "t1", "type": "json"},
	}
	want := sent
	want.Payload = outboxtest.JSON(placed{OrderID: "A-1", Total: 2.5, Items: []string{"x", "y"}})
	want.Headers = map[string]string{"type": "json", "trace": "t1"}
	dedup := func(m outbox.Message) outbox.Message { m.DedupKey = "order.placed/A-1"; return m }
	at := func(m outbox.Message, t time.Time) outbox.Message { m.NotBefore = t; return m }
	other := func(f func(m *outbox.Message)) outbox.Message { m := sent; f(&m); return m }

	// The WAL transport sends a message without a DedupKey or NotBefore
	// as a logical decoding message, its envelope one bytea argument.
	wal, err := postgres.WALDialect(postgres.WALConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, mt := range matchers {
		for _, dc := range []struct {
			name string
			d    outbox.Dialect
			cfg  outbox.Config
		}{
			{"table", postgres.Dialect(), outbox.Config{Notify: outbox.NotifyAuto, NotifyInterval: outbox.NotifyEvery}},
			{"table", postgres.Dialect(), outbox.Config{Notify: outbox.NotifyOff}},
			// Ordered: one array per column, and with a DedupKey a second
			// statement that numbers the stored messages.
			{"table", postgres.Dialect(), outbox.Config{Notify: outbox.NotifyAuto, NotifyInterval: outbox.NotifyEvery, OrderByKey: true}},
			{"table", postgres.Dialect(), outbox.Config{Notify: outbox.NotifyOff, OrderByKey: true}},
			{"wal", wal, outbox.Config{Notify: outbox.NotifyAuto, NotifyInterval: outbox.NotifyEvery}},
			{"wal", wal, outbox.Config{Notify: outbox.NotifyOff, OrderByKey: true}},
		} {
			cfg := dc.cfg
			ob, err := outbox.New(dc.d, cfg)
			if err != nil {
				t.Fatal(err)
			}
			// The WAL transport refuses an ordered message that needs the
			// table (a DedupKey, a NotBefore): its key's order would not hold.
			tableOnly := dc.name == "wal" && cfg.OrderByKey
			if tableOnly {
				var me *outbox.MessageError
				if _, err := ob.PublishSQL(dedup(want)); !errors.As(err, &me) {
					t.Fatalf("WAL, ordered, DedupKey: %v, want a MessageError", err)
				}
			} else if st, err := ob.PublishSQL(dedup(want)); err != nil || (len(publishsql.Of(st).Sequence) != 0) != cfg.OrderByKey {
				t.Fatalf("OrderByKey %v: Sequence %q, %v", cfg.OrderByKey, publishsql.Of(st).Sequence, err)
			}
			expected := at(want, time.Now().Add(time.Hour))
			for _, tc := range []struct {
				name  string
				want  []outbox.Message
				sent  []outbox.Message
				match bool
			}{
				{"one", []outbox.Message{want}, []outbox.Message{sent}, true},
				{"dedup", []outbox.Message{dedup(want)}, []outbox.Message{dedup(sent)}, true},
				{"batch", []outbox.Message{want, dedup(want)}, []outbox.Message{sent, dedup(sent)}, true},
				{"NotBefore from the clock", []outbox.Message{expected}, []outbox.Message{at(sent, time.Now().Add(time.Hour))}, true},
				{"NotBefore a minute off", []outbox.Message{expected}, []outbox.Message{at(sent, time.Now().Add(time.Hour+time.Minute))}, false},
				{"other payload", []outbox.Message{want}, []outbox.Message{other(func(m *outbox.Message) { m.Payload = []byte(`{"order_id":"A-1","total":2.51,"items":["x","y"]}`) })}, false},
				{"other item order", []outbox.Message{want}, []outbox.Message{other(func(m *outbox.Message) { m.Payload = []byte(`{"order_id":"A-1","total":2.5,"items":["y","x"]}`) })}, false},
				{"other header", []outbox.Message{want}, []outbox.Message{other(func(m *outbox.Message) { m.Headers = map[string]string{"trace": "t2", "type": "json"} })}, false},
				{"other key", []outbox.Message{want}, []outbox.Message{other(func(m *outbox.Message) { m.Key = "A-2" })}, false},
				{"batch of two keys", []outbox.Message{want, other(func(m *outbox.Message) { m.Key = "B-1"; m.Payload = want.Payload }), dedup(want)},
					[]outbox.Message{sent, other(func(m *outbox.Message) { m.Key = "B-1" }), dedup(sent)}, true},
				{"batch, other order", []outbox.Message{want, other(func(m *outbox.Message) { m.Key = "B-1"; m.Payload = want.Payload })},
					[]outbox.Message{other(func(m *outbox.Message) { m.Key = "B-1" }), sent}, false},
			} {
				if tableOnly && slices.ContainsFunc(tc.want, func(m outbox.Message) bool { return m.DedupKey != "" || !m.NotBefore.IsZero() }) {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/notify%d/ordered=%v/%s", mt.name, dc.name, cfg.Notify, cfg.OrderByKey, tc.name), func(t *testing.T) {
					db, mock := newMock(t, mt.opt)
					mock.ExpectBegin()
					outboxtest.ExpectPublish(mock, ob, tc.want...)
					mock.ExpectCommit()
					tx, err := db.Begin()
					if err != nil {
						t.Fatal(err)
					}
					_, err = ob.PublishBatch(ctx, sqltx.From(tx), tc.sent)
					if !tc.match {
						if err == nil {
							t.Fatal("published message matched a different expectation")
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
					if err := mock.ExpectationsWereMet(); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
}

// TestExpectPublishError: under both query matchers, with and without a
// DedupKey, Publish returns an error wrapping the one the database gave,
// and Duplicate is reported under QueryMatcherEqual too.
func TestExpectPublishError(t *testing.T) {
	ctx := context.Background()
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{NotifyInterval: outbox.NotifyEvery})
	if err != nil {
		t.Fatal(err)
	}
	lost := errors.New("connection reset by peer")
	for _, mt := range matchers {
		for _, msg := range []outbox.Message{
			{Topic: "a", Payload: outboxtest.JSON(map[string]int{"n": 1})},
			{Topic: "a", Payload: outboxtest.JSON(map[string]int{"n": 1}), DedupKey: "a/1"},
		} {
			t.Run(mt.name+"/dedup="+msg.DedupKey, func(t *testing.T) {
				db, mock := newMock(t, mt.opt)
				mock.ExpectBegin()
				outboxtest.ExpectPublishError(mock, ob, lost, msg)
				mock.ExpectRollback()
				tx, _ := db.Begin()
				_, err := ob.Publish(ctx, sqltx.From(tx), msg)
				if !errors.Is(err, lost) {
					t.Fatalf("publish: %v, want an error wrapping %v", err, lost)
				}
				_ = tx.Rollback()
				if err := mock.ExpectationsWereMet(); err != nil {
					t.Fatal(err)
				}
			})
		}
		t.Run(mt.name+"/duplicate", func(t *testing.T) {
			msg := outbox.Message{Topic: "a", DedupKey: "a/1"}
			db, mock := newMock(t, mt.opt)
			mock.ExpectBegin()
			outboxtest.ExpectPublishDuplicate(mock, ob, msg)
			tx, _ := db.Begin()
			res, err := ob.Publish(ctx, sqltx.From(tx), msg)
			if err != nil || !res.Duplicate {
				t.Fatalf("%+v %v", res, err)
			}
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestAnyID(t *testing.T) {
	id := outbox.NewID().String()
	for _, tc := range []struct {
		v    driver.Value
		want bool
	}{
		{id, true}, {[]byte(id), true},
		{strings.ToUpper(id), false}, // not the one text form
		{outbox.ID{}.String(), false},
		{"order-1", false}, {"", false}, {int64(1), false}, {nil, false},
	} {
		if got := outboxtest.AnyID().Match(tc.v); got != tc.want {
			t.Errorf("AnyID().Match(%#v) = %v, want %v", tc.v, got, tc.want)
		}
	}
}

func TestJSONEq(t *testing.T) {
	for _, tc := range []struct {
		want any
		got  driver.Value
		eq   bool
	}{
		{map[string]any{"a": 1, "b": []int{1, 2}}, `{"b":[1,2],"a":1}`, true},
		{map[string]any{"a": 1}, []byte(" {\n\"a\" : 1.0 } "), true},
		{map[string]any{"a": 1}, `{"a":1e0}`, true},
		{[]byte(`{"n": 12345678901234567890}`), `{"n":12345678901234567890}`, true},
		{[]byte(`{"n": 12345678901234567890}`), `{"n":12345678901234567891}`, false}, // float64 would call these equal
		{map[string]any{"a": 1}, `{"a":1,"b":2}`, false},
		{map[string]any{"a": 1, "b": nil}, `{"a":1}`, false},
		{[]int{1, 2}, `[2,1]`, false},
		{"x", `"x"`, true}, // a string want is a Go value
		{map[string]any{"a": 1}, `{"a":1} {}`, false},
		{map[string]any{"a": 1}, `{"a":`, false},
		{map[string]any{"a": 1}, int64(1), false},
	} {
		if got := outboxtest.JSONEq(tc.want).Match(tc.got); got != tc.eq {
			t.Errorf("JSONEq(%v).Match(%v) = %v, want %v", tc.want, tc.got, got, tc.eq)
		}
	}
}

// TestExpectPublishSubscribers: the kit expects a topic's copies, one per
// subscriber, in the one statement.
func TestExpectPublishSubscribers(t *testing.T) {
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Notify: outbox.NotifyOff,
		Subscribers: map[string][]string{"order.placed": {"mail", "nats"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	msg := outbox.Message{Topic: "order.placed", Key: "o-1", DedupKey: "order.placed/o-1", Payload: []byte(`{}`)}
	for _, dup := range []bool{false, true} {
		db, mock, _ := sqlmock.New()
		mock.ExpectBegin()
		if dup {
			outboxtest.ExpectPublishDuplicate(mock, ob, msg)
		} else {
			outboxtest.ExpectPublish(mock, ob, msg)
		}
		tx, _ := db.Begin()
		res, err := ob.Publish(ctx, sqltx.From(tx), msg)
		if err != nil {
			t.Fatal(err)
		}
		if res.Duplicate != dup || len(res.Copies) != 2 || (res.Copies[0] == res.Copies[1]) == !dup {
			t.Fatalf("duplicate %v: result %+v", dup, res)
		}
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Fatal(err)
		}
		db.Close()
	}
	// Another key matches no copy.
	db, mock, _ := sqlmock.New()
	defer db.Close()
	mock.ExpectBegin()
	outboxtest.ExpectPublish(mock, ob, msg)
	tx, _ := db.Begin()
	other := msg
	other.Key = "o-2"
	if _, err := ob.Publish(ctx, sqltx.From(tx), other); err == nil {
		t.Fatal("another key matched the expected copies")
	}
}
