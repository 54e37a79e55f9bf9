package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestErrorsSayPrefixOnce walks every sentinel: alone, classified (wrapped
// with a driver's error), and wrapped by an operation, with and without an
// ended context, its text says "outbox:" exactly once.
func TestErrorsSayPrefixOnce(t *testing.T) {
	sentinels := []error{
		ErrNilTx, ErrNotInTransaction, ErrTxDone, ErrTxAborted, ErrReadOnlyTx, ErrTableMissing,
		ErrSchemaMismatch, ErrRetryTx, ErrInvalidMessage, ErrInvalidConfig, ErrUnsupported, ErrNoHandlers,
		ErrRelayStarted, ErrDuplicateHandler, ErrNoRelay, ErrRelayNotRunning, ErrRelayDraining, ErrRelayFailing,
		&MessageError{0, "Topic", "must not be empty"}, &ConfigError{Field: "Table", Reason: "bad"},
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	driver := errors.New(`ERROR: relation "x" does not exist (SQLSTATE 42P01)`)
	for _, s := range sentinels {
		classified := fmt.Errorf("%w: %w", s, driver)
		for _, err := range []error{
			s, classified,
			wrapOp(context.Background(), "publish", s),
			wrapOp(context.Background(), "publish", classified),
			wrapOp(ended, "claim", classified),
			wrapOp(context.Background(), "relay", wrapOp(context.Background(), "claim", classified)),
			Health{Running: true, ConsecutiveErrors: unhealthyAfter, LastError: wrapOp(context.Background(), "claim", classified)}.Err(),
		} {
			if n := strings.Count(err.Error(), "outbox:"); n != 1 {
				t.Errorf("%q says outbox: %d times", err, n)
			}
			if !errors.Is(err, s) && !errors.Is(err, ErrRelayFailing) {
				t.Errorf("%q does not wrap %v", err, s)
			}
		}
	}
	if err := wrapOp(ended, "claim", driver); !errors.Is(err, context.Canceled) || !errors.Is(err, driver) {
		t.Errorf("%v does not wrap both the context's error and the cause", err)
	}
}
