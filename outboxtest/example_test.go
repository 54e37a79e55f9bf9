package outboxtest_test

import (
	"context"
	"fmt"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxtest"
)

// Test code that publishes, with sqlmock and no database: the script shows
// the message is written inside the caller's transaction, between its Begin
// and its Commit, with no other statement.
func ExampleExpectPublish() {
	db, mock, err := sqlmock.New()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
	if err != nil {
		panic(err)
	}
	msg := outbox.Message{Topic: "order.placed", Key: "A-1", Payload: []byte(`{"order_id":"A-1"}`)}

	mock.ExpectBegin()
	mock.ExpectExec(`INSERT INTO orders`).WithArgs("A-1").WillReturnResult(sqlmock.NewResult(0, 1))
	outboxtest.ExpectPublish(mock, ob, msg)
	mock.ExpectCommit()

	// The code under test.
	ctx := context.Background()
	tx, _ := db.BeginTx(ctx, nil)
	_, _ = tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES ($1)`, "A-1")
	res, err := ob.Publish(ctx, sqltx.From(tx), msg)
	if err != nil {
		panic(err)
	}
	_ = tx.Commit()

	fmt.Println("duplicate:", res.Duplicate)
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// duplicate: false
	// expectations met: true
}
