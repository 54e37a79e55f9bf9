package chaostest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

// runChild plays a child process's part: a relay or a publisher, until
// its parent closes its standard input (or dies, which closes it too).
func runChild(t *testing.T, b Backend, role string) {
	var target Target
	if err := json.Unmarshal([]byte(os.Getenv(envTarget)), &target); err != nil {
		t.Fatalf("%s: %v", envTarget, err)
	}
	var idx, serial int
	var seed uint64
	if _, err := fmt.Sscanf(os.Getenv(envChild), "%d,%d,%d", &idx, &serial, &seed); err != nil {
		t.Fatalf("%s: %v", envChild, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	c, err := b.Open(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ob, err := outbox.New(b.Dialect, outbox.Config{Table: c.Table})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, uint64(serial)))
	switch role {
	case "relay":
		work, _ := time.ParseDuration(os.Getenv(envWork))
		lease, _ := time.ParseDuration(os.Getenv(envLease))
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		r, err := ob.Relay(c.Relay, relayConfig(lease, logger))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Handle(Topic, handler(c, serial, work, rng)); err != nil {
			t.Fatal(err)
		}
		if err := r.Run(ctx); err != nil {
			t.Fatal(err)
		}
	case "ordered-relay": // the ordered checker's (ordered.go)
		lease, _ := time.ParseDuration(os.Getenv(envLease))
		runOrderedRelay(ctx, t, b, c, serial, lease)
	case "publisher":
		rate, _ := strconv.ParseFloat(os.Getenv(envRate), 64)
		publish(ctx, c, ob, rate, rng)
	default:
		t.Fatalf("unknown role %q", role)
	}
}

// relayConfig is the configuration of every relay of the test, child or
// healing: the dialect's poll interval unless OUTBOX_CHAOS_POLL says
// otherwise, the batch size of OUTBOX_CHAOS_BATCH when set (both for
// experiments), attempts enough that no kill dead-letters a message.
func relayConfig(lease time.Duration, logger *slog.Logger) outbox.RelayConfig {
	cfg := outbox.RelayConfig{Lease: lease, MaxAttempts: 1000, Logger: logger,
		RetryBase: 10 * time.Millisecond, RetryCap: 100 * time.Millisecond}
	if d, err := time.ParseDuration(os.Getenv("OUTBOX_CHAOS_POLL")); err == nil {
		cfg.PollInterval = d
	}
	if n, err := strconv.Atoi(os.Getenv("OUTBOX_CHAOS_BATCH")); err == nil {
		cfg.BatchSize = n
	}
	return cfg
}

// handler records the start of each delivery in the ledger, works for a
// random while, and records its finish. Ledger writes are retried until
// they succeed, so that a busy database does not turn into a failed
// delivery (and a retry the checker would blame on a kill).
func handler(c *Conn, proc int, work time.Duration, rng *rand.Rand) outbox.Handler {
	var mu sync.Mutex
	record := recorder(c, c.Ledger, proc)
	return func(ctx context.Context, d outbox.Delivery) error {
		if err := record(ctx, d, "S"); err != nil {
			return err
		}
		if work > 0 {
			mu.Lock()
			w := time.Duration(rng.Int64N(int64(work)))
			mu.Unlock()
			time.Sleep(w)
		}
		return record(ctx, d, "F")
	}
}

// recorder returns the function that records a delivery's step (kind) in
// ledger (id, bkey, attempt, kind, proc, at_ns), retried until it succeeds or ctx
// ends.
func recorder(c *Conn, ledger string, proc int) func(ctx context.Context, d outbox.Delivery, kind string) error {
	q := c.q(`INSERT INTO ` + ledger + ` (id, bkey, attempt, kind, proc, at_ns) VALUES (?, ?, ?, ?, ?, ?)`)
	return func(ctx context.Context, d outbox.Delivery, kind string) error {
		at := time.Now().UnixNano()
		for {
			_, err := c.ledger().ExecContext(ctx, q, d.ID.String(), d.Key, d.Attempt, kind, proc, at)
			if err == nil || ctx.Err() != nil {
				return err
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// publish runs business transactions at rate per second until ctx ends:
// each writes one to three business rows and their messages (Key: the
// business row's id), waits a little inside the transaction, and commits.
// It prints O when a transaction opens, B before COMMIT, C n after it
// (n messages), E and the error when one fails: the parent reads them to
// tell where its kills landed.
func publish(ctx context.Context, c *Conn, ob *outbox.Outbox, rate float64, rng *rand.Rand) {
	interval := time.Duration(float64(time.Second) / rate)
	insert := c.q(`INSERT INTO ` + c.Business + ` (id) VALUES (?)`)
	bg := context.Background() // a transaction once begun runs to its end
	next := time.Now()
	for ctx.Err() == nil {
		next = next.Add(interval)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		} else {
			next = time.Now()
		}
		m := 1 + rng.IntN(3)
		fmt.Println("O")
		err := func() error {
			tx, err := c.Begin(bg)
			if err != nil {
				return err
			}
			msgs := make([]outbox.Message, m)
			for i := range msgs {
				id := outbox.NewID().String()
				if err := tx.Exec(bg, insert, id); err != nil {
					_ = tx.Rollback()
					return err
				}
				msgs[i] = outbox.Message{Topic: Topic, Key: id}
			}
			if _, err := ob.PublishBatch(bg, tx.Tx, msgs); err != nil {
				_ = tx.Rollback()
				return err
			}
			time.Sleep(time.Duration(rng.Int64N(int64(3 * time.Millisecond))))
			fmt.Println("B")
			return tx.Commit()
		}()
		if err != nil {
			fmt.Println("E", err)
			continue
		}
		fmt.Println("C", m)
	}
}
