package outbox_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/outbox"
)

type ctxKey struct{}

// TestHandlerContext: a handler's context carries the values of Run's
// context, is not cancelled when Run's context ends (the grace period lets
// it finish), and is cancelled when the grace period is over, including
// for a handler that a timeout derived from it would otherwise outlive.
func TestHandlerContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, outbox.Config{})
	r, err := e.ob.Relay(pgxtx.FromPool(pool(t)), outbox.RelayConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), ShutdownGrace: 300 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	type seen struct {
		value        any
		errAtStop    error
		derivedEnded time.Duration
	}
	got := make(chan seen, 1)
	runCtx, stop := context.WithCancel(context.WithValue(ctx, ctxKey{}, "v"))
	if err := r.Handle("t", func(hctx context.Context, d outbox.Delivery) error {
		derived, cancel := context.WithTimeout(hctx, time.Hour)
		defer cancel()
		close(started)
		var s seen
		s.value = hctx.Value(ctxKey{})
		time.Sleep(100 * time.Millisecond) // Run's context ends meanwhile
		s.errAtStop = hctx.Err()
		t0 := time.Now()
		select {
		case <-derived.Done():
			s.derivedEnded = time.Since(t0)
		case <-time.After(5 * time.Second): // never cancelled: fail, not hang
			s.derivedEnded = time.Hour
		}
		got <- s
		return hctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	<-started
	stop()
	s := <-got
	if s.value != "v" {
		t.Errorf("handler context value %v, want the one of Run's context", s.value)
	}
	if s.errAtStop != nil {
		t.Errorf("handler context ended with Run's: %v", s.errAtStop)
	}
	if s.derivedEnded > 400*time.Millisecond {
		t.Errorf("derived context ended %v after the grace period began", s.derivedEnded)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
