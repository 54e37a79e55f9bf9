package dialecttest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxtest"
)

// orderPlaced is the payload the kits test publishes and decodes.
type orderPlaced struct {
	OrderID string `json:"order_id"`
	Total   int    `json:"total"`
}

func (o orderPlaced) Validate() error {
	if o.OrderID == "" {
		return errors.New("no order_id")
	}
	return nil
}

// RunOutboxtest proves the real-database kit of package outboxtest on h:
// Drain runs the service's handlers until nothing of their topics is due
// and reports each attempt with its outcome (delivered, retried,
// dead-lettered, a retry without delay attempted again), leaving alone
// what is not due, what has no handler and what was rolled back; Published
// returns what committed transactions published, in publish order.
func RunOutboxtest(t *testing.T, h Harness) {
	t.Run("Drain", func(t *testing.T) {
		if h.Parallel {
			t.Parallel()
		}
		drain(t, newEnv(t, h))
	})
	t.Run("Published", func(t *testing.T) {
		if h.Parallel {
			t.Parallel()
		}
		published(t, newEnv(t, h))
	})
	runDrainKinds(t, h)
}

func drain(t *testing.T, e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	order := func(id string) []byte { return outboxtest.JSON(orderPlaced{OrderID: id, Total: 3}) }
	e.publish(t,
		outbox.Message{Topic: "order.placed", Key: "A-1", Payload: order("A-1")},
		outbox.Message{Topic: "order.placed", Key: "A-2", Payload: order("A-2"), Headers: map[string]string{"trace": "t2"}},
		outbox.Message{Topic: "order.placed", Key: "bad", Payload: []byte(`{"total": 3}`)}, // fails Validate
		outbox.Message{Topic: "mail.send", Key: "flaky"},
		outbox.Message{Topic: "mail.send", Key: "again"},
		outbox.Message{Topic: "order.placed", Key: "later", Payload: order("later"), Delay: time.Hour},
		outbox.Message{Topic: "unhandled", Key: "other"},
	)
	rolledBack := e.Begin(t)
	if _, err := e.ob.Publish(ctx, rolledBack.Tx, outbox.Message{Topic: "order.placed", Key: "rolled-back", Payload: order("rb")}); err != nil {
		t.Fatal(err)
	}
	if err := rolledBack.Rollback(); err != nil {
		t.Fatal(err)
	}

	var againCalls atomic.Int32
	register := func(r *outbox.Relay) error { // as the service registers its handlers
		if err := outbox.HandleJSON(r, "order.placed", func(ctx context.Context, d outbox.Delivery, o orderPlaced) error {
			return nil
		}); err != nil {
			return err
		}
		return r.Handle("mail.send", func(ctx context.Context, d outbox.Delivery) error {
			switch d.Key {
			case "flaky":
				return errors.New("smtp: 451 try later")
			case "again":
				if againCalls.Add(1) == 1 {
					return outbox.RetryAfter(0, errors.New("busy"))
				}
			}
			return nil
		})
	}
	start := time.Now()
	cfg := &outbox.RelayConfig{
		RetryBase: time.Minute, RetryCap: time.Minute, RetryJitter: new(0.0), // flaky is not due again soon
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	attempts, err := outboxtest.Drain(ctx, e.ob, e.DB, cfg, register)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("drained in %v", time.Since(start))
	var got []string
	for _, a := range attempts {
		got = append(got, fmt.Sprintf("%s/%s#%d %s %s", a.Topic, a.Key, a.Attempt, a.Outcome, a.Error))
	}
	want := []string{
		"order.placed/A-1#1 delivered ",
		"order.placed/A-2#1 delivered ",
		"order.placed/bad#1 dead-lettered dead-lettered: invalid payload: no order_id",
		"mail.send/flaky#1 retried smtp: 451 try later",
		"mail.send/again#1 retried retry requested: busy",
		"mail.send/again#2 delivered ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("attempts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !outboxtest.JSONEq(orderPlaced{OrderID: "A-1", Total: 3}).Match(attempts[0].Payload) {
		t.Errorf("payload %s", attempts[0].Payload)
	}
	if attempts[1].Headers["trace"] != "t2" || attempts[0].ID.IsZero() || attempts[0].CreatedAt.IsZero() {
		t.Errorf("delivery %+v", attempts[1].Delivery)
	}
	// Left in the table: the delayed message, the retried one, the dead
	// letter and the unhandled one.
	for _, c := range []struct {
		where string
		n     int
	}{
		{"state = 'pending' AND message_key IN ('later', 'flaky', 'other')", 3},
		{"state = 'dead' AND message_key = 'bad'", 1},
		{"", 4},
	} {
		if n := e.count(t, c.where); n != c.n {
			t.Errorf("%d rows where %q, want %d", n, c.where, c.n)
		}
	}

	// Nothing due: Drain returns at once, with nothing.
	attempts, err = outboxtest.Drain(ctx, e.ob, e.DB, cfg, register)
	if err != nil || len(attempts) != 0 {
		t.Fatalf("second drain: %v %+v", err, attempts)
	}
	// No handlers: the relay's error.
	if _, err := outboxtest.Drain(ctx, e.ob, e.DB, nil, nil); !errors.Is(err, outbox.ErrNoHandlers) {
		t.Fatalf("no handlers: %v", err)
	}
}

func published(t *testing.T, e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The code under test, on a real database.
	tx := e.Begin(t)
	for _, id := range []string{"B-1", "B-2", "B-3"} {
		if _, err := e.ob.Publish(ctx, tx.Tx, outbox.Message{Topic: "order.placed", Key: id, Payload: outboxtest.JSON(orderPlaced{OrderID: id, Total: 1})}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.ob.Publish(ctx, tx.Tx, outbox.Message{Topic: "audit", Key: "x"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	got, err := outboxtest.Published(ctx, e.ob, e.DB, "order.placed")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("published %d messages, want 3: %+v", len(got), got)
	}
	for i, id := range []string{"B-1", "B-2", "B-3"} {
		if got[i].Key != id || !outboxtest.JSONEq(orderPlaced{OrderID: id, Total: 1}).Match(got[i].Payload) {
			t.Errorf("message %d: %s %s, want %s", i, got[i].Key, got[i].Payload, id)
		}
	}
	if n := e.count(t, ""); n != 1 {
		t.Errorf("%d rows left, want the audit one", n)
	}
	if got, err := outboxtest.Published(ctx, e.ob, e.DB, "order.placed"); err != nil || len(got) != 0 {
		t.Fatalf("published again: %+v %v", got, err)
	}
}

// RunSqlmockKit proves package outboxtest's sqlmock expectations on
// dialect d, without a database, under both of sqlmock's query matchers:
// a plain and a deduplicated publish (two statements on MySQL), a
// duplicate, a statement failing in the database, and a NotBefore from
// the clock in the dialect's own argument form.
func RunSqlmockKit(t *testing.T, d outbox.Dialect) {
	// NotifyEvery: under QueryMatcherEqual an expectation cannot accept a
	// coalescing Outbox's publish with and without NOTIFY (see ExpectPublish).
	ob, err := outbox.New(d, outbox.Config{NotifyInterval: outbox.NotifyEvery})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lost := errors.New("connection reset by peer")
	msg := func(dedup string, at time.Time) outbox.Message {
		return outbox.Message{Topic: "order.placed", Key: "A-1", DedupKey: dedup, NotBefore: at,
			Payload: []byte(`{"total": 3, "order_id": "A-1"}`)}
	}
	expected := func(dedup string, at time.Time) outbox.Message {
		m := msg(dedup, at)
		m.Payload = outboxtest.JSON(orderPlaced{OrderID: "A-1", Total: 3})
		return m
	}
	for _, qm := range []struct {
		name string
		m    sqlmock.QueryMatcher
	}{{"regexp", sqlmock.QueryMatcherRegexp}, {"equal", sqlmock.QueryMatcherEqual}} {
		for _, dedup := range []string{"", "order.placed/A-1"} {
			t.Run(fmt.Sprintf("%s/dedup=%t", qm.name, dedup != ""), func(t *testing.T) {
				db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(qm.m))
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				later := time.Now().Add(time.Hour)
				mock.ExpectBegin()
				outboxtest.ExpectPublish(mock, ob, expected(dedup, time.Time{}))
				outboxtest.ExpectPublish(mock, ob, expected(dedup, later))
				if dedup != "" {
					outboxtest.ExpectPublishDuplicate(mock, ob, expected(dedup, time.Time{}))
				}
				outboxtest.ExpectPublishError(mock, ob, lost, expected(dedup, time.Time{}))
				mock.ExpectRollback()

				tx, err := db.Begin()
				if err != nil {
					t.Fatal(err)
				}
				for i, at := range []time.Time{{}, time.Now().Add(time.Hour)} {
					if res, err := ob.Publish(ctx, sqltx.From(tx), msg(dedup, at)); err != nil || res.Duplicate {
						t.Fatalf("publish %d: %+v %v", i, res, err)
					}
				}
				if dedup != "" {
					if res, err := ob.Publish(ctx, sqltx.From(tx), msg(dedup, time.Time{})); err != nil || !res.Duplicate {
						t.Fatalf("duplicate: %+v %v", res, err)
					}
				}
				if _, err := ob.Publish(ctx, sqltx.From(tx), msg(dedup, time.Time{})); !errors.Is(err, lost) {
					t.Fatalf("failing publish: %v", err)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
				if err := mock.ExpectationsWereMet(); err != nil {
					t.Fatal(err)
				}
			})
		}
		t.Run(qm.name+"/inbox", func(t *testing.T) { sqlmockInbox(t, d, qm.m) })
	}
}

// sqlmockInbox: the inbox's expectations match Record's statement: new,
// repeat, a database error (classified, still the driver's error), and
// refused input that sends nothing.
func sqlmockInbox(t *testing.T, d outbox.Dialect, m sqlmock.QueryMatcher) {
	ib, err := outbox.NewInbox(d, outbox.InboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(m))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	lost := errors.New("connection reset by peer")
	mock.ExpectBegin()
	outboxtest.ExpectRecord(mock, ib, "billing", "m-1", true)
	outboxtest.ExpectRecord(mock, ib, "billing", "m-1", false)
	outboxtest.ExpectRecord(mock, ib, "", "m-1", true) // refused: nothing
	outboxtest.ExpectRecordError(mock, ib, "billing", "m-2", lost)
	mock.ExpectRollback()
	ctx := context.Background()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		if fresh, err := ib.Record(ctx, sqltx.From(tx), "billing", "m-1"); err != nil || fresh != want {
			t.Fatalf("record %d: %v %v, want %v", i, fresh, err, want)
		}
	}
	if _, err := ib.Record(ctx, sqltx.From(tx), "", "m-1"); !errors.Is(err, outbox.ErrInvalidRecord) {
		t.Fatalf("empty consumer: %v", err)
	}
	if _, err := ib.Record(ctx, sqltx.From(tx), "billing", "m-2"); !errors.Is(err, lost) {
		t.Fatalf("failing record: %v", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}
