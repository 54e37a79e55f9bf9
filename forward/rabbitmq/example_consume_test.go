package rabbitmq_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log"

	_ "github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/forward/rabbitmq"
	"github.com/oncommit/oncommit/outbox"
)

// A consuming service on database/sql: it applies each order.placed
// message once to its invoices table, with the inbox, reading the envelope
// the forwarder set (type, app-id, timestamp). A message that fails 5
// times is rejected to the queue's dead-letter exchange, which
// DeclareTopology declared. (No Output: it needs RabbitMQ and a
// PostgreSQL.)
func ExampleConsume() {
	ctx := context.Background()
	const url = "amqp://guest:guest@localhost:5672/"
	db, err := sql.Open("pgx", "postgres://localhost/billing")
	if err != nil {
		log.Fatal(err)
	}
	if err := postgres.MigrateInbox(ctx, db, ""); err != nil {
		log.Fatal(err)
	}
	if err := rabbitmq.DeclareTopology(ctx, url, rabbitmq.Topology{
		Exchange: "events", Queue: "billing", BindingKeys: []string{"order.placed"},
		DeadLetterExchange: "billing.dlx", DeadLetterQueue: "billing.dead",
	}); err != nil {
		log.Fatal(err)
	}
	ib, err := outbox.NewInbox(postgres.Dialect(), outbox.InboxConfig{})
	if err != nil {
		log.Fatal(err)
	}
	err = rabbitmq.Consume(ctx, url, ib, sqltx.NewBeginner(db, nil), rabbitmq.ConsumeConfig{
		Name: "billing", Queue: "billing", DeadLetterReject: true,
	}, func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error {
		var o struct {
			OrderID string  `json:"order_id"`
			Total   float64 `json:"total"`
		}
		if err := json.Unmarshal(d.Body, &o); err != nil {
			return outbox.DeadLetter(err)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO invoices (order_id, total, event, source, ordered_at) VALUES ($1, $2, $3, $4, $5)`,
			o.OrderID, o.Total, d.Type, d.AppId, d.Timestamp)
		return err
	})
	log.Fatal(err)
}
