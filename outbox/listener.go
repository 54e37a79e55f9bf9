package outbox

import (
	"context"
	"time"

	"github.com/oncommit/oncommit/internal/backoff"
)

// listenRetry is the wait between listener connections: it grows only
// while connecting fails, and starts again from Base after a connection
// that reached LISTEN.
var listenRetry = backoff.Policy{Base: 100 * time.Millisecond, Cap: 30 * time.Second, Jitter: 0.5}

// listenLoop keeps a listener running, reconnecting with backoff. A
// connection that reached LISTEN counts as a recovery: however short its
// life, the next attempt waits listenRetry's first step, so a listener
// cut every few seconds is back within a fraction of a second each time.
// The backoff grows only while connecting (or LISTEN itself) fails.
func (r *Relay) listenLoop(ctx context.Context) {
	sql := r.d.ListenSQL(r.ob.table)
	failures := 0
	for {
		up := false
		r.setListener(ctx, ListenerConnecting, false)
		err := r.listen.ListenDB(ctx, sql, func(payload string) {
			if !up { // the first call says LISTEN is in force
				up = true
				r.setListener(ctx, ListenerListening, true)
			}
			r.notified(payload)
		})
		if ctx.Err() != nil {
			return
		}
		if up {
			failures = 0
		}
		failures++
		wait := listenRetry.Delay(failures)
		r.setListener(ctx, ListenerDown, false)
		r.log.Warn("outbox: listener lost; reconnecting", "err", err, "retry_in", wait, "failures", failures)
		r.signal() // poll now: notifications may have been missed
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
