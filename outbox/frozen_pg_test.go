package outbox_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

// TestPublishFrozenBackend: with CommandTimeout 500 ms, Publish on a
// backend stopped with SIGSTOP returns an error wrapping
// context.DeadlineExceeded within timeout + 250 ms on the pgx paths (pgx
// closes the socket when the context ends), and nothing is stored.
//
// lib/pq cannot be bounded: on cancellation it sends a cancel request and
// keeps waiting for the frozen server's answer. The test pins that
// documented limit (docs/guide.md, Known limits): Publish is still blocked
// well past the timeout and returns the deadline error once the backend
// resumes.
func TestPublishFrozenBackend(t *testing.T) {
	const timeout = 500 * time.Millisecond
	for _, d := range drivers() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{CommandTimeout: timeout})
			tx := d.begin(t)
			pid := backendPID(t, tx)
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatalf("cannot stop backend %d (the test needs to signal the server's processes): %v", pid, err)
			}
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					_ = syscall.Kill(pid, syscall.SIGCONT)
				}
			}
			t.Cleanup(resume)
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := e.ob.Publish(context.Background(), tx.tx, outbox.Message{Topic: "frozen"})
				done <- err
			}()
			if d.name == "libpq" {
				select {
				case err := <-done:
					t.Fatalf("lib/pq returned on a frozen backend (%v): update docs/guide.md's Known limits", err)
				case <-time.After(timeout + time.Second):
				}
				resume()
				if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("after SIGCONT: %v, want an error wrapping context.DeadlineExceeded", err)
				}
				_ = tx.rollback()
				if n := count(t, e.table, ""); n != 0 {
					t.Errorf("%d messages stored", n)
				}
				return
			}
			select {
			case err := <-done:
				elapsed := time.Since(start)
				resume()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
				}
				if elapsed > timeout+250*time.Millisecond {
					t.Errorf("Publish returned after %v, want at most %v", elapsed, timeout+250*time.Millisecond)
				}
			case <-time.After(5 * time.Second):
				resume()
				err := <-done
				t.Errorf("Publish hung on a frozen backend (returned %v only after SIGCONT)", err)
			}
			_ = tx.rollback()
			if n := count(t, e.table, ""); n != 0 {
				t.Errorf("%d messages stored", n)
			}
		})
	}
}

// backendPID returns the server process of the transaction's connection.
func backendPID(t *testing.T, tx txn) int {
	t.Helper()
	rows, err := tx.tx.QueryTx(context.Background(), `SELECT pg_backend_pid()`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var pid int
	for rows.Next() {
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
	}
	if pid == 0 {
		t.Fatal("no backend pid")
	}
	return pid
}
