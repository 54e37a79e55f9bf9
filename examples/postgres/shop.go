package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
)

// Order is a row of the orders table and the payload of the order.placed
// message.
type Order struct {
	ID    string `json:"id"`
	Email string `json:"email"`
}

// ErrDuplicateOrder is returned by PlaceOrder for an order placed before (a
// retried request): nothing is written again.
var ErrDuplicateOrder = errors.New("order already placed")

// Migrate creates the service's tables: the outbox (the library's
// migrations, safe when replicas start together) and orders.
func Migrate(ctx context.Context, db *sql.DB) error {
	if err := postgres.Migrate(ctx, db, "outbox"); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, email text NOT NULL)`)
	return err
}

// PlaceOrder stores the order and publishes order.placed in ONE
// transaction: the message exists if and only if the order committed. The
// message's DedupKey makes a retried request a duplicate, reported as
// ErrDuplicateOrder.
func PlaceOrder(ctx context.Context, db *sql.DB, ob *outbox.Outbox, o Order) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, email) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, o.ID, o.Email); err != nil {
		return fmt.Errorf("store order %s: %w", o.ID, err)
	}
	body, err := json.Marshal(o)
	if err != nil {
		return err
	}
	res, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{
		Topic: "order.placed", Key: o.ID, Payload: body, DedupKey: "order.placed/" + o.ID,
	})
	if err != nil {
		return fmt.Errorf("publish order %s: %w", o.ID, err)
	}
	if res.Duplicate {
		return ErrDuplicateOrder
	}
	return tx.Commit()
}

// Mailer sends order confirmations. key is the message's id, the same on
// every attempt: the mail provider's idempotency key, so a delivery run
// twice (at least once) sends one mail.
type Mailer interface {
	SendConfirmation(ctx context.Context, to, orderID, key string) error
}

// RegisterHandlers returns the function that adds the service's handlers
// to a relay: the service calls it at start-up, tests pass it to
// outboxtest.Drain.
func RegisterHandlers(m Mailer) func(r *outbox.Relay) error {
	return func(r *outbox.Relay) error {
		return outbox.HandleJSON(r, "order.placed", func(ctx context.Context, d outbox.Delivery, o Order) error {
			return m.SendConfirmation(ctx, o.Email, o.ID, d.ID.String())
		})
	}
}
