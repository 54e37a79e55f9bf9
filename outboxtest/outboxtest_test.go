package outboxtest_test

import (
	"context"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxtest"
)

func TestExpectations(t *testing.T) {
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Notify: outbox.NotifyOff})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	good := outbox.Message{Topic: "a", DedupKey: "k", Payload: []byte(`{}`)}

	t.Run("duplicate", func(t *testing.T) {
		db, mock, _ := sqlmock.New()
		defer db.Close()
		mock.ExpectBegin()
		outboxtest.ExpectPublishDuplicate(mock, ob, good)
		tx, _ := db.Begin()
		res, err := ob.Publish(ctx, sqltx.From(tx), good)
		if err != nil || !res.Duplicate {
			t.Fatalf("%+v %v", res, err)
		}
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("other arguments do not match", func(t *testing.T) {
		db, mock, _ := sqlmock.New()
		defer db.Close()
		mock.ExpectBegin()
		outboxtest.ExpectPublish(mock, ob, good)
		tx, _ := db.Begin()
		other := good
		other.Payload = []byte(`{"x":1}`)
		if _, err := ob.Publish(ctx, sqltx.From(tx), other); err == nil {
			t.Fatal("a different payload matched the expectation")
		}
	})
	t.Run("invalid message stays unmet", func(t *testing.T) {
		db, mock, _ := sqlmock.New()
		defer db.Close()
		mock.ExpectBegin()
		outboxtest.ExpectPublish(mock, ob, outbox.Message{})
		tx, _ := db.Begin()
		if _, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{}); err == nil {
			t.Fatal("invalid message published")
		}
		if err := mock.ExpectationsWereMet(); err == nil {
			t.Fatal("expectation for an invalid message reported as met")
		}
	})
}
