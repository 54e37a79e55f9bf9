package dialecttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds the regression cases of issue 31's findings that need
// more than a pair of operations, and the liveness of a key held open.

// orderedRedriveRacesDeath (finding 2): a redrive that has begun, a message
// of another key that dies after it began, and a settle of that key racing
// the redrive's write. The redrive parks after each of its statements in
// turn; meanwhile J's head dies under Continue and J's next message is
// claimed; then the redrive goes on to its next statement and parks again
// while J's next message is settled. Before the fix (PostgreSQL), the
// redrive re-selected dead messages on a new snapshot and redrove J's
// without its key lock; the settle, not seeing it, promoted nothing: J was
// left with a blocked message and no head, for good.
func orderedRedriveRacesDeath(t *testing.T, e *env) {
	skipOneWriter(t, e)
	for n := 1; ; n++ {
		r, ok := startRedriveRace(t, e, n)
		if !ok {
			return
		}
		g, db, j, redrive := r.g, r.db, r.j, r.redrive
		// The redrive goes on to its next statement and parks there
		// (or ends) while J's next is settled.
		next := g.ParkAfter("R", n+1)
		done := make(chan error, 1)
		go func() { done <- redrive() }()
		ended := false
		select {
		case <-next.reached:
		case err := <-done:
			ended = true
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the redrive did not reach statement %d", n+1)
		}
		f := outboxdriver.Fence{ID: j[1], Attempts: 1}
		_, errB, _ := runBlocked(g, "S", 300*time.Millisecond, func(ctx context.Context) error {
			_, busy, err := e.od(t).SettleRuns(ctx, db, e.ob.Table(), outboxdriver.SettleParams{}, []outboxdriver.RunOutcome{{Head: f, Key: "J", Done: []outbox.ID{j[1]}}})
			if err == nil && len(busy) > 0 {
				err = fmt.Errorf("%w %v", errKeyBusy, busy)
			}
			return err
		}, func() error {
			next.Resume()
			if ended {
				return nil
			}
			return <-done
		})
		switch {
		case errB == nil:
		case errors.Is(errB, errKeyBusy) || retryable(errB):
			// The redrive held J's key, or the settle lost a deadlock:
			// write it again, as a relay would.
			e.settleRuns(t, outboxdriver.RunOutcome{Head: f, Key: "J", Done: []outbox.ID{j[1]}})
		default:
			t.Fatalf("settle beside the redrive parked after statement %d: %v", n, errB)
		}
		name := fmt.Sprintf("redrive parked after statement %d", n)
		checkInvariants(t, e, name, nil)
		if t.Failed() {
			return
		}
	}
}

// errKeyBusy: a settle that found its key held, to be written again.
var errKeyBusy = errors.New("busy")

// orderedPlainRedrive (finding 4): Outbox.Redrive on an Outbox built
// without OrderByKey redrives the dead ordered messages of the table as an
// ordered Outbox (and Act) do: a message dead under Continue re-enters its
// key behind the key's head, never as a second head. Before the fix it was
// made pending beside the head, and one claim took both.
func orderedPlainRedrive(t *testing.T, e *env) {
	plain, err := outbox.New(e.ob.Dialect(), outbox.Config{Table: e.Table})
	if err != nil {
		t.Fatal(err)
	}
	redrive := func(how string) {
		t.Helper()
		var n int64
		if how == "Redrive" {
			n, err = plain.Redrive(context.Background(), e.DB, "")
		} else {
			n, err = plain.Act(context.Background(), e.DB, outbox.ActRedrive, outbox.Filter{States: []outbox.State{outbox.StateDead}}, quietAct)
		}
		if err != nil || n != 1 {
			t.Fatalf("%s: %d, %v", how, n, err)
		}
	}
	for _, how := range []string{"Redrive", "Act"} {
		// Dead under Continue: re-enters after the key's head (I5).
		resetTables(t, e)
		k := resIDs(e.publish(t, outbox.Message{Topic: topicX, Key: "K"}, outbox.Message{Topic: topicX, Key: "K"}))
		e.settleHead(t, k[0], "K", outboxdriver.Settlement{Kind: outboxdriver.SettleDead, Error: "x"}, false)
		redrive(how)
		if got := e.states(t, k...); got != "blocked pending" {
			t.Errorf("%s without OrderByKey: states %q, want the redriven message behind the key's head", how, got)
		}
		if s0, s1 := e.keySeq(t, k[0]), e.keySeq(t, k[1]); s0 <= s1 {
			t.Errorf("%s without OrderByKey: I5: the redriven message at key_seq %d, not after the head's %d", how, s0, s1)
		}
		checkInvariants(t, e, how, nil)
		if cs := e.claimOrdered(t, 10, 0, time.Minute); len(cs) != 1 || cs[0].ID != k[1] {
			t.Errorf("%s: claimed %v, want only the key's head", how, cs)
		}
		// A halted head: its key's head again, at its own place.
		resetTables(t, e)
		k = resIDs(e.publish(t, outbox.Message{Topic: topicX, Key: "K"}, outbox.Message{Topic: topicX, Key: "K"}))
		e.settleHead(t, k[0], "K", outboxdriver.Settlement{Kind: outboxdriver.SettleDead, Error: "x"}, true)
		redrive(how)
		if got := e.states(t, k...); got != "pending blocked" {
			t.Errorf("%s without OrderByKey: halted head redriven: states %q, want it the key's head again", how, got)
		}
		if s0, s1 := e.keySeq(t, k[0]), e.keySeq(t, k[1]); s0 >= s1 {
			t.Errorf("%s without OrderByKey: I5: the redriven halted head at key_seq %d, not before %d", how, s0, s1)
		}
		checkInvariants(t, e, how+" (halted)", nil)
		if cs := e.claimOrdered(t, 10, 0, time.Minute); len(cs) != 1 || cs[0].ID != k[0] {
			t.Errorf("%s: claimed %v, want the redriven head", how, cs)
		}
	}
}

// keySeq returns the key_seq of message id.
func (e *env) keySeq(t *testing.T, id outbox.ID) int64 {
	t.Helper()
	rows, err := e.DB.QueryDB(context.Background(), `SELECT key_seq FROM `+e.Table+` WHERE `+idIs(id))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var s int64
	if !rows.Next() {
		t.Fatalf("message %s not found", id)
	}
	if err := rows.Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// orderedRedrivePlace (I5, finding 5): where a redriven message re-enters
// its key depends on the key's messages and the redrive, not on the run
// length the relay claims. Key K: m1 dies under Continue, m2 becomes the
// head and is claimed (with its run), m1 is redriven, then the key is
// drained: with runs of 1 and of 10, the order is m2 m3 m4 m1 (m1 after
// every message published before the redrive). A halted head redriven is
// its key's head again, delivered before the messages behind it. Before
// the fix, runs of 1 gave m2 m3 m1 m4 and runs of 10 m2 m3 m4 m1.
func orderedRedrivePlace(t *testing.T, e *env) {
	for _, budget := range []int{1, 10} {
		resetTables(t, e)
		m := resIDs(e.publish(t, outbox.Message{Topic: topicX, Key: "K"}, outbox.Message{Topic: topicX, Key: "K"},
			outbox.Message{Topic: topicX, Key: "K"}, outbox.Message{Topic: topicX, Key: "K"}))
		e.settleHead(t, m[0], "K", outboxdriver.Settlement{Kind: outboxdriver.SettleDead, Error: "x"}, false)
		cs := e.claimOrdered(t, 10, budget, time.Minute)
		if len(cs) != 1 || cs[0].ID != m[1] {
			t.Fatalf("run budget %d: claimed %v, want m2", budget, cs)
		}
		if n, err := e.ob.Redrive(context.Background(), e.DB, ""); err != nil || n != 1 {
			t.Fatalf("redrive: %d, %v", n, err)
		}
		order := drainOrder(t, e, budget, cs)
		want := []outbox.ID{m[1], m[2], m[3], m[0]}
		if !slices.Equal(order, want) {
			t.Errorf("run budget %d: delivered %v, want m2 m3 m4 m1 %v", budget, order, want)
		}
	}
	// A halted head, redriven, is delivered first.
	resetTables(t, e)
	m := resIDs(e.publish(t, outbox.Message{Topic: topicX, Key: "K"}, outbox.Message{Topic: topicX, Key: "K"}))
	e.settleHead(t, m[0], "K", outboxdriver.Settlement{Kind: outboxdriver.SettleDead, Error: "x"}, true)
	if n, err := e.ob.Redrive(context.Background(), e.DB, ""); err != nil || n != 1 {
		t.Fatalf("redrive of the halted head: %d, %v", n, err)
	}
	if order := drainOrder(t, e, 10, nil); !slices.Equal(order, m) {
		t.Errorf("halted head redriven: delivered %v, want %v", order, m)
	}
}

// drainOrder settles claimed (all done), then claims with run budget
// budget and settles until nothing is due, and returns the ids in the
// order they were delivered.
func drainOrder(t *testing.T, e *env, budget int, claimed []outboxdriver.Claimed) []outbox.ID {
	t.Helper()
	var order []outbox.ID
	for round := 0; round < 20; round++ {
		if round > 0 {
			claimed = e.claimOrdered(t, 10, budget, time.Minute)
		}
		if len(claimed) == 0 && round > 0 {
			return order
		}
		var runs []outboxdriver.RunOutcome
		for _, c := range claimed {
			ids := []outbox.ID{c.ID}
			for _, r := range c.Run {
				ids = append(ids, r.ID)
			}
			order = append(order, ids...)
			runs = append(runs, outboxdriver.RunOutcome{Head: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}, Key: c.Key, Done: ids})
		}
		if len(runs) > 0 {
			e.settleRuns(t, runs...)
		}
	}
	t.Fatal("the key did not drain")
	return nil
}

// orderedHeldKeyLiveness (I6, finding 3): while a business transaction
// that published for key k stays open, a relay delivers and settles the
// other keys' messages as usual, none of them twice, and Run returns
// within ShutdownGrace + 1s with that transaction still open (held 6s;
// 30s under OUTBOX_RELIABILITY=long). Before the
// fix, the settle batch that held a run of k waited on k's key row until
// CommandTimeout, was put back and tried again: another key's message of
// that batch was delivered again after every lease, and shutdown took
// about 5 x CommandTimeout. SQLite, with one writer at a time, cannot
// keep a transaction open beside a relay: not run there.
func orderedHeldKeyLiveness(t *testing.T, e *env) {
	if e.ob.Dialect().Name() == "sqlite" {
		t.Skip("SQLite has one writer at a time: an open write transaction holds every key (docs/internals.md, I6)")
	}
	ctx := context.Background()
	e.publish(t, outbox.Message{Topic: topicX, Key: "k"})
	var mu sync.Mutex
	seen := map[outbox.ID]int{}
	ofK := map[outbox.ID]bool{} // k's messages: delivered again once their lease lapses while k is held
	others := 0
	cfg := outbox.RelayConfig{Lease: 3 * time.Second, CommandTimeout: 2 * time.Second, ShutdownGrace: time.Second, PollInterval: 50 * time.Millisecond}
	r, err := e.ob.Relay(e.DB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// k's head is held in its handler until k's transaction is open, so
	// that its run's settle meets the held key row.
	release := make(chan struct{})
	if err := r.Handle(topicX, func(_ context.Context, d outbox.Delivery) error {
		mu.Lock()
		seen[d.ID]++
		if d.Key == "k" {
			ofK[d.ID] = true
		}
		mu.Unlock()
		if d.Key == "k" {
			<-release
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- r.Run(runCtx) }()
	waitFor(t, "k's first message delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == 1
	})
	// Hold k open with a second message, then publish on other keys for
	// longer than the lease and CommandTimeout together.
	held := e.Begin(t)
	if _, err := e.ob.Publish(ctx, held.Tx, outbox.Message{Topic: topicX, Key: "k"}); err != nil {
		t.Fatal(err)
	}
	defer held.Rollback()
	close(release)
	hold := 6 * time.Second
	if os.Getenv("OUTBOX_RELIABILITY") == "long" {
		hold = 30 * time.Second // the figure
	}
	deadline := time.Now().Add(hold)
	for i := 0; time.Now().Before(deadline); i++ {
		e.publish(t, outbox.Message{Topic: topicX, Key: fmt.Sprintf("o%d", i%20)})
		others++
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(t, "the other keys' messages delivered and settled", func() bool {
		return e.count(t, "message_key <> 'k'") == 0
	})
	mu.Lock()
	for id, n := range seen {
		if n > 1 && !ofK[id] {
			t.Errorf("message %s of another key delivered %d times while key k was held", id, n)
		}
	}
	delivered := len(seen)
	mu.Unlock()
	if delivered < others+1 {
		t.Errorf("%d of %d messages delivered", delivered, others+1)
	}
	start := time.Now()
	cancel()
	select {
	case err := <-ran:
		if err != nil && err != context.Canceled {
			t.Error(err)
		}
	case <-time.After(cfg.ShutdownGrace + time.Second):
		t.Fatalf("Run did not return within ShutdownGrace + 1s with k's transaction open")
	}
	t.Logf("Run returned %v after its context ended", time.Since(start))
}

// orderedRedriveLockRace (finding 2): a message that dies while a redrive
// is between its statements, then a settle of that message's key that has
// locked the key row when the redrive goes on. The redrive parks after
// each of its statements in turn; meanwhile J's head dies under Continue
// and J's next message is claimed; a settle of J's next locks J's key row
// and parks; the redrive resumes (if it waits 300ms, for J's key, the
// settle resumes too). Before the fix (PostgreSQL), the redrive locked the
// keys it saw in its first statement and re-selected dead messages on a
// new snapshot in its second: it redrove J's head, without J's key lock,
// behind J's next, which it saw processing; the settle, not seeing the
// redriven message, promoted nothing: J was left with one blocked message
// and no head, for good. OrderedRedriveRacesDeath lets the redrive's
// second statement run before the settle begins, and so does not catch it.
func orderedRedriveLockRace(t *testing.T, e *env) {
	skipOneWriter(t, e)
	for n := 1; ; n++ {
		r, ok := startRedriveRace(t, e, n)
		if !ok {
			return
		}
		g, db, a, j := r.g, r.db, r.a, r.j
		name := fmt.Sprintf("redrive parked after statement %d", n)
		// A settle of J's next locks J's key row (its first statement) and
		// parks there, holding it.
		f := outboxdriver.Fence{ID: j[1], Attempts: r.next.Attempts}
		run := outboxdriver.RunOutcome{Head: f, Key: "J", Done: []outbox.ID{j[1]}}
		settle, ok := runParked(t, g, "S", 1, func(ctx context.Context) error {
			_, busy, err := e.od(t).SettleRuns(ctx, db, e.ob.Table(), outboxdriver.SettleParams{}, []outboxdriver.RunOutcome{run})
			if err == nil && len(busy) > 0 {
				err = fmt.Errorf("busy %v", busy)
			}
			return err
		})
		if !ok {
			t.Fatalf("%s: the settle sent no statement", name)
		}
		// The redrive goes on; if it waits (for J's key row), the settle
		// goes on too.
		errS, errR, waited := runBlocked(g, "R-resumed", 300*time.Millisecond, func(context.Context) error { return r.redrive() }, settle)
		if errR != nil {
			if !retryable(errR) {
				t.Fatalf("%s: redrive: %v", name, errR)
			}
			t.Logf("%s: redrive: %v (rolled back; the next redrive below takes J's head)", name, errR)
		}
		if errS != nil {
			if !retryable(errS) {
				t.Fatalf("%s: settle: %v", name, errS)
			}
			// Busy or a lock conflict: nothing written; write it again, as
			// a relay would.
			e.settleRuns(t, run)
		}
		t.Logf("%s: the redrive waited for the settle: %v", name, waited)
		checkInvariants(t, e, name, nil)
		if t.Failed() {
			return
		}
		// Everything is delivered: what is still dead (J's head, when it
		// died after the redrive picked its messages) once redriven again.
		order := drainOrder(t, e, 10, nil)
		if _, err := e.ob.Redrive(context.Background(), e.DB, ""); err != nil {
			t.Fatal(err)
		}
		order = append(order, drainOrder(t, e, 10, nil)...)
		slices.SortFunc(order, func(x, y outbox.ID) int { return strings.Compare(x.String(), y.String()) })
		want := []outbox.ID{a[0], j[0]}
		slices.SortFunc(want, func(x, y outbox.ID) int { return strings.Compare(x.String(), y.String()) })
		if !slices.Equal(order, want) {
			t.Errorf("%s: drained %v, want A's and J's heads %v, once each", name, order, want)
		}
		if left := e.count(t, "1 = 1"); left != 0 {
			t.Errorf("%s: %d messages left after the drain", name, left)
		}
		if t.Failed() {
			return
		}
	}
}

// skipOneWriter skips the redrive races on SQLite.
func skipOneWriter(t *testing.T, e *env) {
	if e.ob.Dialect().Name() == "sqlite" {
		t.Skip("SQLite has one writer at a time: a redrive parked in its transaction holds every other write, so the race needs a second writer that cannot exist there")
	}
}

// redriveRace is the start of a redrive race (finding 2) on clean tables:
// key A's only message dead under Continue, a redrive (of every topic,
// through the Gate g) parked after its statement n, then key J's head
// dead under Continue and J's next claimed (next).
type redriveRace struct {
	g       *Gate
	db      outbox.DB
	a, j    []outbox.ID
	next    outboxdriver.Claimed
	redrive func() error // resumes the redrive and waits for its error
}

// startRedriveRace sets up a redriveRace, or reports false when the
// redrive ended before its statement n (failing t when n is 1).
func startRedriveRace(t *testing.T, e *env, n int) (*redriveRace, bool) {
	t.Helper()
	resetTables(t, e)
	r := &redriveRace{g: NewGate(e.DB)}
	r.db = r.g.DB()
	msg := func(k string) outbox.Message { return outbox.Message{Topic: topicX, Key: k} }
	r.a = resIDs(e.publish(t, msg("A")))
	e.settleHead(t, r.a[0], "A", outboxdriver.Settlement{Kind: outboxdriver.SettleDead, Error: "x"}, false)
	r.j = resIDs(e.publish(t, msg("J"), msg("J")))
	redrive, ok := runParked(t, r.g, "R", n, func(ctx context.Context) error {
		_, err := e.ob.Redrive(ctx, r.db, "")
		return err
	})
	if !ok {
		if n == 1 {
			t.Fatal("the redrive sent no statement")
		}
		return nil, false
	}
	r.redrive = redrive
	// J's head dies after the redrive began; J's next is claimed.
	e.settleHead(t, r.j[0], "J", outboxdriver.Settlement{Kind: outboxdriver.SettleDead, Error: "x"}, false)
	cs := e.claimOrdered(t, 10, 0, time.Minute)
	if len(cs) != 1 || cs[0].ID != r.j[1] {
		t.Fatalf("statement %d: claimed %v, want J's next", n, cs)
	}
	r.next = cs[0]
	return r, true
}
