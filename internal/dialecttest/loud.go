package dialecttest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

// runChecksTable: Run on a table that does not exist returns an error
// wrapping ErrTableMissing within a second, saying "outbox:" once, and
// Health says the relay is not running.
func runChecksTable(t *testing.T, e *env) {
	ob, err := outbox.New(e.ob.Dialect(), outbox.Config{Table: e.ob.Table().String() + "_missing"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := ob.Relay(e.DB, outbox.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Handle("t", func(context.Context, outbox.Delivery) error { return nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	began := time.Now()
	err = r.Run(ctx)
	took := time.Since(began)
	if !errors.Is(err, outbox.ErrTableMissing) {
		t.Fatalf("Run on a missing table: %v, want ErrTableMissing", err)
	}
	// Failing fast is the promise: a relay that retried would run until
	// the context's 10 s. 5 s leaves room for a loaded host.
	if took > 5*time.Second {
		t.Errorf("Run took %v to fail, want under 5s", took)
	}
	if n := strings.Count(err.Error(), "outbox:"); n != 1 {
		t.Errorf("%q says outbox: %d times", err, n)
	}
	if h := r.Health(); h.Running || !errors.Is(h.Err(), outbox.ErrRelayNotRunning) {
		t.Errorf("after Run returned: %+v", h)
	}

	// Publish there fails (the database refuses); its error, too, says
	// "outbox:" once.
	tx := e.Begin(t)
	defer tx.Rollback()
	_, err = ob.Publish(context.Background(), tx.Tx, outbox.Message{Topic: "t"})
	if err == nil {
		t.Fatal("Publish to a missing table succeeded")
	}
	if n := strings.Count(err.Error(), "outbox:"); n != 1 {
		t.Errorf("%q says outbox: %d times", err, n)
	}
}

// relayStats: a relay's Stats names the topics with due messages it has no
// handler for, and the topics it handles that have no messages.
func relayStats(t *testing.T, e *env) {
	e.publish(t, outbox.Message{Topic: "orphan"}, outbox.Message{Topic: "mine"}, outbox.Message{Topic: "later", Delay: time.Hour})
	r, err := e.ob.Relay(e.DB, outbox.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"mine", "typo"} {
		if err := r.Handle(topic, func(context.Context, outbox.Delivery) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := r.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rs.Unhandled, []string{"orphan"}) {
		t.Errorf("Unhandled %q, want [orphan] (later is not due, mine is handled)", rs.Unhandled)
	}
	if !slices.Equal(rs.Idle, []string{"typo"}) {
		t.Errorf("Idle %q, want [typo]", rs.Idle)
	}
	if len(rs.Topics) != 3 {
		t.Errorf("Topics %+v, want 3", rs.Topics)
	}
}
