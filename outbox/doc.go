// Package outbox is the core of oncommit, a transactional outbox for Go.
//
// The guarantee: a message published with [Outbox.Publish] is stored by the
// caller's own transaction, so it exists if and only if that transaction
// commits. Publish runs exactly one statement on the transaction it is given
// and never begins, commits or rolls back; pools and bare connections are
// refused (see [Tx]). Delivery, by a relay, is at least once; every message
// carries a stable, time-ordered [ID] for idempotent handlers.
//
// Build an Outbox once, from a dialect value:
//
//	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
//
// then publish inside the transactions the service already owns:
//
//	tx, _ := db.BeginTx(ctx, nil)
//	tx.ExecContext(ctx, `INSERT INTO orders ...`)
//	res, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.placed", Payload: body})
//	tx.Commit()
//
// Bad input ([*MessageError]) is refused before any SQL is sent, so the
// transaction stays usable. A DedupKey already stored makes the result a
// duplicate, never an error. The sentinel errors say which condition a
// failure is (ErrTxDone, ErrTxAborted, ErrNotInTransaction, ...).
//
// Every replica may run a [Relay] ([Outbox.Relay]): it claims due messages
// with a lease (FOR UPDATE SKIP LOCKED on PostgreSQL and MySQL/MariaDB,
// SQLite's write lock on SQLite), runs the handler of
// each topic outside any transaction, renews the lease while the handler runs,
// and writes the outcome fenced by the attempt number: done, retry with
// backoff, or dead letter. [HandleJSON] decodes payloads into a Go type.
// [Outbox.Stats], [Outbox.Redrive] and [Outbox.Purge] are the operations.
//
// The package holds no SQL: dialect packages (dialect/postgres for
// PostgreSQL, dialect/sqlite for SQLite, dialect/mysql for MySQL 8.0.13+ and
// MariaDB 10.6+) supply it through the [Dialect] interface, and adapter
// packages (adapters/sqltx for database/sql, adapters/pgxtx for pgx v5) wrap
// the drivers' transactions. Only PostgreSQL has notifications; relays on
// the other dialects poll.
package outbox
