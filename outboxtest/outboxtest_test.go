package outboxtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

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
	t.Run("NotifyInterval: notifying or silent, both match", func(t *testing.T) {
		ob, err := outbox.New(postgres.Dialect(), outbox.Config{NotifyInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		st, err := ob.PublishSQL(good)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(st.Query, "pg_notify('outbox', '3600000000')") || st.QuietQuery == "" || strings.Contains(st.QuietQuery, "pg_notify") {
			t.Fatalf("Query %q\nQuietQuery %q", st.Query, st.QuietQuery)
		}
		db, mock, _ := sqlmock.New()
		defer db.Close()
		mock.ExpectBegin()
		for range 3 {
			outboxtest.ExpectPublish(mock, ob, good)
		}
		tx, _ := db.Begin()
		for i := range 3 { // the first notifies, the others are silent
			if _, err := ob.Publish(ctx, sqltx.From(tx), good); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Fatal(err)
		}
	})
}
