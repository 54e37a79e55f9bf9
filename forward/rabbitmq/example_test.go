package rabbitmq_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/forward/rabbitmq"
	"github.com/oncommit/oncommit/outbox"
)

// A relay that forwards every topic to the exchange "events", routing key
// = topic. A message no queue is bound for is retried, and dead after
// MaxAttempts; consumers deduplicate on the message-id (docs/forwarding.md).
// (No Output: it needs a RabbitMQ and a PostgreSQL.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(pgxtx.FromPool(pool), outbox.RelayConfig{MaxAttempts: outbox.UnlimitedAttempts})
	if err != nil {
		log.Fatal(err)
	}
	fw, err := rabbitmq.New("amqp://guest:guest@localhost:5672/", rabbitmq.Config{Exchange: "events"})
	if err != nil {
		log.Fatal(err)
	}
	defer fw.Close() // after Run returned
	if err := relay.HandleBatch(outbox.AllTopics, fw.Handler()); err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil {
		log.Print(err)
	}
}
