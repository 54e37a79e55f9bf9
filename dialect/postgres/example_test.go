package postgres_test

import (
	"fmt"

	"github.com/oncommit/oncommit/dialect/postgres"
)

// The optional topic claim index for a table in a schema: run the
// statement on its own (db.ExecContext), not inside a transaction.
func ExampleTopicIndexSQL() {
	q, err := postgres.TopicIndexSQL("billing.outbox")
	if err != nil {
		panic(err)
	}
	fmt.Println(q)
	_, err = postgres.TopicIndexSQL("billing.outbox; DROP TABLE x")
	fmt.Println(err != nil)
	// Output:
	// CREATE INDEX CONCURRENTLY IF NOT EXISTS "outbox_topic_claim_idx" ON "billing"."outbox" (topic, available_at, id) WHERE state IN ('pending', 'processing')
	// true
}
