package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
	_ "modernc.org/sqlite"
)

// openExampleDB opens an in-memory SQLite database with the outbox table.
func openExampleDB(ctx context.Context) *sql.DB {
	db, err := sql.Open("sqlite", "file::memory:")
	if err != nil {
		panic(err)
	}
	db.SetMaxOpenConns(1) // one connection: one in-memory database
	if err := sqlite.Migrate(ctx, db, ""); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY)`); err != nil {
		panic(err)
	}
	return db
}

// Publish a message inside the transaction that writes the business row:
// the commit stores both.
func Example_publish() {
	ctx := context.Background()
	db := openExampleDB(ctx)
	defer db.Close()
	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{})
	if err != nil {
		panic(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES ('A-1')`); err != nil {
		panic(err)
	}
	res, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{
		Topic:    "order.placed",
		Key:      "A-1",
		Payload:  []byte(`{"order_id":"A-1"}`),
		DedupKey: "order.placed/A-1",
	})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	var stored string
	if err := db.QueryRowContext(ctx, `SELECT id FROM outbox`).Scan(&stored); err != nil {
		panic(err)
	}
	fmt.Println("duplicate:", res.Duplicate)
	fmt.Println("stored id is the returned id:", stored == res.ID.String())
	// Output:
	// duplicate: false
	// stored id is the returned id: true
}

// A rolled-back transaction leaves no message, and a message that fails
// validation is refused before any SQL is sent.
func Example_rollback() {
	ctx := context.Background()
	db := openExampleDB(ctx)
	defer db.Close()
	ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{})

	tx, _ := db.BeginTx(ctx, nil)
	_, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.placed", Payload: []byte(`{"oops":`)})
	fmt.Println("invalid message:", errors.Is(err, outbox.ErrInvalidMessage))
	_, _ = ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.placed"})
	_ = tx.Rollback()

	var n int
	_ = db.QueryRowContext(ctx, `SELECT count(*) FROM outbox`).Scan(&n)
	fmt.Println("messages after rollback:", n)
	// Output:
	// invalid message: true
	// messages after rollback: 0
}

// PublishBatch stores many messages with one statement.
func Example_publishBatch() {
	ctx := context.Background()
	db := openExampleDB(ctx)
	defer db.Close()
	ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{})

	tx, _ := db.BeginTx(ctx, nil)
	res, err := ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{
		{Topic: "invoice.issued", DedupKey: "invoice/7"},
		{Topic: "invoice.issued", DedupKey: "invoice/7"}, // same key: stored once
		{Topic: "mail.send"},
	})
	if err != nil {
		panic(err)
	}
	_ = tx.Commit()
	for i, r := range res {
		fmt.Printf("message %d duplicate=%v\n", i, r.Duplicate)
	}
	// Output:
	// message 0 duplicate=false
	// message 1 duplicate=true
	// message 2 duplicate=false
}

// A relay delivers the messages: a handler per topic, Run until the context
// ends. Here on SQLite, with a handler that fails once and is retried.
func Example_relay() {
	ctx := context.Background()
	db := openExampleDB(ctx)
	defer db.Close()
	ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{})

	tx, _ := db.BeginTx(ctx, nil)
	_, _ = ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.placed", Payload: []byte(`{"order_id":"A-1"}`)})
	_ = tx.Commit()

	relay, err := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{
		RetryBase: time.Millisecond, RetryCap: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	delivered := make(chan struct{})
	type orderPlaced struct {
		OrderID string `json:"order_id"`
	}
	_ = outbox.HandleJSON(relay, "order.placed", func(ctx context.Context, d outbox.Delivery, o orderPlaced) error {
		if d.Attempt == 1 {
			fmt.Println("attempt 1 for", o.OrderID, "fails")
			return errors.New("mail server busy")
		}
		fmt.Println("attempt", d.Attempt, "for", o.OrderID, "succeeds")
		close(delivered)
		return nil
	})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	<-delivered
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	var left int
	_ = db.QueryRowContext(ctx, `SELECT count(*) FROM outbox`).Scan(&left)
	fmt.Println("messages left:", left)
	// Output:
	// attempt 1 for A-1 fails
	// attempt 2 for A-1 succeeds
	// messages left: 0
}

// Two subscribers of one topic: each gets its own copy of the message,
// retried on its own; the mailer's failure never repeats the audit.
func Example_subscribers() {
	ctx := context.Background()
	db := openExampleDB(ctx)
	defer db.Close()
	ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{
		Subscribers: map[string][]string{"order.placed": {"mail", "audit"}},
	})

	tx, _ := db.BeginTx(ctx, nil)
	res, _ := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.placed", Key: "A-1"})
	_ = tx.Commit()
	fmt.Println("copies:", len(res.Copies))

	relay, _ := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{
		RetryBase: time.Millisecond, RetryCap: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	var mu sync.Mutex
	got := map[string][]int{}
	var wg sync.WaitGroup
	wg.Add(2)
	record := func(fails int) outbox.Handler {
		return func(_ context.Context, d outbox.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			got[d.Subscriber] = append(got[d.Subscriber], d.Attempt)
			if d.Attempt <= fails {
				return errors.New("down")
			}
			wg.Done()
			return nil
		}
	}
	_ = relay.Subscribe("order.placed", "mail", record(2))
	_ = relay.Subscribe("order.placed", "audit", record(0))
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	wg.Wait()
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	fmt.Println("mail's attempts:", got["mail"])
	fmt.Println("audit's attempts:", got["audit"])
	// Output:
	// copies: 2
	// mail's attempts: [1 2 3]
	// audit's attempts: [1]
}

// A readiness probe in three lines: Health().Err() is nil while the relay
// runs and claims, and says why not otherwise (not running, shutting down,
// or claims failing in a row).
func Example_health() {
	ctx := context.Background()
	db := openExampleDB(ctx)
	defer db.Close()
	ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{})
	relay, _ := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	_ = relay.Handle("order.placed", func(context.Context, outbox.Delivery) error { return nil })

	ready := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if err := relay.Health().Err(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	probe := func() {
		rec := httptest.NewRecorder()
		ready.ServeHTTP(rec, httptest.NewRequest("GET", "/ready", nil))
		body := strings.TrimSpace(rec.Body.String())
		if body == "" {
			body = "ready"
		}
		fmt.Println(rec.Code, body)
	}
	probe()

	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	for relay.Health().LastClaim.IsZero() { // the first claim
		time.Sleep(time.Millisecond)
	}
	probe()
	stop()
	<-done
	probe()
	// Output:
	// 503 outbox: relay is not running
	// 200 ready
	// 503 outbox: relay is not running
}

// A relay's Stats point at topics nobody handles: here a message of a
// topic without a handler, and a handler whose topic has no messages.
func Example_relayStats() {
	ctx := context.Background()
	db := openExampleDB(ctx)
	defer db.Close()
	ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{})
	tx, _ := db.BeginTx(ctx, nil)
	_, _ = ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.shipped"})
	_ = tx.Commit()
	time.Sleep(5 * time.Millisecond) // due (0 s old) becomes overdue

	relay, _ := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{})
	_ = relay.Handle("order.shiped", func(context.Context, outbox.Delivery) error { return nil })
	st, err := relay.Stats(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("due, without a handler here:", st.Unhandled)
	fmt.Println("handled, without messages:", st.Idle)
	// Output:
	// due, without a handler here: [order.shipped]
	// handled, without messages: [order.shiped]
}

// A batch handler registered as the catch-all (outbox.AllTopics) gets the
// messages of every topic a claim took at once, and returns one outcome
// per message: here, as a forwarder to a broker would, it publishes the
// whole batch with one round trip and fails the message the "broker"
// refused, which is retried on its own.
func Example_handleBatch() {
	ctx := context.Background()
	db := openExampleDB(ctx)
	defer db.Close()
	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{})
	if err != nil {
		panic(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback()
	if _, err := ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{
		{Topic: "order.placed", Key: "A-1"},
		{Topic: "order.paid", Key: "A-1"},
		{Topic: "invoice.sent", Key: "B-7"},
	}); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	relay, err := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{
		RetryBase: time.Millisecond, RetryCap: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	delivered := make(chan struct{})
	calls := 0
	_ = relay.HandleBatch(outbox.AllTopics, func(ctx context.Context, ds []outbox.Delivery) []error {
		calls++
		errs := make([]error, len(ds))
		for i, d := range ds {
			if d.Topic == "invoice.sent" && d.Attempt == 1 {
				errs[i] = errors.New("broker refused it")
			}
			fmt.Printf("batch %d: %s %s attempt %d\n", calls, d.Topic, d.Key, d.Attempt)
		}
		if calls == 2 {
			close(delivered)
		}
		return errs
	})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	<-delivered
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	var left int
	_ = db.QueryRowContext(ctx, `SELECT count(*) FROM outbox`).Scan(&left)
	fmt.Println("messages left:", left)
	// Output:
	// batch 1: order.placed A-1 attempt 1
	// batch 1: order.paid A-1 attempt 1
	// batch 1: invoice.sent B-7 attempt 1
	// batch 2: invoice.sent B-7 attempt 2
	// messages left: 0
}

// Deliver an aggregate's messages in commit order, across topics, with
// Config.OrderByKey: the first delivery of order A-1 fails and is
// retried, and its later messages wait for it; order B-7 flows meanwhile.
func Example_orderByKey() {
	ctx := context.Background()
	db := openExampleDB(ctx)
	defer db.Close()
	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{OrderByKey: true})
	if err != nil {
		panic(err)
	}
	for _, m := range []outbox.Message{
		{Topic: "order.placed", Key: "A-1"}, {Topic: "order.placed", Key: "B-7"},
		{Topic: "order.paid", Key: "A-1"}, {Topic: "order.shipped", Key: "A-1"},
	} {
		tx, _ := db.BeginTx(ctx, nil)
		if _, err := ob.Publish(ctx, sqltx.From(tx), m); err != nil {
			panic(err)
		}
		_ = tx.Commit()
	}

	relay, err := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{
		Concurrency: 8, RetryBase: time.Millisecond, RetryCap: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex
	seen := map[string][]string{}
	failed := false
	h := func(ctx context.Context, d outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if d.Key == "A-1" && !failed {
			failed = true
			return errors.New("payment service down")
		}
		seen[d.Key] = append(seen[d.Key], d.Topic)
		return nil
	}
	for _, topic := range []string{"order.placed", "order.paid", "order.shipped"} {
		_ = relay.Handle(topic, h)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	for left := 1; left > 0; time.Sleep(10 * time.Millisecond) {
		_ = db.QueryRowContext(ctx, `SELECT count(*) FROM outbox`).Scan(&left)
	}
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	fmt.Println("A-1:", strings.Join(seen["A-1"], ", "))
	fmt.Println("B-7:", strings.Join(seen["B-7"], ", "))
	// Output:
	// A-1: order.placed, order.paid, order.shipped
	// B-7: order.placed
}
