package dialecttest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// redriveKeepsFence: a fence taken before a redrive never matches a claim
// made after it (issue 19 item 4). Redrive used to set attempts to 0, so
// the first claim after it had attempts 1 again: the (id, attempts) of the
// message's first claim, and a relay still holding that claim (its lease
// lapsed, its handler slow) deleted the redriven message with its late
// success while the new claim's handler ran. Redrive now keeps attempts
// (which never decrease) and sets attempts_base; the redriven message still
// gets MaxAttempts fresh attempts before it is dead-lettered again.
func redriveKeepsFence(t *testing.T, e *env) {
	ctx := context.Background()
	id := e.publish(t, outbox.Message{Topic: "t"})[0].ID
	p := outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: 50 * time.Millisecond, MaxAttempts: 2}
	one := func(what string, attempts, base int, dead bool) outboxdriver.Claimed {
		t.Helper()
		cs := claim(t, e, p)
		if len(cs) != 1 || cs[0].ID != id || cs[0].Attempts != attempts || cs[0].AttemptsBase != base || cs[0].Dead != dead {
			t.Fatalf("%s: claimed %+v, want attempts %d, base %d, dead %v", what, cs, attempts, base, dead)
		}
		return cs[0]
	}
	retry := func(what string, f outboxdriver.Fence) {
		t.Helper()
		applied, err := e.rd.Settle(ctx, e.DB, e.ob.Table(), outboxdriver.SettleParams{}, []outboxdriver.Settlement{{Fence: f, Kind: outboxdriver.SettleRetry, Error: "x"}})
		if err != nil || len(applied) != 1 {
			t.Fatalf("%s: retry of %v applied %v, %v", what, f, applied, err)
		}
	}
	// The stale relay's claim: attempt 1, whose lease lapses.
	stale := one("first claim", 1, 0, false)
	f1 := outboxdriver.Fence{ID: id, Attempts: stale.Attempts}
	time.Sleep(120 * time.Millisecond)
	p.Lease = time.Minute
	f2 := outboxdriver.Fence{ID: id, Attempts: one("claim after the lease", 2, 0, false).Attempts}
	retry("second attempt", f2)
	one("claim past max attempts", 2, 0, true)

	if n, err := e.rd.Redrive(ctx, e.DB, e.ob.Table(), "t"); err != nil || n != 1 {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	if e.count(t, idIs(id)+" AND state = 'pending' AND attempts = 2 AND attempts_base = 2") != 1 {
		t.Error("redrive changed attempts, or did not set attempts_base to them")
	}
	cs := claim(t, e, p)
	if len(cs) != 1 || cs[0].ID != id {
		t.Fatalf("claim after the redrive: %v", cs)
	}
	cur := cs[0]

	// Late outcomes of the claims made before the redrive change nothing,
	// whether settled alone or carried by a claim. f1 first: before the
	// fix the claim after the redrive had f1's attempts again, and the
	// stale success deleted the message.
	for _, f := range []outboxdriver.Fence{f1, f2} {
		for _, kind := range []outboxdriver.SettleKind{outboxdriver.SettleDone, outboxdriver.SettleRetry, outboxdriver.SettleDead} {
			for _, sp := range []outboxdriver.SettleParams{{}, {KeepDelivered: true}, {DiscardDead: true}} {
				applied, err := e.rd.Settle(ctx, e.DB, e.ob.Table(), sp, []outboxdriver.Settlement{{Fence: f, Kind: kind, Error: "stale"}})
				if err != nil || len(applied) != 0 {
					t.Errorf("stale settle (kind %d, %+v) of %v after the redrive applied %v, %v", kind, sp, f, applied, err)
				}
			}
		}
		cs, done, err := e.rd.Claim(ctx, e.DB, e.ob.Table(), outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: time.Minute, MaxAttempts: 2, Done: []outboxdriver.Fence{f}})
		if err != nil || len(cs) != 0 || len(done) != 0 {
			t.Errorf("a claim carrying the stale success %v took %v and applied %v, %v", f, cs, done, err)
		}
	}
	if e.count(t, idIs(id)+" AND state = 'processing' AND attempts = 3 AND attempts_base = 2") != 1 {
		t.Fatal("a stale fence from before the redrive changed the redriven message")
	}
	if cur.Attempts != 3 || cur.AttemptsBase != 2 || cur.Dead {
		t.Fatalf("claim after the redrive: %+v, want attempts 3, base 2", cur)
	}

	// MaxAttempts fresh attempts: 1 (above), 2, then dead at claim.
	retry("first attempt after the redrive", outboxdriver.Fence{ID: id, Attempts: cur.Attempts})
	f4 := outboxdriver.Fence{ID: id, Attempts: one("second attempt after the redrive", 4, 2, false).Attempts}
	retry("second attempt after the redrive", f4)
	one("claim past max attempts after the redrive", 4, 2, true)
	if e.count(t, idIs(id)+" AND state = 'dead' AND attempts = 4") != 1 {
		t.Error("not dead-lettered again after MaxAttempts attempts since the redrive")
	}
}

// redriveAttempts: through a relay, a redriven message's handler sees
// Delivery.Attempt 1, 2... again, MaxAttempts of them, while the attempts
// column keeps counting every claim.
func redriveAttempts(t *testing.T, e *env) {
	var mu sync.Mutex
	var seen []int
	var healed bool
	e.relay(t, outbox.RelayConfig{MaxAttempts: 2}, map[string]outbox.Handler{"t": func(ctx context.Context, d outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, d.Attempt)
		if healed {
			return nil
		}
		return errors.New("broken")
	}})
	id := e.publish(t, outbox.Message{Topic: "t"})[0].ID
	ctx := context.Background()
	for round, attempts := range []int{2, 4} {
		waitFor(t, "dead", func() bool { return e.count(t, idIs(id)+" AND state = 'dead'") == 1 })
		if e.count(t, idIs(id)+fmt.Sprintf(" AND attempts = %d", attempts)) != 1 {
			t.Fatalf("round %d: dead without %d attempts in all", round, attempts)
		}
		if round == 1 {
			mu.Lock()
			healed = true
			mu.Unlock()
		}
		if n, err := e.ob.Redrive(ctx, e.DB, ""); err != nil || n != 1 {
			t.Fatalf("redrive: %d, %v", n, err)
		}
	}
	waitFor(t, "delivered after the second redrive", func() bool { return e.count(t, "") == 0 })
	mu.Lock()
	defer mu.Unlock()
	if want := []int{1, 2, 1, 2, 1}; !slices.Equal(seen, want) {
		t.Errorf("handler saw attempts %v, want %v", seen, want)
	}
}
