package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// TestNotifyIntervalCoalesces: with NotifyInterval, of the publishes made
// within one interval (one after another, or eight at once) exactly one
// notifies, and its payload carries the follow-up step in microseconds
// (2ms, the cap, for an interval of an hour);
// with NotifyEvery every publish notifies with an empty payload.
func TestNotifyIntervalCoalesces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, outbox.Config{NotifyInterval: time.Hour})
	plain, err := outbox.New(postgres.Dialect(), outbox.Config{Table: e.table, NotifyInterval: outbox.NotifyEvery})
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
	if got := received("m1"); len(got) != 1 || got[0] != "2000" {
		t.Fatalf("three publishes in one interval notified %q, want one notification with payload 2000 (the 2ms step)", got)
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
		t.Fatalf("two publishes with NotifyEvery notified %q, want two empty payloads", got)
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
	listenerUp(t, e)
	p := pool(t)
	begin := func() pgx.Tx { return beginTx(t, p) }
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

// beginTx begins a transaction on p, rolled back at the end of the test
// unless committed.
func beginTx(t *testing.T, p *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := p.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	return tx
}

// listenerUp waits until the relay of e listens.
func listenerUp(t *testing.T, e *env) {
	t.Helper()
	eventually(t, 10*time.Second, "listener up", func() bool {
		return count(t, "pg_stat_activity", `application_name = 'oncommit-listener' AND query LIKE 'LISTEN%`+e.schema+`%'`) == 1
	})
}

// TestWakeWindowLateSilentPublish: with the default NotifyInterval, a
// publish made silent by coalescing whose transaction commits well after
// the notifying one (after the relay handled the notifying publish's
// message and its first follow-ups found nothing) is delivered within
// about an eighth of that delay of its commit, although the relay polls
// once a minute.
func TestWakeWindowLateSilentPublish(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		after time.Duration // the silent commit, after the notifying one
	}{
		{"200ms after", 200 * time.Millisecond},
		{"1s after", time.Second},
		{"3s after", 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, outbox.Config{})
			r := newRelay(t, e, outbox.RelayConfig{PollInterval: time.Minute})
			handled := make(chan time.Time, 2)
			r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { handled <- time.Now(); return nil })
			start(t, r)
			listenerUp(t, e)
			p := pool(t)
			begin := func() pgx.Tx { return beginTx(t, p) }
			loud, silent := begin(), begin()
			if _, err := e.ob.Publish(ctx, pgxtx.From(loud), outbox.Message{Topic: "t"}); err != nil {
				t.Fatal(err)
			}
			outbox.Silence(e.ob, time.Hour) // the next publish is silent, however long this one took
			if _, err := e.ob.Publish(ctx, pgxtx.From(silent), outbox.Message{Topic: "t"}); err != nil {
				t.Fatal(err)
			}
			if err := loud.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			woke := time.Now()
			select {
			case <-handled:
			case <-time.After(5 * time.Second):
				t.Fatal("the notifying publish was not delivered within 5s")
			}
			time.Sleep(time.Until(woke.Add(tc.after)))
			if err := silent.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			committed := time.Now()
			// About tc.after/8 (see Config.NotifyInterval), and slack for a
			// loaded machine; the poll is a minute away.
			bound := tc.after/8 + 75*time.Millisecond
			select {
			case at := <-handled:
				lat := at.Sub(committed)
				t.Logf("silent publish committed %v after the notifying one, delivered %v after its commit", committed.Sub(woke).Round(time.Millisecond), lat.Round(100*time.Microsecond))
				if lat > bound {
					t.Fatalf("silent publish delivered %v after its commit, want at most %v", lat, bound)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the silent publish was not delivered within 5s of its commit (the poll is a minute away)")
			}
		})
	}
}

// claimTimes records when a relay claims.
type claimTimes struct {
	mu sync.Mutex
	at []time.Time
}

func (c *claimTimes) TraceClaim(context.Context, []outboxdriver.Claimed, error) {
	c.mu.Lock()
	c.at = append(c.at, time.Now())
	c.mu.Unlock()
}

func (c *claimTimes) TraceSettle(context.Context, []outboxdriver.Settlement, []outboxdriver.Fence, error) {
}

// between counts the claims in [from, to).
func (c *claimTimes) between(from, to time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, at := range c.at {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// TestWakeWindowBackToPoll: after a coalescing publisher's wake-up an idle
// relay claims at short intervals, then, once the intervals have grown to
// its poll interval (8 poll intervals later), claims at its poll interval
// again; a relay woken by a publisher with NotifyEvery claims once.
func TestWakeWindowBackToPoll(t *testing.T) {
	t.Parallel()
	const poll = 250 * time.Millisecond
	for _, tc := range []struct {
		name     string
		interval time.Duration
		// claims in the first poll interval after the wake-up: at least
		// minEarly, at most maxEarly
		minEarly, maxEarly int
	}{
		{"coalescing (default)", 0, 5, 45}, // about 31 at a 2ms step; a claim held up on a loaded host costs several
		{"NotifyEvery", outbox.NotifyEvery, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{NotifyInterval: tc.interval})
			ct := &claimTimes{}
			r := newRelay(t, e, outbox.RelayConfig{PollInterval: poll, Tracer: ct})
			rec := newRecorder()
			r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
			start(t, r)
			listenerUp(t, e)
			time.Sleep(poll)
			publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
			woke := time.Now()
			eventually(t, 5*time.Second, "delivery", func() bool { return rec.count() == 1 })
			back := woke.Add(8*poll + poll) // the window, and one poll interval
			time.Sleep(time.Until(back.Add(8 * poll)))
			early := ct.between(woke, woke.Add(poll))
			window := ct.between(woke, back)
			after := ct.between(back, back.Add(8*poll))
			t.Logf("claims: %d in the first %v, %d in the window, %d in the %v after", early, poll, window, after, 8*poll)
			if early < tc.minEarly || early > tc.maxEarly {
				t.Errorf("%d claims in the first %v after the wake-up, want %d to %d", early, poll, tc.minEarly, tc.maxEarly)
			}
			if window > 60 {
				t.Errorf("%d claims in the %v window, want at most 60", window, 9*poll)
			}
			// Polling alone claims 8 times; a relay still following up
			// claims every NotifyInterval (5ms) or every 8th of the time
			// since the wake-up (at least 2.25 s / 8 = 280 ms).
			if after < 6 || after > 10 {
				t.Errorf("%d claims in the %v after the window, want 6 to 10 (one per %v poll)", after, 8*poll, poll)
			}
		})
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
	channel := pgsql.Channel(e.ob.Table())
	if _, err := listener.Exec(ctx, `LISTEN "`+channel+`"`); err != nil {
		t.Fatal(err)
	}
	return listener, channel
}
