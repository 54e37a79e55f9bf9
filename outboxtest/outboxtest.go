// Package outboxtest helps users test their own code that publishes messages,
// with github.com/DATA-DOG/go-sqlmock and no database.
//
// Publish sends exactly one statement on the caller's transaction and never
// begins, commits or rolls back, so a test scripts
//
//	mock.ExpectBegin()
//	mock.ExpectExec(`INSERT INTO orders`)...           // the caller's own SQL
//	outboxtest.ExpectPublish(mock, ob, msg)           // the outbox's one statement
//	mock.ExpectCommit()
//
// and mock.ExpectationsWereMet() proves the message was written inside the
// business transaction.
package outboxtest

import (
	"database/sql/driver"
	"regexp"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/outbox"
)

// ExpectPublish registers on mock the exact statement that ob.Publish (one
// message) or ob.PublishBatch (several) sends for msgs, with every argument
// but the generated ids, answering that every message was stored. Publish
// sends it with ExecContext (an ExpectExec) when no message has a DedupKey,
// and with QueryContext (an ExpectQuery, answering with the stored ids) when
// one has, since only then does it need the ids back. On MySQL, where the
// INSERT cannot return ids, a message with a DedupKey makes it an
// ExpectExec of the INSERT followed by an ExpectQuery of the statement that
// lists the stored ids (outbox.Statement.StoredQuery).
//
// The statement is matched literally under sqlmock's default QueryMatcher
// (sqlmock.QueryMatcherRegexp). With Config.NotifyInterval set, whether a
// publish notifies depends on timing, so the expectation accepts the
// statement with and without the NOTIFY (outbox.Statement.QuietQuery).
// If a message is invalid, the expectation answers with Publish's
// validation error instead; since Publish refuses such a message without
// sending SQL, the expectation then stays unmet and
// mock.ExpectationsWereMet reports it.
func ExpectPublish(mock sqlmock.Sqlmock, ob *outbox.Outbox, msgs ...outbox.Message) {
	expect(mock, ob, msgs, true)
}

// ExpectPublishDuplicate is ExpectPublish answering that every message was
// a duplicate (its DedupKey already stored): Publish reports Duplicate.
// Every message must have a DedupKey.
func ExpectPublishDuplicate(mock sqlmock.Sqlmock, ob *outbox.Outbox, msgs ...outbox.Message) {
	expect(mock, ob, msgs, false)
}

func expect(mock sqlmock.Sqlmock, ob *outbox.Outbox, msgs []outbox.Message, stored bool) {
	st, err := ob.PublishSQL(msgs...)
	if err != nil {
		mock.ExpectExec("^$").WillReturnError(err)
		return
	}
	ids := make(map[string]bool, len(st.IDs))
	rows := sqlmock.NewRows([]string{"id"})
	for _, id := range st.IDs {
		ids[id.String()] = true
		if stored {
			rows.AddRow(id.String())
		}
	}
	args := make([]driver.Value, len(st.Args))
	for i, a := range st.Args {
		if s, ok := a.(string); ok && ids[s] {
			args[i] = sqlmock.AnyArg()
		} else {
			args[i] = a
		}
	}
	dedup := false
	for _, m := range msgs {
		dedup = dedup || m.DedupKey != ""
	}
	query := literal(st.Query)
	if st.QuietQuery != "" {
		// Config.NotifyInterval: the publish notifies or not, by timing.
		query = "^(?:" + regexp.QuoteMeta(st.Query) + "|" + regexp.QuoteMeta(st.QuietQuery) + ")$"
	}
	if !dedup {
		mock.ExpectExec(query).WithArgs(args...).WillReturnResult(sqlmock.NewResult(0, int64(len(msgs))))
		return
	}
	if st.StoredQuery != "" {
		// MySQL: the INSERT, then the query for the ids it stored.
		mock.ExpectExec(literal(st.Query)).WithArgs(args...).WillReturnResult(sqlmock.NewResult(0, int64(len(msgs))))
		any := make([]driver.Value, len(st.StoredArgs))
		for i := range any {
			any[i] = sqlmock.AnyArg() // generated ids
		}
		mock.ExpectQuery(literal(st.StoredQuery)).WithArgs(any...).WillReturnRows(rows)
		return
	}
	mock.ExpectQuery(query).WithArgs(args...).WillReturnRows(rows)
}

// literal makes query match itself under sqlmock's default matcher,
// sqlmock.QueryMatcherRegexp.
func literal(query string) string {
	return "^" + regexp.QuoteMeta(query) + "$"
}
