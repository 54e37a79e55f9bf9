package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxtest"
)

// TestPlaceOrderSQLMock tests PlaceOrder without a database: the script
// is the transaction, the business INSERT and the message in it, as
// PlaceOrder sends them.
func TestPlaceOrderSQLMock(t *testing.T) {
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	order := Order{ID: "A-1", Email: "ann@example.com"}
	placed := outbox.Message{
		Topic: "order.placed", Key: "A-1", DedupKey: "order.placed/A-1",
		Payload: outboxtest.JSON(order), // compared as JSON; the message id is any
	}
	down := errors.New("connection reset by peer")
	insert := func(mock sqlmock.Sqlmock) *sqlmock.ExpectedExec {
		return mock.ExpectExec(`INSERT INTO orders`).WithArgs("A-1", "ann@example.com")
	}
	for _, tc := range []struct {
		name   string
		script func(mock sqlmock.Sqlmock)
		want   error
	}{
		{"placed", func(mock sqlmock.Sqlmock) {
			insert(mock).WillReturnResult(sqlmock.NewResult(0, 1))
			outboxtest.ExpectPublish(mock, ob, placed)
			mock.ExpectCommit()
		}, nil},
		{"placed before", func(mock sqlmock.Sqlmock) {
			insert(mock).WillReturnResult(sqlmock.NewResult(0, 0))
			outboxtest.ExpectPublishDuplicate(mock, ob, placed)
			mock.ExpectRollback()
		}, ErrDuplicateOrder},
		{"order not stored", func(mock sqlmock.Sqlmock) {
			insert(mock).WillReturnError(down)
			mock.ExpectRollback()
		}, down},
		{"message not stored", func(mock sqlmock.Sqlmock) {
			insert(mock).WillReturnResult(sqlmock.NewResult(0, 1))
			outboxtest.ExpectPublishError(mock, ob, down, placed)
			mock.ExpectRollback()
		}, down},
		{"commit fails", func(mock sqlmock.Sqlmock) {
			insert(mock).WillReturnResult(sqlmock.NewResult(0, 1))
			outboxtest.ExpectPublish(mock, ob, placed)
			mock.ExpectCommit().WillReturnError(down)
		}, down},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, mock, err := sqlmock.New()
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			mock.ExpectBegin()
			tc.script(mock)
			if err := PlaceOrder(t.Context(), db, ob, order); !errors.Is(err, tc.want) {
				t.Errorf("PlaceOrder: %v, want %v", err, tc.want)
			}
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestPlaceOrderPostgres runs PlaceOrder and the handlers on PostgreSQL:
// a committed order published its message, a failed one published
// nothing, a retried request is a duplicate, and the relay sends the
// confirmation keyed by the message id.
func TestPlaceOrderPostgres(t *testing.T) {
	db := testDB(t)
	ctx := t.Context()
	if err := Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := PlaceOrder(ctx, db, ob, Order{ID: "A-1", Email: "ann@example.com"}); err != nil {
		t.Fatal(err)
	}
	if err := PlaceOrder(ctx, db, ob, Order{ID: "A-1", Email: "ann@example.com"}); !errors.Is(err, ErrDuplicateOrder) {
		t.Errorf("the same order again: %v, want ErrDuplicateOrder", err)
	}
	// An order the database refuses (PostgreSQL's text holds no NUL byte)
	// rolls back, and its message with it: Drain below finds A-1's alone.
	if err := PlaceOrder(ctx, db, ob, Order{ID: "A-2", Email: "bad\x00@example.com"}); err == nil {
		t.Error("an email with a NUL byte was stored")
	}

	var m recordingMailer
	attempts, err := outboxtest.Drain(ctx, ob, pgxtx.FromStdlib(db), nil, RegisterHandlers(&m))
	if err != nil {
		t.Fatal(err)
	}
	if len(attempts) != 1 || attempts[0].Key != "A-1" || attempts[0].Outcome != outboxtest.Delivered {
		t.Fatalf("attempts: %+v, want A-1's message delivered once", attempts)
	}
	want := fmt.Sprintf("ann@example.com A-1 %s", attempts[0].ID)
	if got := strings.Join(m.sent, "; "); got != want {
		t.Errorf("confirmations: %q, want %q", got, want)
	}
	var orders, messages int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox)`).Scan(&orders, &messages); err != nil {
		t.Fatal(err)
	}
	if orders != 1 || messages != 0 {
		t.Errorf("%d orders and %d messages left, want 1 and 0", orders, messages)
	}
}

// TestRun runs the command's own code on PostgreSQL.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), testURL(t), &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if n := strings.Count(out.String(), "confirmation of order"); n != 3 {
		t.Errorf("%d confirmations, want 3:\n%s", n, out.String())
	}
}

// recordingMailer records the confirmations it is asked to send.
type recordingMailer struct {
	mu   sync.Mutex
	sent []string
}

func (m *recordingMailer) SendConfirmation(ctx context.Context, to, orderID, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sent = append(m.sent, to+" "+orderID+" "+key)
	return nil
}

// testDB opens the database testURL created.
func testDB(t *testing.T) *sql.DB {
	db, err := sql.Open("pgx", testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// testURL creates a database of the test's own on the PostgreSQL server
// at OUTBOX_TEST_POSTGRES_URL (else the local one), drops it when the
// test ends, and returns its URL. Without a server the test is skipped,
// or fails under CI=true.
func testURL(t *testing.T) string {
	t.Helper()
	base := os.Getenv("OUTBOX_TEST_POSTGRES_URL")
	if base == "" {
		base = defaultURL
	}
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL at %s: %v", base, err)
		}
		t.Skipf("no PostgreSQL at %s (set OUTBOX_TEST_POSTGRES_URL): %v", base, err)
	}
	name := fmt.Sprintf("example_postgres_%d", rand.Uint64())
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin, err := sql.Open("pgx", base)
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close()
		if _, err := admin.ExecContext(context.Background(), `DROP DATABASE `+name+` WITH (FORCE)`); err != nil {
			t.Error(err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}
