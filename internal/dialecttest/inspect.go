package dialecttest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/internal/opfmt"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// inspectCases are the conformance cases of the inspection API (issue 17):
// Outbox.List, Count, Get and Act on every dialect.
var inspectCases = []envCase{
	{"InspectFilters", inspectFilters},
	{"InspectPagesUnderInserts", inspectPages},
	{"InspectActions", inspectActions},
	{"InspectBulkBatches", inspectBulk},
	{"InspectRedriveRacesRelay", inspectRedriveRace},
}

// actOpts logs actions to the test's output.
func actOpts(t *testing.T) *outbox.ActOptions {
	return &outbox.ActOptions{Actor: "test", Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
}

// kill claims up to n due messages of topic and dead-letters them with
// errText as their last error; it returns their ids.
func kill(t *testing.T, e *env, topic string, n int, errText string) []outbox.ID {
	t.Helper()
	cs := claim(t, e, outboxdriver.ClaimParams{Topics: []string{topic}, Limit: n, Lease: time.Minute, MaxAttempts: 5})
	s := make([]outboxdriver.Settlement, len(cs))
	ids := make([]outbox.ID, len(cs))
	for i, c := range cs {
		s[i] = outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}, Kind: outboxdriver.SettleDead, Error: errText}
		ids[i] = c.ID
	}
	if applied, err := e.rd.Settle(context.Background(), e.DB, e.ob.Table(), outboxdriver.SettleParams{}, s); err != nil || len(applied) != len(s) {
		t.Fatalf("dead-letter %d: applied %d, %v", len(s), len(applied), err)
	}
	return ids
}

func listIDs(t *testing.T, e *env, f outbox.Filter) []outbox.ID {
	t.Helper()
	var ids []outbox.ID
	for {
		p, err := e.ob.List(context.Background(), e.DB, f, 7)
		if err != nil {
			t.Fatalf("list %s: %v", opfmt.Filter(f), err)
		}
		for _, m := range p.Messages {
			ids = append(ids, m.ID)
		}
		if p.Next.IsZero() {
			return ids
		}
		f.After = p.Next
	}
}

func inspectFilters(t *testing.T, e *env) {
	ctx := context.Background()
	before := time.Now().Add(-time.Hour)
	a := e.publish(t, outbox.Message{Topic: "a", Key: "k1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"h": "v"}},
		outbox.Message{Topic: "a", Key: "k2"}, outbox.Message{Topic: "a", Key: "k1"})
	e.publish(t, outbox.Message{Topic: "b", Key: "k1"}, outbox.Message{Topic: "b"})
	dead := kill(t, e, "a", 2, "boom: connection refused")
	deadB := kill(t, e, "b", 1, "other failure")
	e.publish(t, outbox.Message{Topic: "c", Delay: time.Hour})

	check := func(f outbox.Filter, want int) []outbox.ID {
		t.Helper()
		ids := listIDs(t, e, f)
		if len(ids) != want {
			t.Errorf("list %s: %d messages, want %d", opfmt.Filter(f), len(ids), want)
		}
		if !slices.IsSortedFunc(ids, func(x, y outbox.ID) int { return strings.Compare(x.String(), y.String()) }) {
			t.Errorf("list %s: not in id order", opfmt.Filter(f))
		}
		if n, err := e.ob.Count(ctx, e.DB, f); err != nil || n != int64(want) {
			t.Errorf("count %s: %d, %v, want %d", opfmt.Filter(f), n, err, want)
		}
		return ids
	}
	check(outbox.Filter{}, 6)
	if got := check(outbox.Filter{States: []outbox.State{outbox.StateDead}}, 3); !slices.Equal(got, append(slices.Clone(dead), deadB...)) {
		t.Errorf("dead: %v, want %v then %v", got, dead, deadB)
	}
	check(outbox.Filter{States: []outbox.State{outbox.StatePending}}, 3)
	check(outbox.Filter{States: []outbox.State{outbox.StatePending, outbox.StateDead}}, 6)
	check(outbox.Filter{States: []outbox.State{outbox.StateDead}, Topic: "a"}, 2)
	check(outbox.Filter{Topic: "b", Key: "k1"}, 1)
	check(outbox.Filter{Key: "k1"}, 3)
	check(outbox.Filter{Topic: "a "}, 0) // byte for byte, trailing spaces count
	check(outbox.Filter{ErrorContains: "refused"}, 2)
	check(outbox.Filter{ErrorContains: "REFUSED"}, 0) // case-sensitive
	check(outbox.Filter{ErrorContains: "%"}, 0)       // no pattern characters
	check(outbox.Filter{IDs: []outbox.ID{a[0].ID, deadB[0], outbox.NewID()}}, 2)
	check(outbox.Filter{CreatedFrom: before}, 6)
	check(outbox.Filter{CreatedTo: before}, 0)
	check(outbox.Filter{SettledFrom: before}, 3) // only settled (dead) messages
	check(outbox.Filter{SettledFrom: before, SettledTo: time.Now().Add(time.Hour)}, 3)
	check(outbox.Filter{SettledFrom: time.Now().Add(time.Hour)}, 0)

	m, err := e.ob.Get(ctx, e.DB, dead[0])
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != dead[0] || m.Topic != "a" || m.State != outbox.StateDead || m.Attempts != 1 || m.LastError != "boom: connection refused" ||
		m.SettledAt.IsZero() || m.CreatedAt.IsZero() || time.Since(m.CreatedAt) > time.Minute || time.Since(m.CreatedAt) < -time.Minute {
		t.Errorf("get: %+v", m)
	}
	if dead[0] == a[0].ID && (string(m.Payload) != `{"n":1}` && string(m.Payload) != `{"n": 1}` || !strings.Contains(string(m.Headers), `"h"`) || m.Key != "k1") {
		t.Errorf("get: payload %s, headers %s, key %q", m.Payload, m.Headers, m.Key)
	}
	if p, err := e.ob.List(ctx, e.DB, outbox.Filter{IDs: []outbox.ID{a[0].ID}}, 0); err != nil || len(p.Messages) != 1 || p.Messages[0].Payload != nil {
		t.Errorf("list carries payloads: %+v, %v", p, err)
	}
	if _, err := e.ob.Get(ctx, e.DB, outbox.NewID()); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("get of an unknown id: %v, want ErrNotFound", err)
	}
	// A page of exactly the remaining messages says it is the last.
	if p, err := e.ob.List(ctx, e.DB, outbox.Filter{}, 6); err != nil || len(p.Messages) != 6 || !p.Next.IsZero() {
		t.Errorf("last page: %d messages, next %v, %v", len(p.Messages), p.Next, err)
	}
	if p, err := e.ob.List(ctx, e.DB, outbox.Filter{}, 5); err != nil || len(p.Messages) != 5 || p.Next != p.Messages[4].ID {
		t.Errorf("first of two pages: %d messages, next %v, %v", len(p.Messages), p.Next, err)
	}
}

// inspectPages: paging through a table while others publish lists every
// message that was there before, once, in order.
func inspectPages(t *testing.T, e *env) {
	msgs := make([]outbox.Message, 95)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "p"}
	}
	res := e.publish(t, msgs...)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			e.publish(t, outbox.Message{Topic: "p"}, outbox.Message{Topic: "p"})
		}
	})
	seen := map[outbox.ID]int{}
	var last outbox.ID
	f := outbox.Filter{Topic: "p"}
	for range 200 {
		p, err := e.ob.List(context.Background(), e.DB, f, 10)
		if err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatal(err)
		}
		for _, m := range p.Messages {
			if m.ID.String() <= last.String() {
				t.Errorf("page after %v returned %v: out of order", last, m.ID)
			}
			last = m.ID
			seen[m.ID]++
		}
		if p.Next.IsZero() || seen[res[len(res)-1].ID] > 0 {
			break
		}
		f.After = p.Next
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	for _, r := range res {
		if seen[r.ID] != 1 {
			t.Errorf("message %v listed %d times, want once", r.ID, seen[r.ID])
		}
	}
}

func inspectActions(t *testing.T, e *env) {
	ctx := context.Background()
	log := actOpts(t)
	e.publish(t, outbox.Message{Topic: "x"}, outbox.Message{Topic: "x"}, outbox.Message{Topic: "x"})
	dead := kill(t, e, "x", 3, "bad")
	later := e.publish(t, outbox.Message{Topic: "y", Delay: time.Hour}, outbox.Message{Topic: "y", Delay: time.Hour})
	due := e.publish(t, outbox.Message{Topic: "y"})
	busy := e.publish(t, outbox.Message{Topic: "z"})
	claim(t, e, outboxdriver.ClaimParams{Topics: []string{"z"}, Limit: 1, Lease: time.Minute, MaxAttempts: 5})

	act := func(a outbox.Action, f outbox.Filter, want int64) {
		t.Helper()
		if n, err := e.ob.Act(ctx, e.DB, a, f, log); err != nil || n != want {
			t.Errorf("%s %s: %d, %v, want %d", a, opfmt.Filter(f), n, err, want)
		}
	}
	// Redrive one dead message by id: only that one.
	act(outbox.ActRedrive, outbox.Filter{IDs: []outbox.ID{dead[1]}}, 1)
	if e.count(t, idIs(dead[1])+" AND state = 'pending' AND attempts_base = 1 AND last_error IS NULL AND settled_at IS NULL") != 1 ||
		e.count(t, "state = 'dead'") != 2 {
		t.Error("redrive by id did not revive exactly that message")
	}
	// Redrive of messages that are not dead changes nothing.
	act(outbox.ActRedrive, outbox.Filter{IDs: []outbox.ID{dead[1], due[0].ID, busy[0].ID}}, 0)
	// Retry: only pending messages not yet due.
	act(outbox.ActRetry, outbox.Filter{Topic: "y"}, 2)
	if e.count(t, idIs(later[0].ID)+" AND state = 'pending'") != 1 || len(claim(t, e, outboxdriver.ClaimParams{Topics: []string{"y"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5})) != 3 {
		t.Error("retry did not make the delayed messages due")
	}
	act(outbox.ActRetry, outbox.Filter{Topic: "y"}, 0)
	// Delete never removes a processing message.
	act(outbox.ActDelete, outbox.Filter{Topic: "z"}, 0)
	if e.count(t, idIs(busy[0].ID)) != 1 {
		t.Error("delete removed a processing message")
	}
	act(outbox.ActDelete, outbox.Filter{States: []outbox.State{outbox.StateDead}, ErrorContains: "ba"}, 2)
	if e.count(t, "state = 'dead'") != 0 || e.count(t, "") != 5 {
		t.Errorf("delete of dead messages: %d dead, %d rows left", e.count(t, "state = 'dead'"), e.count(t, ""))
	}

	// Bad input: a typed error, nothing changed.
	for _, c := range []struct {
		a     outbox.Action
		f     outbox.Filter
		field string
	}{
		{outbox.ActDelete, outbox.Filter{}, "Filter"},
		{outbox.Action(9), outbox.Filter{Topic: "x"}, "Action"},
		{outbox.ActRedrive, outbox.Filter{States: []outbox.State{"gone"}}, "States"},
		{outbox.ActRedrive, outbox.Filter{Topic: "x", After: dead[0]}, "After"},
		{outbox.ActDelete, outbox.Filter{Topic: "a\xff"}, "Topic"},
		{outbox.ActDelete, outbox.Filter{Key: strings.Repeat("k", 300)}, "Key"},
		{outbox.ActDelete, outbox.Filter{ErrorContains: "a\x00"}, "ErrorContains"},
		{outbox.ActDelete, outbox.Filter{CreatedFrom: time.Now(), CreatedTo: time.Now().Add(-time.Hour)}, "CreatedFrom"},
		{outbox.ActDelete, outbox.Filter{IDs: []outbox.ID{{}}}, "IDs"},
	} {
		var fe *outbox.FilterError
		if n, err := e.ob.Act(ctx, e.DB, c.a, c.f, log); !errors.As(err, &fe) || fe.Field != c.field || n != 0 || !errors.Is(err, outbox.ErrInvalidFilter) {
			t.Errorf("act %d %s: %d, %v, want a FilterError on %s", c.a, opfmt.Filter(c.f), n, err, c.field)
		}
	}
	if e.count(t, "") != 5 {
		t.Error("a refused action changed rows")
	}
	// Skip needs ordered delivery: a clear error from an Outbox without it.
	if n, err := e.ob.Act(ctx, e.DB, outbox.ActSkip, outbox.Filter{Topic: "x"}, log); !errors.Is(err, outbox.ErrUnsupported) || n != 0 {
		t.Errorf("skip on an Outbox without OrderByKey: %d %v, want ErrUnsupported", n, err)
	}
}

// inspectBulk: a bulk action larger than one batch changes every message,
// and a cancelled one stops between batches with its count so far.
func inspectBulk(t *testing.T, e *env) {
	ctx := context.Background()
	const n = 2300
	msgs := make([]outbox.Message, 1000)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "bulk"}
	}
	for done := 0; done < n; done += len(msgs) {
		e.publish(t, msgs[:min(len(msgs), n-done)]...)
	}
	for e.count(t, "state = 'pending'") > 0 {
		kill(t, e, "bulk", 1000, "x")
	}
	dead := outbox.Filter{States: []outbox.State{outbox.StateDead}, Topic: "bulk"}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if got, err := e.ob.Act(cctx, e.DB, outbox.ActRedrive, dead, actOpts(t)); !errors.Is(err, context.Canceled) || got != 0 {
		t.Errorf("cancelled redrive: %d, %v", got, err)
	}
	if got, err := e.ob.Act(ctx, e.DB, outbox.ActRedrive, dead, actOpts(t)); err != nil || got != n {
		t.Fatalf("redrive of %d dead messages: %d, %v", n, got, err)
	}
	if c, err := e.ob.Count(ctx, e.DB, dead); err != nil || c != 0 || e.count(t, "state = 'pending'") != n {
		t.Errorf("after the bulk redrive: %d dead, %v", c, err)
	}
	if got, err := e.ob.Act(ctx, e.DB, outbox.ActDelete, outbox.Filter{Topic: "bulk"}, actOpts(t)); err != nil || got != n || e.count(t, "") != 0 {
		t.Errorf("bulk delete: %d, %v", got, err)
	}
}

// inspectRedriveRace: bulk redrives by filter, run again and again while a
// relay claims, fails and dead-letters the same messages, only ever revive
// dead ones: a message stays processing while its handler runs, and never
// runs in two handlers at once (a redrive that made a processing message
// pending would let a second claim take it while its handler runs: the
// lease is a minute); once the handler heals every message is delivered.
func inspectRedriveRace(t *testing.T, e *env) {
	const n = 40
	var mu sync.Mutex
	running := map[outbox.ID]bool{}
	var twice, touched []string
	var healed atomic.Bool
	e.relay(t, outbox.RelayConfig{MaxAttempts: 1, Lease: time.Minute, Concurrency: 8}, map[string]outbox.Handler{"race": func(ctx context.Context, d outbox.Delivery) error {
		mu.Lock()
		if running[d.ID] {
			twice = append(twice, d.ID.String())
		}
		running[d.ID] = true
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		// While a handler runs, its message stays processing.
		m, err := e.ob.Get(ctx, e.DB, d.ID)
		mu.Lock()
		if err != nil || m.State != outbox.StateProcessing {
			touched = append(touched, fmt.Sprintf("%s: %s, %v", d.ID, m.State, err))
		}
		delete(running, d.ID)
		mu.Unlock()
		if healed.Load() {
			return nil
		}
		return fmt.Errorf("attempt %d fails", d.Attempt)
	}})
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "race"}
	}
	e.publish(t, msgs...)
	ctx := context.Background()
	// No state in the filter: the action's own fence (state dead) is all
	// that keeps processing messages out.
	f := outbox.Filter{Topic: "race"}
	quiet := &outbox.ActOptions{Logger: slog.New(slog.DiscardHandler)} // hundreds of lines otherwise
	var revived int64
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		got, err := e.ob.Act(ctx, e.DB, outbox.ActRedrive, f, quiet)
		if err != nil {
			t.Fatal(err)
		}
		revived += got
	}
	healed.Store(true)
	waitFor(t, "every message delivered", func() bool {
		if _, err := e.ob.Act(ctx, e.DB, outbox.ActRedrive, f, quiet); err != nil {
			t.Fatal(err)
		}
		return e.count(t, "") == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(twice) > 0 {
		t.Errorf("messages run by two handlers at once (a redrive revived a processing message): %v", twice)
	}
	if len(touched) > 0 {
		t.Errorf("messages changed under their running handlers (a redrive revived a processing message): %v", touched)
	}
	if revived == 0 {
		t.Error("no redrive found a dead message while the relay ran: the race was not exercised")
	}
	t.Logf("%d redrives while the relay ran", revived)
}
