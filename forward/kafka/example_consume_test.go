package kafka_test

import (
	"context"
	"encoding/json"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/forward/kafka"
	"github.com/oncommit/oncommit/outbox"
)

// A consuming service: a group member applying each order record once to
// its invoices table, with the inbox, reading the envelope the forwarder
// set (the record key, oncommit-type, oncommit-created-at). A record that
// fails 5 attempts is produced to orders-dead. (No Output: it needs Kafka
// and a PostgreSQL.)
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
	client, err := kgo.NewClient(kgo.SeedBrokers("localhost:9092"),
		kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	header := func(r *kgo.Record, name string) string {
		for _, h := range r.Headers {
			if h.Key == name {
				return string(h.Value)
			}
		}
		return ""
	}
	err = kafka.Consume(ctx, client, ib, pgxtx.NewBeginner(pool, pgx.TxOptions{}), kafka.ConsumeConfig{
		Name: "billing", DeadLetterTopic: "orders-dead",
	}, func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		var o struct {
			Total float64 `json:"total"`
		}
		if err := json.Unmarshal(r.Value, &o); err != nil {
			return outbox.DeadLetter(err)
		}
		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id, total, event, ordered_at) VALUES ($1, $2, $3, $4)`,
			string(r.Key), o.Total, header(r, kafka.TypeHeader), header(r, kafka.CreatedAtHeader))
		return err
	})
	log.Fatal(err)
}
