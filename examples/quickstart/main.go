// Command quickstart shows the producer half of the transactional outbox on
// an embedded SQLite file: no server, no cgo.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
	_ "modernc.org/sqlite"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "oncommit-quickstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "shop.db")
	fmt.Println("oncommit quick start: the transactional outbox on SQLite")
	fmt.Println("database file:", path)

	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
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
	fmt.Println("created the outbox table (sqlite.Migrate) and an orders table")

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

	fmt.Println("\n1. Two orders, each INSERTed with its message in ONE transaction, then COMMIT:")
	for _, o := range []struct{ id, email string }{{"A-1001", "ada@example.com"}, {"A-1002", "alan@example.com"}} {
		res, err := placeOrder(o.id, o.email, true)
		if err != nil {
			return err
		}
		fmt.Printf("   order %s committed; message %s stored with it\n", o.id, res.ID)
	}

	fmt.Println("\n2. Order A-1003 fails after Publish and its transaction rolls back:")
	if _, err := placeOrder("A-1003", "grace@example.com", false); err != nil {
		return err
	}
	var orders, msgs int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM orders WHERE id = 'A-1003'), (SELECT count(*) FROM outbox WHERE message_key = 'A-1003')`).Scan(&orders, &msgs); err != nil {
		return err
	}
	fmt.Printf("   rows left for A-1003: %d order, %d message (one rollback undid both)\n", orders, msgs)

	fmt.Println("\n3. A retried request for A-1001 publishes with the same dedup key:")
	res, err := placeOrder("A-1001", "ada@example.com", true)
	if err != nil {
		return err
	}
	fmt.Printf("   Publish reports duplicate=%v; the transaction still committed\n", res.Duplicate)

	fmt.Println("\n4. A bad message is refused before any SQL is sent; the transaction stays usable:")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	_, perr := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "", Payload: []byte(`{"broken":`)})
	var me *outbox.MessageError
	fmt.Printf("   error: %v (errors.As *outbox.MessageError: %v)\n", perr, errors.As(perr, &me))
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, email) VALUES ('A-1004', 'edsger@example.com')`); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	fmt.Println("   order A-1004 committed in the same transaction")

	fmt.Println("\n5. The outbox table now holds one message per committed order, due at once:")
	rows, err := db.QueryContext(ctx, `SELECT id, topic, message_key, state, attempts, available_at FROM outbox ORDER BY available_at, id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	fmt.Printf("   %-36s  %-12s  %-6s  %-7s  %-8s  %s\n", "id", "topic", "key", "state", "attempts", "available_at (database clock)")
	for rows.Next() {
		var id, topic, key, state string
		var attempts int
		var at int64
		if err := rows.Scan(&id, &topic, &key, &state, &attempts, &at); err != nil {
			return err
		}
		fmt.Printf("   %-36s  %-12s  %-6s  %-7s  %-8d  %s\n", id, topic, key, state, attempts, time.UnixMilli(at).UTC().Format(time.RFC3339Nano))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	fmt.Println("\nThe id each Publish returned is the id stored in the table, in the same text form;")
	fmt.Println("it is the idempotency key a handler uses. A relay claims these rows and delivers")
	fmt.Println("them at least once; the PostgreSQL relay is in the README, the SQLite relay is next.")
	return nil
}
