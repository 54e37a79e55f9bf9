package dialecttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxtest"
)

// runDrainKinds proves outboxtest.Drain and outboxtest.Published on an
// Outbox with and without OrderByKey, with a Handler and with a
// BatchHandler: Drain returns once nothing is due and reports every
// attempt with what the relay wrote (the runs of ordered keys included);
// on an ordered Outbox, the messages behind a retried or halted head are
// neither attempted nor reported, and stay blocked.
func runDrainKinds(t *testing.T, h Harness) {
	for _, ordered := range []bool{false, true} {
		name := "Unordered"
		if ordered {
			name = "Ordered"
		}
		t.Run(name, func(t *testing.T) {
			runCases(t, h, outbox.Config{OrderByKey: ordered}, []envCase{
				{"Drain", func(t *testing.T, e *env) { drainKeys(t, e, false) }},
				{"DrainBatch", func(t *testing.T, e *env) { drainKeys(t, e, true) }},
				{"Published", publishedKeys},
			})
		})
	}
}

// drainKeys drains keys whose messages succeed, retry at once, retry
// later and dead-letter, through a Handler or (batch) a BatchHandler; the
// relay's Observer is told of one outcome written per message attempted,
// an ordered run's included.
func drainKeys(t *testing.T, e *env, batch bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var msgs []outbox.Message
	for _, m := range []string{"k/1", "k/2", "k/3", "again/1", "again/2", "flaky/1", "flaky/2", "dead/1", "dead/2", "/1"} {
		key, _, _ := strings.Cut(m, "/")
		msgs = append(msgs, outbox.Message{Topic: "drain", Key: key, Payload: outboxtest.JSON(m)})
	}
	e.publish(t, msgs...)

	var mu sync.Mutex
	calls := map[string]int{}
	outcome := func(d outbox.Delivery) error {
		var m string
		if err := json.Unmarshal(d.Payload, &m); err != nil {
			return err
		}
		mu.Lock()
		calls[m]++
		n := calls[m]
		mu.Unlock()
		switch m {
		case "again/1":
			if n == 1 {
				return outbox.RetryAfter(0, errors.New("busy"))
			}
		case "flaky/1":
			return errors.New("smtp: 451 try later")
		case "dead/1":
			return outbox.DeadLetter(errors.New("poison"))
		}
		return nil
	}
	register := func(r *outbox.Relay) error {
		if batch {
			return r.HandleBatch("drain", func(ctx context.Context, ds []outbox.Delivery) []error {
				errs := make([]error, len(ds))
				for i := range ds {
					errs[i] = outcome(ds[i])
				}
				return errs
			})
		}
		return r.Handle("drain", func(ctx context.Context, d outbox.Delivery) error { return outcome(d) })
	}
	obs := &settleCount{outcomeLog: outcomeLog{by: map[outbox.ID][]outbox.Outcome{}}}
	cfg := &outbox.RelayConfig{
		RetryBase: time.Minute, RetryCap: time.Minute, RetryJitter: new(0.0), // flaky/1 is not due again soon
		Logger:   slog.New(slog.NewTextHandler(t.Output(), nil)),
		Observer: obs,
	}
	attempts, err := outboxtest.Drain(ctx, e.ob, e.DB, cfg, register)
	if err != nil {
		t.Fatalf("drain: %v (%d attempts reported)", err, len(attempts))
	}
	var got []string
	for _, a := range attempts {
		got = append(got, strings.TrimSpace(fmt.Sprintf("%s#%d %s %s", a.Payload, a.Attempt, a.Outcome, a.Error)))
	}
	want := []string{
		`"k/1"#1 delivered`,
		`"k/2"#1 delivered`,
		`"k/3"#1 delivered`,
		`"again/1"#1 retried retry requested: busy`,
		`"again/1"#2 delivered`,
		`"again/2"#1 delivered`,
		`"flaky/1"#1 retried smtp: 451 try later`,
		`"flaky/2"#1 delivered`,
		`"dead/1"#1 dead-lettered dead-lettered: poison`,
		`"dead/2"#1 delivered`,
		`"/1"#1 delivered`,
	}
	left := map[string]int{"state = 'pending'": 1, "state = 'dead'": 1, "": 2}
	if e.ob.OrdersByKey() {
		// Behind a retried head, and behind a dead head that halts its
		// key: not attempted, blocked.
		want = slices.DeleteFunc(want, func(a string) bool {
			return a == `"flaky/2"#1 delivered` || a == `"dead/2"#1 delivered`
		})
		left["state = 'blocked'"], left[""] = 2, 4
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("attempts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for where, n := range left {
		if c := e.count(t, where); c != n {
			t.Errorf("%d rows where %q, want %d", c, where, n)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.count != len(want) || obs.applied != len(want) {
		t.Errorf("observer: %d outcomes written, %d applied, want %d: one per message attempted", obs.count, obs.applied, len(want))
	}
}

// settleCount is a RelayObserver that adds up the outcomes written.
type settleCount struct {
	outcomeLog
	count, applied int // under outcomeLog.mu
}

func (o *settleCount) SettleEnd(_ context.Context, e outbox.SettleEvent) {
	if e.Err != nil {
		return // written again
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.count += e.Count
	o.applied += e.Applied
}

// publishedKeys publishes several messages of two keys, one with a
// message of another topic among them, and checks that Published returns
// those of its topic in publish order; on an ordered Outbox, but those
// behind the other topic's message in its key, which wait for it.
func publishedKeys(t *testing.T, e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var msgs []outbox.Message
	for _, m := range []string{"B/1", "B/2", "B/3", "C/1", "audit C/x", "C/2", "B/4"} {
		topic, m, ok := strings.Cut(m, " ")
		if !ok {
			topic, m = "order.placed", topic
		}
		key, _, _ := strings.Cut(m, "/")
		msgs = append(msgs, outbox.Message{Topic: topic, Key: key, Payload: outboxtest.JSON(m)})
	}
	e.publish(t, msgs...)
	ds, err := outboxtest.Published(ctx, e.ob, e.DB, "order.placed")
	if err != nil {
		t.Fatalf("published: %v (%d messages)", err, len(ds))
	}
	var got []string
	for _, d := range ds {
		var m string
		if err := json.Unmarshal(d.Payload, &m); err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
	}
	want, left := "B/1 B/2 B/3 C/1 C/2 B/4", 1 // the audit message
	if e.ob.OrdersByKey() {
		want, left = "B/1 B/2 B/3 C/1 B/4", 2 // and C/2, behind it
	}
	if strings.Join(got, " ") != want {
		t.Fatalf("published %q, want %q", got, want)
	}
	if n := e.count(t, ""); n != left {
		t.Errorf("%d rows left, want %d", n, left)
	}
}
