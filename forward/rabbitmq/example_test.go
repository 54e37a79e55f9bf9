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

// The topology of a service's events: a topic exchange "events" the
// forwarder publishes to, a quorum queue "billing" bound to the topics
// "order.*", and a dead-letter exchange and queue where Consume's rejected
// messages go. Declaring it at every start is harmless; a queue that
// exists with other arguments is reported as a *TopologyConflictError.
func ExampleDeclareTopology() {
	ctx := context.Background()
	url := "amqp://guest:guest@localhost:5672/"
	err := rabbitmq.DeclareTopology(ctx, url, rabbitmq.Topology{
		Exchange:           "events",
		Queue:              "billing",
		BindingKeys:        []string{"order.*"},
		Quorum:             true,
		DeadLetterExchange: "billing.dlx",
		DeadLetterQueue:    "billing.dead",
	})
	if err != nil {
		log.Fatal(err)
	}
	fw, err := rabbitmq.New(url, rabbitmq.Config{Exchange: "events", Source: "/shop/orders", CloudEvents: true})
	if err != nil {
		log.Fatal(err)
	}
	defer fw.Close()
	// relay.HandleBatch(outbox.AllTopics, fw.Handler()); and a consumer:
	// rabbitmq.Consume(ctx, url, inbox, beginner, rabbitmq.ConsumeConfig{
	//	Name: "billing", Queue: "billing", DeadLetterReject: true}, apply)
}
