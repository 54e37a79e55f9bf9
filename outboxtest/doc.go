// Package outboxtest helps users test their own code that publishes and
// handles messages: sqlmock expectations for Publish that ignore the
// generated ids and compare payloads as JSON, and, on a real database of any
// dialect, [Drain], which runs a relay until nothing is due and reports what
// happened to each message.
//
// # Without a database: sqlmock
//
// Publish sends exactly one statement on the caller's transaction (two on
// MySQL for a message with a DedupKey) and never begins, commits or rolls
// back, so a test of business code scripts
//
//	mock.ExpectBegin()
//	mock.ExpectExec(`INSERT INTO orders`)...       // the caller's own SQL
//	outboxtest.ExpectPublish(mock, ob, outbox.Message{
//		Topic:   "order.placed",
//		Key:     "A-1",
//		Payload: outboxtest.JSON(OrderPlaced{ID: "A-1"}), // compared as JSON
//	})
//	mock.ExpectCommit()
//
// and mock.ExpectationsWereMet() proves the message was written inside the
// business transaction. The expectation matches any generated id
// ([AnyID]), a payload and headers equal as JSON ([JSONEq]), and a
// NotBefore within [NotBeforeTolerance], so the code under test needs no
// injected id generator or clock and the test no payload bytes.
// [ExpectPublishDuplicate] answers that the DedupKey was taken and
// [ExpectPublishError] that the statement failed in the database. Both of
// sqlmock's query matchers work: sqlmock.QueryMatcherRegexp (the default)
// and sqlmock.QueryMatcherEqual.
//
// # With a database: Drain
//
// [Drain] builds a relay on a real database (PostgreSQL, SQLite, MySQL),
// registers the service's own handlers on it, and runs it until no message
// of their topics is due and none is being handled. It returns every
// attempt with its outcome (delivered, retried, dead-lettered), for
// integration tests of handlers. [Published] drains the due messages of
// some topics, accepting each, and returns them: it asserts what committed
// transactions published.
package outboxtest
