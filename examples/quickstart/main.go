// Command quickstart shows the transactional outbox end to end on an
// embedded SQLite file (no server, no cgo): messages written in the same
// transaction as the business rows, then delivered by a relay with a retry
// and a dead letter.
//
//	cd examples/quickstart && go run .
//
// It is a module with a workspace of its own (go.mod, go.work), so that
// command loads only the library, dialect/sqlite and modernc.org/sqlite.
// From the repository's root, `go run ./examples/quickstart` runs it too,
// through the repository's go.work, which loads every module's graph.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
	_ "modernc.org/sqlite"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// run tells the story on w.
func run(ctx context.Context, w io.Writer) error {
	w = &lockedWriter{w: w} // the relay runs handlers, which print, concurrently
	dir, err := os.MkdirTemp("", "oncommit-quickstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "shop.db")
	fmt.Fprintln(w, "oncommit quick start: the transactional outbox on SQLite")
	fmt.Fprintln(w, "database file:", path)

	// _txlock=immediate: a transaction takes SQLite's write lock when it
	// begins, waiting up to the busy timeout, instead of failing with
	// SQLITE_BUSY when it first writes after reading (see the sqlite package).
	db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return err
	}
	defer db.Close()
	if err := sqlite.Migrate(ctx, db, ""); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, email TEXT NOT NULL)`); err != nil {
		return err
	}
	fmt.Fprintln(w, "created the outbox table (sqlite.Migrate) and an orders table")

	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{})
	if err != nil {
		return err
	}

	// placeOrder is the service's own code: one transaction it owns, with the
	// business row and the message in it.
	placeOrder := func(id, email string, commit bool) (outbox.Result, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return outbox.Result{}, err
		}
		defer tx.Rollback() // no-op after Commit
		if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO orders (id, email) VALUES (?, ?)`, id, email); err != nil {
			return outbox.Result{}, err
		}
		res, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{
			Topic:    "order.placed",
			Key:      id,
			Payload:  []byte(fmt.Sprintf(`{"order_id":%q,"email":%q}`, id, email)),
			DedupKey: "order.placed/" + id,
		})
		if err != nil {
			return outbox.Result{}, err
		}
		if !commit {
			return res, tx.Rollback()
		}
		return res, tx.Commit()
	}

	fmt.Fprintln(w, "\n1. Two orders, each INSERTed with its message in ONE transaction, then COMMIT:")
	for _, o := range []struct{ id, email string }{{"A-1001", "ada@example.com"}, {"A-1002", "alan@example.com"}} {
		res, err := placeOrder(o.id, o.email, true)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "   order %s committed; message %s stored with it\n", o.id, res.ID)
	}

	fmt.Fprintln(w, "\n2. Order A-1003 fails after Publish and its transaction rolls back:")
	if _, err := placeOrder("A-1003", "grace@example.com", false); err != nil {
		return err
	}
	var orders, msgs int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM orders WHERE id = 'A-1003'), (SELECT count(*) FROM outbox WHERE message_key = 'A-1003')`).Scan(&orders, &msgs); err != nil {
		return err
	}
	fmt.Fprintf(w, "   rows left for A-1003: %d order, %d message (one rollback undid both)\n", orders, msgs)

	fmt.Fprintln(w, "\n3. A retried request for A-1001 publishes with the same dedup key:")
	res, err := placeOrder("A-1001", "ada@example.com", true)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "   Publish reports duplicate=%v; the transaction still committed\n", res.Duplicate)

	fmt.Fprintln(w, "\n4. A bad message is refused before any SQL is sent; the transaction stays usable:")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	_, perr := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "", Payload: []byte(`{"broken":`)})
	var me *outbox.MessageError
	fmt.Fprintf(w, "   error: %v (errors.As *outbox.MessageError: %v)\n", perr, errors.As(perr, &me))
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, email) VALUES ('A-1004', 'edsger@example.com')`); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	fmt.Fprintln(w, "   order A-1004 committed in the same transaction")

	fmt.Fprintln(w, "\n   One more transaction: an invoice message for A-1002 whose payload lacks a billing address.")
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "invoice.issued", Key: "A-1002", Payload: []byte(`{"order_id":"A-1002"}`)}); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\n5. The outbox table holds one message per committed publish, all pending:")
	if err := printTable(ctx, w, db); err != nil {
		return err
	}

	fmt.Fprintln(w, "\n6. A relay claims them and runs the handlers, outside any transaction:")
	relay, err := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{
		PollInterval: 50 * time.Millisecond,
		RetryBase:    200 * time.Millisecond, RetryCap: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), // the handlers below tell the story
	})
	if err != nil {
		return err
	}
	var mailFailed atomic.Bool
	type orderPlaced struct {
		OrderID string `json:"order_id"`
		Email   string `json:"email"`
	}
	err = outbox.HandleJSON(relay, "order.placed", func(ctx context.Context, d outbox.Delivery, o orderPlaced) error {
		if o.OrderID == "A-1002" && mailFailed.CompareAndSwap(false, true) {
			fmt.Fprintf(w, "   order.placed   %s attempt %d: mail server busy -> error, retried after a backoff\n", o.OrderID, d.Attempt)
			return errors.New("mail server busy")
		}
		fmt.Fprintf(w, "   order.placed   %s attempt %d: confirmation sent to %s (idempotency key %s)\n", o.OrderID, d.Attempt, o.Email, d.ID)
		return nil
	})
	if err != nil {
		return err
	}
	type invoice struct {
		OrderID        string `json:"order_id"`
		BillingAddress string `json:"billing_address"`
	}
	err = outbox.HandleJSON(relay, "invoice.issued", func(ctx context.Context, d outbox.Delivery, inv invoice) error {
		if inv.BillingAddress == "" {
			fmt.Fprintf(w, "   invoice.issued %s attempt %d: no billing address -> outbox.DeadLetter: dead-lettered, no retry\n", inv.OrderID, d.Attempt)
			return outbox.DeadLetter(errors.New("no billing address"))
		}
		return nil
	})
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		stats, err := ob.Stats(ctx, sqltx.FromDB(db))
		if err != nil {
			stop()
			return err
		}
		var live int64
		for _, st := range stats {
			live += st.Pending + st.Processing
		}
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			stop()
			return errors.New("the relay did not finish in 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop() // Run drains: outcomes are written before it returns
	if err := <-done; err != nil {
		return err
	}

	fmt.Fprintln(w, "\n7. Delivered messages are gone; the dead letter stays for inspection and redrive:")
	if err := printTable(ctx, w, db); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nDelivery is at least once: a crash between a handler's success and its outcome")
	fmt.Fprintln(w, "being written runs the handler again with the same id, so handlers use d.ID as")
	fmt.Fprintln(w, "their idempotency key. Every replica may run a relay; on PostgreSQL they claim with")
	fmt.Fprintln(w, "FOR UPDATE SKIP LOCKED and wake on NOTIFY (see README.md).")
	return nil
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// printTable prints the outbox table on w.
func printTable(ctx context.Context, w io.Writer, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, `SELECT id, topic, message_key, state, attempts, coalesce(last_error, '') FROM outbox ORDER BY created_at, id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	fmt.Fprintf(w, "   %-36s  %-14s  %-6s  %-10s  %-8s  %s\n", "id", "topic", "key", "state", "attempts", "last_error")
	n := 0
	for rows.Next() {
		var id, topic, key, state, lastErr string
		var attempts int
		if err := rows.Scan(&id, &topic, &key, &state, &attempts, &lastErr); err != nil {
			return err
		}
		fmt.Fprintf(w, "   %-36s  %-14s  %-6s  %-10s  %-8d  %s\n", id, topic, key, state, attempts, lastErr)
		n++
	}
	if n == 0 {
		fmt.Fprintln(w, "   (no rows)")
	}
	return rows.Err()
}
