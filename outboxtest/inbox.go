package outboxtest

import (
	"regexp"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/outbox"
)

// ExpectRecord registers on mock the statement ib.Record sends for
// (consumer, id), answering that the id is new (fresh true: one row
// changed) or a repeat (none). Record sends it with ExecContext on the
// caller's transaction, so register it between the test's ExpectBegin
// and ExpectCommit or ExpectRollback. A consumer or id that Record
// refuses sends nothing: ExpectRecord then registers nothing either.
func ExpectRecord(mock sqlmock.Sqlmock, ib *outbox.Inbox, consumer, id string, fresh bool) {
	var n int64
	if fresh {
		n = 1
	}
	if e := expectRecord(mock, ib, consumer, id); e != nil {
		e.WillReturnResult(sqlmock.NewResult(0, n))
	}
}

// ExpectRecordError is [ExpectRecord] answering with err, as the database
// would (a lost connection, a lock timeout): Record returns it, classified.
func ExpectRecordError(mock sqlmock.Sqlmock, ib *outbox.Inbox, consumer, id string, err error) {
	if e := expectRecord(mock, ib, consumer, id); e != nil {
		e.WillReturnError(err)
	}
}

func expectRecord(mock sqlmock.Sqlmock, ib *outbox.Inbox, consumer, id string) *sqlmock.ExpectedExec {
	if !outbox.ValidRecord(consumer, id) {
		return nil
	}
	q := ib.RecordSQL()
	if !matchesEqual(mock) {
		q = "^" + regexp.QuoteMeta(q) + "$"
	}
	return mock.ExpectExec(q).WithArgs(consumer, id)
}
