package natsfwd_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	natsfwd "github.com/oncommit/oncommit/forward/nats"
	"github.com/oncommit/oncommit/outbox"
)

// A relay that forwards every topic to JetStream, subject = topic. The
// stream's duplicate window (15 minutes) is longer than the relay's lease
// plus its retry cap (30 s + 10 m, the defaults), so a redelivery is
// always deduplicated; Check says so at start. (No Output: it needs a
// NATS server and a PostgreSQL.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(nats.DefaultURL, nats.MaxReconnects(-1))
	if err != nil {
		log.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: "ORDERS", Subjects: []string{"order.>"}, Duplicates: 15 * time.Minute,
	}); err != nil {
		log.Fatal(err)
	}

	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(pgxtx.FromPool(pool), outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	fw, err := natsfwd.New(js, natsfwd.Config{}) // Lease and RetryCap: the relay's defaults
	if err != nil {
		log.Fatal(err)
	}
	if err := fw.Check(ctx, "order.placed", "order.paid"); err != nil {
		log.Fatal(err) // a topic whose subject no stream stores
	}
	if err := relay.HandleBatch(outbox.AllTopics, fw.Handler()); err != nil {
		log.Fatal(err)
	}
	log.Fatal(relay.Run(ctx))
}
