// Package outbox is the core of oncommit, a transactional outbox for Go.
//
// A message published with [Outbox.Publish] is stored by the caller's own
// transaction, so it exists if and only if that transaction commits;
// Publish never begins, commits or rolls back, and refuses pools and bare
// connections (see [Tx]). Delivery, by a [Relay], is at least once; every
// message carries a stable [ID] for idempotent handlers.
//
//	ob, err := outbox.New(postgres.Dialect(), outbox.Config{}) // once
//
//	tx, _ := db.BeginTx(ctx, nil)
//	tx.ExecContext(ctx, `INSERT INTO orders ...`)
//	res, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.placed", Payload: body})
//	tx.Commit()
//
// Every replica may run a Relay ([Outbox.Relay]): it claims due messages
// with a lease, runs each topic's handler outside any transaction, and
// writes the outcome fenced by the attempt number: done, retry with
// backoff, or dead letter.
//
// Dialect packages (dialect/postgres, dialect/sqlite, dialect/mysql for
// MySQL 8.0.13+ and MariaDB 10.6+) supply the SQL, and adapter packages
// (adapters/sqltx for database/sql, adapters/pgxtx for pgx v5) wrap the
// drivers' transactions.
package outbox
