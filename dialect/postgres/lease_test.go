package postgres

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// TestLeaseMinimum: PostgreSQL's minimum lease is the relay's floor,
// outbox.MinLease (1s): a shorter one is refused with a ConfigError on
// Lease, renewal on or off; at the minimum, a handler that runs longer
// than its lease keeps it by renewals and is delivered once.
func TestLeaseMinimum(t *testing.T) {
	t.Parallel()
	table, _ := migratedTable(t)
	ob, err := outbox.New(Dialect(), outbox.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	db := pgxtx.FromPool(pgtest.Pool(t))
	cfg := func(lease time.Duration, noRenew bool) outbox.RelayConfig {
		return outbox.RelayConfig{Lease: lease, DisableLeaseRenewal: noRenew, PollInterval: 20 * time.Millisecond,
			Listen: outbox.ListenOff, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	}
	for _, noRenew := range []bool{false, true} {
		var ce *outbox.ConfigError
		if _, err := ob.Relay(db, cfg(outbox.MinLease-time.Millisecond, noRenew)); !errors.As(err, &ce) || ce.Field != "Lease" || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("Lease %v (renewal off: %v): %v, want a ConfigError on Lease", outbox.MinLease-time.Millisecond, noRenew, err)
		}
	}
	r, err := ob.Relay(db, cfg(outbox.MinLease, false))
	if err != nil {
		t.Fatalf("Lease %v: %v, want it accepted", outbox.MinLease, err)
	}
	var mu sync.Mutex
	var attempts []int
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		mu.Lock()
		attempts = append(attempts, d.Attempt)
		mu.Unlock()
		select {
		case <-time.After(outbox.MinLease * 3 / 2): // past the lease
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	publishN(t, pgtest.Pool(t), ob, 1)
	dialecttest.StartRelay(t, r)
	dialecttest.Eventually(t, 20*time.Second, "the message settled", func() bool {
		var n int
		if err := pgtest.Admin(t).QueryRow(`SELECT count(*) FROM ` + table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 1 {
		t.Errorf("attempts %v, want [1]: the renewed lease kept the message", attempts)
	}
}
