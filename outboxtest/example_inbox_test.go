package outboxtest_test

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxtest"
)

// Test a consumer that applies each message once, with sqlmock: the first
// delivery records the id and writes the ledger in one transaction; the
// redelivery finds the id recorded and writes nothing.
func ExampleExpectRecord() {
	db, mock, err := sqlmock.New()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ib, err := outbox.NewInbox(postgres.Dialect(), outbox.InboxConfig{})
	if err != nil {
		panic(err)
	}

	mock.ExpectBegin()
	outboxtest.ExpectRecord(mock, ib, "ledger", "m-1", true)
	mock.ExpectExec(`INSERT INTO ledger`).WithArgs("m-1", 10).WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectCommit()
	mock.ExpectBegin()
	outboxtest.ExpectRecord(mock, ib, "ledger", "m-1", false)
	mock.ExpectRollback()

	// The code under test: a consumer of "m-1", delivered twice.
	consume := func(ctx context.Context, id string, amount int) (bool, error) {
		return outbox.Receive(ctx, ib, sqltx.NewBeginner(db, nil), "ledger", id, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO ledger (message_id, amount) VALUES ($1, $2)`, id, amount)
			return err
		})
	}
	for range 2 {
		applied, err := consume(context.Background(), "m-1", 10)
		fmt.Println("applied:", applied, err)
	}
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// applied: true <nil>
	// applied: false <nil>
	// expectations met: true
}
