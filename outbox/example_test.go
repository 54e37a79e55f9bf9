package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
)

// placeOrder is business code: it writes the order and publishes its event
// in one transaction.
func placeOrder(ctx context.Context, db *sql.DB, ob *outbox.Outbox, id, email string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, email) VALUES ($1, $2)`, id, email); err != nil {
		return err
	}
	body, _ := json.Marshal(map[string]string{"order_id": id, "email": email})
	if _, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.placed", Key: id, Payload: body}); err != nil {
		return err
	}
	return tx.Commit()
}

// Publish a message inside the transaction that writes the business row:
// the commit stores both. Here the database is sqlmock, so the example runs
// without a server; the dialect packages' examples (dialect/sqlite) run the
// same against a real SQLite database, and the outboxtest package has
// helpers for such tests.
func ExampleOutbox_Publish() {
	db, mock, err := sqlmock.New()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Notify: outbox.NotifyOff})
	if err != nil {
		panic(err)
	}
	mock.ExpectBegin()
	mock.ExpectExec(`INSERT INTO orders`).WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec(`INSERT INTO "outbox"`).WillReturnResult(sqlmock.NewResult(0, 1)) // Publish: one statement
	mock.ExpectCommit()

	err = placeOrder(context.Background(), db, ob, "A-1", "someone@example.com")
	fmt.Println("placed:", err == nil)
	fmt.Println("every statement as expected:", mock.ExpectationsWereMet() == nil)
	// Output:
	// placed: true
	// every statement as expected: true
}

// On PostgreSQL a relay takes a pgx pool (or sqltx.FromDB(db)) and wakes on
// NOTIFY. This example needs a server, so it is compiled but not run.
func ExampleOutbox_Relay_postgres() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://127.0.0.1:5432/app")
	if err != nil {
		panic(err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
	if err != nil {
		panic(err)
	}
	relay, err := ob.Relay(pgxtx.FromPool(pool), outbox.RelayConfig{})
	if err != nil {
		panic(err)
	}
	type orderPlaced struct {
		OrderID string `json:"order_id"`
		Email   string `json:"email"`
	}
	err = outbox.HandleJSON(relay, "order.placed", func(ctx context.Context, d outbox.Delivery, e orderPlaced) error {
		// Send the e-mail with d.ID as the idempotency key: a crash after
		// sending and before the outcome is written sends it again.
		fmt.Println("send confirmation for", e.OrderID, "key", d.ID)
		return nil
	})
	if err != nil {
		panic(err)
	}
	if err := relay.Run(ctx); err != nil { // until ctx ends, then drains
		panic(err)
	}
}

// A readiness probe in three lines: Health().Err() is nil while the relay
// runs and claims, and says why not otherwise (not running, shutting down,
// or claims failing in a row). The dialect/sqlite examples run it.
func ExampleRelay_Health() {
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:5432/app")
	if err != nil {
		panic(err)
	}
	ob, _ := outbox.New(postgres.Dialect(), outbox.Config{})
	relay, _ := ob.Relay(pgxtx.FromPool(pool), outbox.RelayConfig{})

	http.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if err := relay.Health().Err(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
}

// An Outbox with OrderByKey delivers the messages of one key in the order
// their transactions committed, one at a time, across topics. Its relays
// say what a dead message does to its key.
func ExampleConfig_orderByKey() {
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{OrderByKey: true})
	if err != nil {
		panic(err)
	}
	// The statement Publish sends for two events of one order: it takes
	// the order's row in outbox_keys, numbers the messages, and stores the
	// first as the key's head (pending) and the second blocked behind it.
	st, err := ob.PublishSQL(
		outbox.Message{Topic: "order.placed", Key: "order-42"},
		outbox.Message{Topic: "order.paid", Key: "order-42"},
	)
	if err != nil {
		panic(err)
	}
	fmt.Println(strings.Contains(st.Query, `INSERT INTO "outbox_keys"`), len(st.IDs))

	// Relays of this Outbox: a dead order.paid halts its order until it is
	// redriven or skipped (ob.SkipHead); a dead mail.send lets the order go on.
	cfg := outbox.RelayConfig{
		DeadKeys:        outbox.HaltKey,
		DeadKeysByTopic: map[string]outbox.DeadKeyPolicy{"mail.send": outbox.ContinueKey},
	}
	_ = cfg // ob.Relay(pgxtx.FromPool(pool), cfg)
	// Output: true 2
}
