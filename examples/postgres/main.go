// Command postgres is a small order service on PostgreSQL with pgx: it
// stores orders and publishes an order.placed message in the same
// transaction (shop.go), then runs a relay that sends each order's
// confirmation, at least once, keyed by the message id.
//
//	go run .    # against $DATABASE_URL, else postgres://postgres@127.0.0.1:5432/test
//
// It creates the tables outbox and orders in that database, places three
// orders, delivers them and exits. A service runs the relay for its whole
// life instead (relay.Run(ctx) until shutdown), in every replica.
// shop_test.go tests the same code with sqlmock and on a real database.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
)

// defaultURL is the database used when DATABASE_URL is not set.
const defaultURL = "postgres://postgres@127.0.0.1:5432/test"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = defaultURL
	}
	if err := run(ctx, url, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "postgres example:", err)
		os.Exit(1)
	}
}

// run places three orders in the database at url and delivers their
// messages, telling what happens on w.
func run(ctx context.Context, url string, w io.Writer) error {
	db, err := sql.Open("pgx", url) // pgx through database/sql: Publish takes the *sql.Tx
	if err != nil {
		return err
	}
	defer db.Close()
	if err := Migrate(ctx, db); err != nil {
		return err
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{}) // once, at start-up; safe to share
	if err != nil {
		return err
	}

	// Request handlers: each order in a transaction of its own.
	batch := strconv.FormatInt(time.Now().UnixNano(), 36)
	var orders []Order
	for i, email := range []string{"ada@example.com", "alan@example.com", "grace@example.com"} {
		o := Order{ID: fmt.Sprintf("%s-%d", batch, i+1), Email: email}
		if err := PlaceOrder(ctx, db, ob, o); err != nil {
			return err
		}
		orders = append(orders, o)
		fmt.Fprintf(w, "placed order %s for %s\n", o.ID, o.Email)
	}
	if err := PlaceOrder(ctx, db, ob, orders[0]); !errors.Is(err, ErrDuplicateOrder) {
		return fmt.Errorf("placing order %s again: %v, want ErrDuplicateOrder", orders[0].ID, err)
	}
	fmt.Fprintf(w, "placing order %s again: %v\n", orders[0].ID, ErrDuplicateOrder)

	// The relay: LISTEN wakes it within milliseconds of a commit; polling
	// stays the source of truth.
	m := &printMailer{w: w, want: map[string]bool{}, done: make(chan struct{})}
	for _, o := range orders {
		m.want[o.ID] = true
	}
	relay, err := ob.Relay(pgxtx.FromStdlib(db), outbox.RelayConfig{
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	if err := RegisterHandlers(m)(relay); err != nil {
		return err
	}
	rctx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	ran := make(chan error, 1)
	go func() { ran <- relay.Run(rctx) }()
	select {
	case <-m.done:
	case err := <-ran:
		return fmt.Errorf("relay stopped: %v", err)
	case <-time.After(30 * time.Second):
		return errors.New("the confirmations were not all sent within 30s")
	}
	stopRelay()  // Run lets running handlers finish and writes their outcomes
	return <-ran // before it returns
}

// printMailer prints each confirmation instead of sending it, and closes
// done once every order of want has had one.
type printMailer struct {
	w    io.Writer
	mu   sync.Mutex
	want map[string]bool
	done chan struct{}
}

func (m *printMailer) SendConfirmation(ctx context.Context, to, orderID, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprintf(m.w, "confirmation of order %s sent to %s (idempotency key %s)\n", orderID, to, key)
	if m.want[orderID] {
		delete(m.want, orderID)
		if len(m.want) == 0 {
			close(m.done)
		}
	}
	return nil
}
