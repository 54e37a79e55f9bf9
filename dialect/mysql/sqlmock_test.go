package mysql_test

import (
	"context"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxtest"
)

// TestOutboxtestExpectsBothStatements: with sqlmock, outboxtest scripts the
// MySQL publish exactly: one Exec without a dedup key; the Exec and the
// query for the stored ids with one; a duplicate is reported as such.
func TestOutboxtestExpectsBothStatements(t *testing.T) {
	ob, err := outbox.New(mysql.Dialect(), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	plain := outbox.Message{Topic: "t"}
	dedup := outbox.Message{Topic: "t", DedupKey: "k"}
	mock.ExpectBegin()
	outboxtest.ExpectPublish(mock, ob, plain)
	outboxtest.ExpectPublish(mock, ob, dedup)
	outboxtest.ExpectPublishDuplicate(mock, ob, dedup)
	mock.ExpectCommit()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, m := range []outbox.Message{plain, dedup, dedup} {
		res, err := ob.Publish(ctx, sqltx.From(tx), m)
		if err != nil {
			t.Fatal(err)
		}
		if res.Duplicate != (i == 2) {
			t.Errorf("publish %d: duplicate %v", i, res.Duplicate)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}
