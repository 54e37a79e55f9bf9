package receive_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/internal/receive"
	"github.com/oncommit/oncommit/outbox"
)

// TestApply: each verdict of Apply, on PostgreSQL: new then repeat are
// acks; a failure before the last attempt is a retry without a dead
// letter; on the last attempt, a DeadLetterError, an id the inbox refuses
// or no id, the message is dead-lettered (Dead), or retried when its dead
// letter fails or the context has ended.
func TestApply(t *testing.T) {
	schema := pgtest.Schema(t)
	ctx := context.Background()
	if err := postgres.MigrateInbox(ctx, pgtest.Admin(t), schema+".inbox"); err != nil {
		t.Fatal(err)
	}
	ib, err := outbox.NewInbox(postgres.Dialect(), outbox.InboxConfig{Table: schema + ".inbox"})
	if err != nil {
		t.Fatal(err)
	}
	b := pgxtx.NewBeginner(pgtest.Pool(t), pgx.TxOptions{})
	boom := errors.New("boom")
	ok := func(context.Context, pgx.Tx) error { return nil }
	fail := func(context.Context, pgx.Tx) error { return boom }
	poison := func(context.Context, pgx.Tx) error { return outbox.DeadLetter(boom) }
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, c := range []struct {
		name         string
		ctx          context.Context
		id           string
		attempt, max int
		fn           func(context.Context, pgx.Tx) error
		deadErr      error
		want         receive.Verdict
		applied, rep bool
		deadLettered bool
	}{
		{"new", ctx, "m-1", 1, 3, ok, nil, receive.Ack, true, false, false},
		{"repeat", ctx, "m-1", 2, 3, ok, nil, receive.Ack, false, true, false},
		{"failure before the last attempt", ctx, "m-2", 2, 3, fail, nil, receive.Retry, false, false, false},
		{"failure, unlimited attempts", ctx, "m-2", 50, -1, fail, nil, receive.Retry, false, false, false},
		{"failure on the last attempt", ctx, "m-2", 3, 3, fail, nil, receive.Dead, false, false, true},
		{"DeadLetterError on the first", ctx, "m-3", 1, 3, poison, nil, receive.Dead, false, false, true},
		{"no id", ctx, "", 1, 3, ok, nil, receive.Dead, false, false, true},
		{"an id the inbox refuses", ctx, strings.Repeat("x", outbox.MaxInboxIDBytes+1), 1, 3, ok, nil, receive.Dead, false, false, true},
		{"dead letter fails", ctx, "m-4", 3, 3, fail, boom, receive.Retry, false, false, true},
		{"context ended", cancelled, "m-5", 3, 3, fail, nil, receive.Retry, false, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			deadLettered := false
			r := receive.Apply(c.ctx, ib, b, "c", c.id, c.attempt, c.max, c.fn, func(context.Context, error) error {
				deadLettered = true
				return c.deadErr
			})
			if r.Verdict != c.want || r.Applied != c.applied || r.Repeat != c.rep || deadLettered != c.deadLettered {
				t.Fatalf("%+v, dead letter written %v; want %v, applied %v, repeat %v, dead letter %v", r, deadLettered, c.want, c.applied, c.rep, c.deadLettered)
			}
			if (r.Verdict != receive.Ack) != (r.Err != nil) {
				t.Fatalf("verdict %v with error %v", r.Verdict, r.Err)
			}
		})
	}
}
