package natsfwd_test

import (
	"context"
	"encoding/json"
	"errors"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	natsfwd "github.com/oncommit/oncommit/forward/nats"
	"github.com/oncommit/oncommit/outbox"
)

// A consuming service: it applies each order.placed event once to its
// invoices table, with the inbox, reading the envelope the forwarder set
// (CloudEvents mode here: ce-type, ce-source, ce-time). A poison message
// goes to the subject dead.billing after 5 deliveries. (No Output: it needs
// a NATS server and a PostgreSQL.)
func ExampleConsume() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/billing")
	if err != nil {
		log.Fatal(err)
	}
	ib, err := outbox.NewInbox(postgres.Dialect(), outbox.InboxConfig{}) // postgres.MigrateInbox created "inbox"
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
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: "billing", FilterSubject: "order.placed", AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		log.Fatal(err)
	}
	err = natsfwd.Consume(ctx, cons, ib, pgxtx.NewBeginner(pool, pgx.TxOptions{}), natsfwd.ConsumeConfig{
		Name: "billing", DeadLetterSubject: "dead.billing", JetStream: js,
	}, func(ctx context.Context, tx pgx.Tx, m jetstream.Msg) error {
		h := m.Headers() // ce-* values are percent-encoded: url.PathUnescape them if they may hold spaces or non-ASCII
		if h.Get("ce-type") != "order.placed" {
			return outbox.DeadLetter(errors.New("not an order.placed event"))
		}
		var o struct {
			OrderID string  `json:"order_id"`
			Total   float64 `json:"total"`
		}
		if err := json.Unmarshal(m.Data(), &o); err != nil {
			return outbox.DeadLetter(err)
		}
		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id, total, source, ordered_at) VALUES ($1, $2, $3, $4)`,
			o.OrderID, o.Total, h.Get("ce-source"), h.Get("ce-time"))
		return err
	})
	log.Fatal(err)
}
