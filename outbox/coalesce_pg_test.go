package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// TestNotifyIntervalCoalesces: with NotifyInterval, of the publishes made
// within one interval (one after another, or eight at once) exactly one
// notifies, and its payload carries the follow-up delay in microseconds;
// without it every publish notifies with an empty payload.
func TestNotifyIntervalCoalesces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, outbox.Config{NotifyInterval: time.Hour})
	plain, err := outbox.New(postgres.Dialect(), outbox.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	listener, channel := listenTo(t, e)
	p := pool(t)
	publish := func(ob *outbox.Outbox) {
		tx, err := p.Begin(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		defer tx.Rollback(ctx)
		if _, err := ob.Publish(ctx, pgxtx.From(tx), outbox.Message{Topic: "t"}); err != nil {
			t.Error(err)
			return
		}
		if err := tx.Commit(ctx); err != nil {
			t.Error(err)
		}
	}
	// received returns the payloads notified before the marker.
	received := func(marker string) []string {
		if _, err := p.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, marker); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			n, err := listener.WaitForNotification(wctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if n.Payload == marker {
				return got
			}
			got = append(got, n.Payload)
		}
	}

	for range 3 {
		publish(e.ob)
	}
	if got := received("m1"); len(got) != 1 || got[0] != "3600000000" {
		t.Fatalf("three publishes in one interval notified %q, want one notification with payload 3600000000", got)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: e.table, NotifyInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); publish(ob) }()
	}
	wg.Wait()
	if got := received("m2"); len(got) != 1 {
		t.Fatalf("eight concurrent publishes in one interval notified %q, want one notification", got)
	}
	publish(plain)
	publish(plain)
	if got := received("m3"); len(got) != 2 || got[0] != "" || got[1] != "" {
		t.Fatalf("two publishes without NotifyInterval notified %q, want two empty payloads", got)
	}
	if n := count(t, e.table, ""); n != 13 {
		t.Fatalf("%d rows, want 13: a silent publish lost its message", n)
	}
}

// TestNotifyIntervalFollowUp: a publish made silent by NotifyInterval is
// delivered soon after its commit, although it commits after the relay
// handled the notifying publish's message and the relay polls once a
// minute: the notification asked for a follow-up claim.
func TestNotifyIntervalFollowUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The interval is long beside the few milliseconds between the
	// notifying publish's delivery and the silent one's commit, so a
	// loaded machine does not make the follow-up claim come too early.
	e := newEnv(t, outbox.Config{NotifyInterval: 2 * time.Second})
	r := newRelay(t, e, outbox.RelayConfig{PollInterval: time.Minute})
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	start(t, r)
	eventually(t, 10*time.Second, "listener up", func() bool {
		return count(t, "pg_stat_activity", `application_name = 'oncommit-listener' AND query LIKE 'LISTEN%`+e.schema+`%'`) == 1
	})
	p := pool(t)
	begin := func() pgx.Tx {
		tx, err := p.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback(ctx) })
		return tx
	}
	for round := range 2 {
		loud, silent := begin(), begin()
		if _, err := e.ob.Publish(ctx, pgxtx.From(loud), outbox.Message{Topic: "t"}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.ob.Publish(ctx, pgxtx.From(silent), outbox.Message{Topic: "t"}); err != nil {
			t.Fatal(err)
		}
		if err := loud.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "the notifying publish delivered", func() bool { return rec.count() == 2*round+1 })
		if err := silent.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "the silent publish delivered by the follow-up claim (the poll is a minute away)", func() bool { return rec.count() == 2*round+2 })
		time.Sleep(2100 * time.Millisecond) // past the interval: the next publish notifies
	}
}

// listenTo returns a connection listening on e's notification channel,
// closed at the end of the test.
func listenTo(t *testing.T, e *env) (*pgx.Conn, string) {
	t.Helper()
	ctx := context.Background()
	listener, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close(ctx) })
	channel := postgres.Channel(e.ob.Table())
	if _, err := listener.Exec(ctx, `LISTEN "`+channel+`"`); err != nil {
		t.Fatal(err)
	}
	return listener, channel
}
