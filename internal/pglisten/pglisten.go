// Package pglisten runs a PostgreSQL LISTEN loop on a dedicated pgx
// connection, with a health check that finds a half-open connection.
package pglisten

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// HealthEvery is how long the loop waits for a notification before it
// checks, with a round trip, that the connection is still alive.
const HealthEvery = 15 * time.Second

// HealthTimeout bounds that check.
const HealthTimeout = 5 * time.Second

// Run executes listenSQL on conn, calls wake once listening (with payload
// "") and once per notification (with its payload), and returns nil when
// ctx ends or the error that ended the connection.
func Run(ctx context.Context, conn *pgx.Conn, listenSQL string, wake func(payload string)) error {
	if _, err := conn.Exec(ctx, listenSQL); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	wake("")
	for {
		wctx, cancel := context.WithTimeout(ctx, HealthEvery)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			wake(n.Payload)
			continue
		case ctx.Err() != nil:
			return nil
		case !errors.Is(err, context.DeadlineExceeded):
			return err
		}
		// Quiet for a while: make sure the peer is still there.
		pctx, cancel := context.WithTimeout(ctx, HealthTimeout)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}
