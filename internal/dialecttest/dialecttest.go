// Package dialecttest is the conformance suite every dialect and driver
// pair runs: the same promises, proven on PostgreSQL with lib/pq, with pgx's
// stdlib driver and with native pgx, and on SQLite. A new dialect passes it
// before it ships.
package dialecttest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// Txn is one open business transaction.
type Txn struct {
	Tx       outbox.Tx
	Commit   func() error
	Rollback func() error
}

// Store is a fresh outbox table for one test.
type Store struct {
	// Table is the table's name for outbox.Config.Table.
	Table string
	// DB runs the relay and the operations.
	DB outbox.DB
	// Begin opens a business transaction.
	Begin func(t *testing.T) Txn
	// Count counts the rows of the table matching where (SQL, literals only).
	Count func(t *testing.T, where string) int
	// Inbox is a migrated inbox table for outbox.InboxConfig.Table.
	Inbox string
}

// Harness is one dialect and driver pair.
type Harness struct {
	Dialect outbox.Dialect
	// New returns a fresh, migrated store, cleaned up when t ends.
	New func(t testing.TB) *Store
	// Parallel runs the tests in parallel (not for single-file SQLite
	// databases shared by every test).
	Parallel bool
}

type env struct {
	*Store
	ob *outbox.Outbox
	rd outboxdriver.RelayDialect
	h  Harness // what made it, for cases that need more stores
}

// envCase is one conformance case: a named test on a fresh env.
type envCase struct {
	name string
	f    func(t *testing.T, e *env)
}

// runCases runs each case on a fresh env of h, with an Outbox of cfg
// (its Table set to the env's).
func runCases(t *testing.T, h Harness, cfg outbox.Config, cases []envCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if h.Parallel {
				t.Parallel()
			}
			e := newEnv(t, h)
			if !reflect.DeepEqual(cfg, outbox.Config{}) {
				c := cfg // a copy per case: the cases run in parallel
				c.Table = e.Table
				ob, err := outbox.New(h.Dialect, c)
				if err != nil {
					t.Fatal(err)
				}
				e.ob = ob
			}
			tc.f(t, e)
		})
	}
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	runCases(t, h, outbox.Config{}, append([]envCase{
		{"PublishAtomicity", publishAtomicity},
		{"Dedup", dedup},
		{"Delay", delay},
		{"ClaimLimitsAndDisjointness", claimLimits},
		{"ClaimTakesOnlyItsTopics", claimTopics},
		{"LeaseReclaim", leaseReclaim},
		{"Fencing", fencing},
		{"FencingMixedBatch", fencingMixedBatch},
		{"RetryThenSuccess", retryThenSuccess},
		{"DeadLetterAndRedrive", deadLetterAndRedrive},
		{"RedriveKeepsFence", redriveKeepsFence},
		{"RedriveAttempts", redriveAttempts},
		{"CancelAndInvalidPayload", cancelAndInvalid},
		{"Purge", purge},
		{"PurgeBatches", purgeBatches},
		{"Stats", stats},
		{"KeepDelivered", keepDelivered},
		{"ShutdownDrain", shutdownDrain},
		{"RunChecksTable", runChecksTable},
		{"RelayStats", relayStats},
		{"RetryAtClamped", retryAtClamped},
		{"UnlimitedAttempts", unlimitedAttempts},
	}, append(batchCases, append(inspectCases, inboxCases...)...)...))
	runOrdered(t, h)
	runFanOut(t, h)
}

// newEnv returns a fresh store of h with its Outbox and relay dialect.
func newEnv(t testing.TB, h Harness) *env {
	s := h.New(t)
	ob, err := outbox.New(h.Dialect, outbox.Config{Table: s.Table})
	if err != nil {
		t.Fatal(err)
	}
	rd, ok := h.Dialect.(outboxdriver.RelayDialect)
	if !ok {
		t.Fatalf("%s has no relay", h.Dialect.Name())
	}
	return &env{Store: s, ob: ob, rd: rd, h: h}
}

func (e *env) publish(t *testing.T, msgs ...outbox.Message) []outbox.Result {
	t.Helper()
	tx := e.Begin(t)
	res, err := e.ob.PublishBatch(context.Background(), tx.Tx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return res
}

func (e *env) count(t *testing.T, where string) int { t.Helper(); return e.Count(t, where) }

func idIs(id outbox.ID) string { return fmt.Sprintf("id = '%s'", id) }

func (e *env) relay(t *testing.T, cfg outbox.RelayConfig, handlers map[string]outbox.Handler) (stop func()) {
	t.Helper()
	return e.relayWith(t, cfg, func(r *outbox.Relay) error {
		for topic, h := range handlers {
			if err := r.Handle(topic, h); err != nil {
				return err
			}
		}
		return nil
	})
}

// relayWith runs a relay with cfg (short polls and backoffs by default)
// whose handlers register registers.
func (e *env) relayWith(t *testing.T, cfg outbox.RelayConfig, register func(r *outbox.Relay) error) (stop func()) {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if cfg.RetryBase == 0 {
		cfg.RetryBase, cfg.RetryCap = 5*time.Millisecond, 10*time.Millisecond
	}
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	r, err := e.ob.Relay(e.DB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := register(r); err != nil {
		t.Fatal(err)
	}
	return StartRelay(t, r)
}

// StartRelay runs r until stop is called or t ends; stop waits for Run to
// return and fails t if it returned an error.
func StartRelay(t testing.TB, r *outbox.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Eventually waits until cond holds, failing t after within.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	Eventually(t, 20*time.Second, what, cond)
}

func publishAtomicity(t *testing.T, e *env) {
	ctx := context.Background()
	tx := e.Begin(t)
	res, err := e.ob.Publish(ctx, tx.Tx, outbox.Message{Topic: "t", Key: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	tx = e.Begin(t)
	if _, err := e.ob.Publish(ctx, tx.Tx, outbox.Message{Topic: "t", Key: "dropped"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, idIs(res.ID)+" AND message_key = 'kept'"); n != 1 {
		t.Errorf("committed message stored %d times, want 1", n)
	}
	if n := e.count(t, "message_key = 'dropped'"); n != 0 {
		t.Errorf("rolled-back message stored %d times", n)
	}
	if _, err := e.ob.Publish(ctx, tx.Tx, outbox.Message{Topic: "t"}); !errors.Is(err, outbox.ErrTxDone) {
		t.Errorf("publish on a finished transaction: %v", err)
	}
}

func dedup(t *testing.T, e *env) {
	res := e.publish(t, outbox.Message{Topic: "t", DedupKey: "k"}, outbox.Message{Topic: "t", DedupKey: "k"})
	again := e.publish(t, outbox.Message{Topic: "t", DedupKey: "k"})
	if res[0].Duplicate || !res[1].Duplicate || !again[0].Duplicate {
		t.Errorf("duplicates reported %v %v", res, again)
	}
	if n := e.count(t, "dedup_key = 'k'"); n != 1 {
		t.Errorf("%d rows for one dedup key", n)
	}
}

func claim(t *testing.T, e *env, p outboxdriver.ClaimParams) []outboxdriver.Claimed {
	t.Helper()
	cs, _, err := e.rd.Claim(context.Background(), e.DB, e.ob.Table(), p)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func delay(t *testing.T, e *env) {
	// One batch mixing delayed and immediate rows, each with its own key
	// and payload: a scheduling argument bound in the wrong place would
	// shift the values of the rows after it.
	res := e.publish(t, outbox.Message{Topic: "t", Key: "k0", Payload: []byte(`{"n":0}`), Delay: time.Hour},
		outbox.Message{Topic: "t", Key: "k1", Payload: []byte(`{"n":1}`)},
		outbox.Message{Topic: "t", Key: "k2", Payload: []byte(`{"n":2}`), NotBefore: time.Now().Add(time.Hour)},
		outbox.Message{Topic: "t", Key: "k3", Payload: []byte(`{"n":3}`)})
	cs := claim(t, e, outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: time.Minute, MaxAttempts: 3})
	if len(cs) != 2 || cs[0].ID != res[1].ID || cs[1].ID != res[3].ID {
		t.Fatalf("claimed %v, want only the two immediate messages", cs)
	}
	for i, c := range cs {
		n := 2*i + 1
		if c.Key != fmt.Sprintf("k%d", n) || string(c.Payload) != fmt.Sprintf(`{"n":%d}`, n) && string(c.Payload) != fmt.Sprintf(`{"n": %d}`, n) {
			t.Errorf("claimed key %q payload %s, want k%d and {\"n\":%d}", c.Key, c.Payload, n, n)
		}
	}
}

func claimLimits(t *testing.T, e *env) {
	const n = 300
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "t"}
	}
	e.publish(t, msgs...)
	if got := ClaimConcurrently(t, e.rd, e.DB, e.ob.Table(), "t", 6, 0); got != n {
		t.Errorf("%d claimed, want %d", got, n)
	}
}

// ClaimConcurrently runs claimers goroutines that each claim due messages
// of topic, with limits from 1 to 17, rounds times (until a claim comes
// back empty when rounds is 0). It fails t if a claim takes more than its
// limit, a message of another topic or one not at its first attempt, or a
// message another claim took, and returns how many messages were claimed.
func ClaimConcurrently(t testing.TB, rd outboxdriver.RelayDialect, db outbox.DB, table outbox.Table, topic string, claimers, rounds int) int {
	t.Helper()
	return ClaimTopicsConcurrently(t, rd, db, table, []string{topic}, claimers, rounds)
}

// ClaimTopicsConcurrently is ClaimConcurrently for claims of several
// topics at once: every claim takes topics, and every row claimed must be
// of one of them.
func ClaimTopicsConcurrently(t testing.TB, rd outboxdriver.RelayDialect, db outbox.DB, table outbox.Table, topics []string, claimers, rounds int) int {
	t.Helper()
	var mu sync.Mutex
	seen := map[outbox.ID]bool{}
	var wg sync.WaitGroup
	for w := range claimers {
		wg.Go(func() {
			for i := 0; rounds == 0 || i < rounds; i++ {
				limit := 1 + (w*7+i)%17
				cs, _, err := rd.Claim(context.Background(), db, table, outboxdriver.ClaimParams{Topics: topics, Limit: limit, Lease: time.Minute, MaxAttempts: 5})
				if err != nil {
					t.Error(err)
					return
				}
				if len(cs) > limit {
					t.Errorf("claim with limit %d took %d", limit, len(cs))
				}
				if len(cs) == 0 && rounds == 0 {
					return
				}
				mu.Lock()
				for _, c := range cs {
					if seen[c.ID] || !slices.Contains(topics, c.Topic) || c.Attempts != 1 {
						t.Errorf("message %s (topic %q, attempt %d) claimed twice or wrongly", c.ID, c.Topic, c.Attempts)
					}
					seen[c.ID] = true
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return len(seen)
}

// claimTopics: a claim of one topic, and one of two, take exactly their
// topics' due messages (dialects may build the two forms differently) and
// leave the others untouched.
func claimTopics(t *testing.T, e *env) {
	var msgs []outbox.Message
	for i := range 12 {
		msgs = append(msgs, outbox.Message{Topic: []string{"a", "b", "c", "d"}[i%4]})
	}
	res := e.publish(t, msgs...)
	topicOf := map[outbox.ID]string{}
	for i, r := range res {
		topicOf[r.ID] = msgs[i].Topic
	}
	for _, topics := range [][]string{{"a"}, {"b", "c"}} {
		cs := claim(t, e, outboxdriver.ClaimParams{Topics: topics, Limit: 10, Lease: time.Minute, MaxAttempts: 3})
		if len(cs) != 3*len(topics) {
			t.Errorf("claim of %v took %d messages, want %d", topics, len(cs), 3*len(topics))
		}
		for _, c := range cs {
			if !slices.Contains(topics, c.Topic) || topicOf[c.ID] != c.Topic {
				t.Errorf("claim of %v took %s of topic %q", topics, c.ID, c.Topic)
			}
		}
	}
	if n := e.count(t, "topic = 'd' AND state = 'pending' AND attempts = 0"); n != 3 {
		t.Errorf("%d of the 3 messages of the unclaimed topic untouched", n)
	}
}

func leaseReclaim(t *testing.T, e *env) {
	res := e.publish(t, outbox.Message{Topic: "t"})
	// A lease of half a second: the second claim comes right after the
	// first, and a loaded host (CI beside other work) can hold a test up
	// for longer than a shorter lease.
	p := outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: 500 * time.Millisecond, MaxAttempts: 3}
	if cs := claim(t, e, p); len(cs) != 1 || cs[0].Attempts != 1 {
		t.Fatalf("first claim %v", cs)
	}
	if cs := claim(t, e, p); len(cs) != 0 {
		t.Fatalf("claimed again within the lease: %v", cs)
	}
	time.Sleep(700 * time.Millisecond)
	cs := claim(t, e, p)
	if len(cs) != 1 || cs[0].ID != res[0].ID || cs[0].Attempts != 2 {
		t.Fatalf("after the lease: %v, want attempt 2", cs)
	}
	time.Sleep(700 * time.Millisecond)
	cs = claim(t, e, p)
	if len(cs) != 1 || cs[0].Attempts != 3 {
		t.Fatalf("third claim %v", cs)
	}
	time.Sleep(700 * time.Millisecond)
	cs = claim(t, e, p) // attempts reached MaxAttempts: dead at claim
	if len(cs) != 1 || !cs[0].Dead || cs[0].Attempts != 3 {
		t.Fatalf("claim past max attempts: %v, want dead at 3", cs)
	}
	if n := e.count(t, idIs(res[0].ID)+" AND state = 'dead' AND attempts = 3"); n != 1 {
		t.Error("not dead-lettered at claim")
	}
}

func fencing(t *testing.T, e *env) {
	res := e.publish(t, outbox.Message{Topic: "t"})
	p := outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: 50 * time.Millisecond, MaxAttempts: 5}
	claim(t, e, p)
	time.Sleep(120 * time.Millisecond)
	p.Lease = time.Minute
	claim(t, e, p)
	ctx := context.Background()
	for _, kind := range []outboxdriver.SettleKind{outboxdriver.SettleDone, outboxdriver.SettleRetry, outboxdriver.SettleDead} {
		applied, err := e.rd.Settle(ctx, e.DB, e.ob.Table(), outboxdriver.SettleParams{}, []outboxdriver.Settlement{{Fence: outboxdriver.Fence{ID: res[0].ID, Attempts: 1}, Kind: kind, Error: "stale"}})
		if err != nil || len(applied) != 0 {
			t.Errorf("stale settle kind %d applied %v, %v", kind, applied, err)
		}
	}
	if n := e.count(t, idIs(res[0].ID)+" AND state = 'processing' AND attempts = 2"); n != 1 {
		t.Error("a stale settle changed the row")
	}
	applied, err := e.rd.Settle(ctx, e.DB, e.ob.Table(), outboxdriver.SettleParams{}, []outboxdriver.Settlement{{Fence: outboxdriver.Fence{ID: res[0].ID, Attempts: 2}, Kind: outboxdriver.SettleDead, Error: "x"}})
	if err != nil || len(applied) != 1 {
		t.Fatalf("current settle: %v %v", applied, err)
	}
	applied, _ = e.rd.Settle(ctx, e.DB, e.ob.Table(), outboxdriver.SettleParams{}, []outboxdriver.Settlement{{Fence: outboxdriver.Fence{ID: res[0].ID, Attempts: 2}, Kind: outboxdriver.SettleRetry}})
	if len(applied) != 0 || e.count(t, idIs(res[0].ID)+" AND state = 'dead'") != 1 {
		t.Error("a dead message came back")
	}
}

// fencingMixedBatch settles batches whose messages were claimed with
// different attempts, some stale: each applies exactly where its own
// (id, attempts) still holds, for successes settled alone, carried by a
// claim, or kept as delivered, and for dead letters discarded.
func fencingMixedBatch(t *testing.T, e *env) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		p     outboxdriver.SettleParams
		kind  outboxdriver.SettleKind
		carry bool
		// also, when not "", is a second topic of the carrying claim: a
		// claim of several topics, which dialects may build apart from a
		// claim of one.
		also string
	}{
		{"done", outboxdriver.SettleParams{}, outboxdriver.SettleDone, false, ""},
		{"done carried by a claim", outboxdriver.SettleParams{}, outboxdriver.SettleDone, true, ""},
		{"done kept carried by a claim of two topics", outboxdriver.SettleParams{KeepDelivered: true}, outboxdriver.SettleDone, true, "elsewhere"},
		{"done kept", outboxdriver.SettleParams{KeepDelivered: true}, outboxdriver.SettleDone, false, ""},
		{"dead discarded", outboxdriver.SettleParams{DiscardDead: true}, outboxdriver.SettleDead, false, ""},
	} {
		topic := strings.ReplaceAll(tc.name, " ", "_")
		res := e.publish(t, outbox.Message{Topic: topic}, outbox.Message{Topic: topic}, outbox.Message{Topic: topic})
		a, b, c := res[0].ID, res[1].ID, res[2].ID
		p := outboxdriver.ClaimParams{Topics: []string{topic}, Limit: 3, Lease: 50 * time.Millisecond, MaxAttempts: 5}
		if n := len(claim(t, e, p)); n != 3 {
			t.Fatalf("%s: claimed %d", tc.name, n)
		}
		time.Sleep(120 * time.Millisecond)
		// a and b are claimed again (attempts 2); c keeps its lapsed claim.
		p.Limit, p.Lease = 2, time.Minute
		if cs := claim(t, e, p); len(cs) != 2 || cs[0].ID != a || cs[1].ID != b {
			t.Fatalf("%s: second claim %v", tc.name, cs)
		}
		batch := []outboxdriver.Fence{{ID: a, Attempts: 1}, {ID: b, Attempts: 2}, {ID: c, Attempts: 1}}
		var applied []outboxdriver.Fence
		var err error
		if tc.carry {
			var cs []outboxdriver.Claimed
			topics := []string{topic}
			if tc.also != "" {
				topics = append(topics, tc.also)
			}
			cs, applied, err = e.rd.Claim(ctx, e.DB, e.ob.Table(), outboxdriver.ClaimParams{Topics: topics, Limit: 10, Lease: time.Minute, MaxAttempts: 5, Done: batch, KeepDelivered: tc.p.KeepDelivered})
			if err == nil && len(cs) != 0 {
				t.Errorf("%s: the carrying claim took %v", tc.name, cs)
			}
		} else {
			ss := make([]outboxdriver.Settlement, len(batch))
			for i, f := range batch {
				ss[i] = outboxdriver.Settlement{Fence: f, Kind: tc.kind, Error: "x"}
			}
			applied, err = e.rd.Settle(ctx, e.DB, e.ob.Table(), tc.p, ss)
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := map[outboxdriver.Fence]bool{}
		for _, f := range applied {
			got[f] = true
		}
		if len(applied) != 2 || !got[batch[1]] || !got[batch[2]] {
			t.Errorf("%s: applied %v, want b@2 and c@1", tc.name, applied)
		}
		if n := e.count(t, idIs(a)+" AND state = 'processing' AND attempts = 2"); n != 1 {
			t.Errorf("%s: the stale fence changed a", tc.name)
		}
		left := e.count(t, "topic = '"+topic+"'")
		if want := map[bool]int{true: 3, false: 1}[tc.p.KeepDelivered]; left != want {
			t.Errorf("%s: %d rows left, want %d", tc.name, left, want)
		}
		if tc.p.KeepDelivered && e.count(t, "topic = '"+topic+"' AND state = 'delivered'") != 2 {
			t.Errorf("%s: b and c not kept as delivered", tc.name)
		}
	}
}

// stats: counts per topic and state, and the age of the oldest due
// pending message on the database clock (a message not yet due has none).
func stats(t *testing.T, e *env) {
	e.publish(t, outbox.Message{Topic: "a"}, outbox.Message{Topic: "a"}, outbox.Message{Topic: "b", Delay: time.Hour})
	time.Sleep(150 * time.Millisecond)
	if cs := claim(t, e, outboxdriver.ClaimParams{Topics: []string{"a"}, Limit: 1, Lease: time.Minute, MaxAttempts: 3}); len(cs) != 1 {
		t.Fatalf("claimed %d", len(cs))
	}
	ss, err := e.ob.Stats(context.Background(), e.DB)
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 2 || ss[0].Topic != "a" || ss[1].Topic != "b" {
		t.Fatalf("stats %+v", ss)
	}
	a, b := ss[0], ss[1]
	if a.Pending != 1 || a.Processing != 1 || a.Delivered != 0 || a.Dead != 0 || b.Pending != 1 {
		t.Errorf("counts %+v %+v", a, b)
	}
	if a.Due != 1 || b.Due != 0 {
		t.Errorf("due: a %d (want 1), b %d (want 0: not due for an hour)", a.Due, b.Due)
	}
	if a.OldestPending < 100*time.Millisecond || a.OldestPending > time.Minute {
		t.Errorf("oldest due pending of a: %v, want about 150ms", a.OldestPending)
	}
	if b.OldestPending != 0 {
		t.Errorf("oldest due pending of b: %v, want 0 (not due)", b.OldestPending)
	}
}

func retryThenSuccess(t *testing.T, e *env) {
	var runs atomic.Int32
	e.relay(t, outbox.RelayConfig{}, map[string]outbox.Handler{"t": func(ctx context.Context, d outbox.Delivery) error {
		runs.Add(1)
		if d.Attempt == 1 {
			return errors.New("once")
		}
		return nil
	}})
	e.publish(t, outbox.Message{Topic: "t"})
	waitFor(t, "delivered", func() bool { return e.count(t, "") == 0 })
	if runs.Load() != 2 {
		t.Errorf("%d runs, want 2", runs.Load())
	}
}

func deadLetterAndRedrive(t *testing.T, e *env) {
	var healed atomic.Bool
	var runs atomic.Int32
	e.relay(t, outbox.RelayConfig{MaxAttempts: 3}, map[string]outbox.Handler{"t": func(ctx context.Context, d outbox.Delivery) error {
		runs.Add(1)
		if healed.Load() {
			return nil
		}
		return errors.New("broken")
	}})
	res := e.publish(t, outbox.Message{Topic: "t"})
	waitFor(t, "dead", func() bool { return e.count(t, idIs(res[0].ID)+" AND state = 'dead' AND attempts = 3") == 1 })
	if runs.Load() != 3 {
		t.Errorf("%d runs before dead, want 3", runs.Load())
	}
	healed.Store(true)
	if n, err := e.ob.Redrive(context.Background(), e.DB, ""); err != nil || n != 1 {
		t.Fatalf("redrive %d %v", n, err)
	}
	waitFor(t, "delivered after redrive", func() bool { return e.count(t, "") == 0 })
}

func cancelAndInvalid(t *testing.T, e *env) {
	r := map[string]outbox.Handler{"cancel": func(ctx context.Context, d outbox.Delivery) error { return outbox.DeadLetter(errors.New("no")) }}
	e.relay(t, outbox.RelayConfig{MaxAttempts: 5}, r)
	res := e.publish(t, outbox.Message{Topic: "cancel"})
	waitFor(t, "dead", func() bool { return e.count(t, idIs(res[0].ID)+" AND state = 'dead' AND attempts = 1") == 1 })

	// Invalid payload through a typed handler, on a relay of its own.
	rl, err := e.ob.Relay(e.DB, outbox.RelayConfig{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	outbox.HandleJSON(rl, "typed", func(ctx context.Context, d outbox.Delivery, v struct{ N int }) error { return nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	defer func() { cancel(); <-done }()
	bad := e.publish(t, outbox.Message{Topic: "typed", Payload: []byte(`{"N":"not a number"}`)})
	waitFor(t, "invalid payload dead", func() bool {
		return e.count(t, idIs(bad[0].ID)+" AND state = 'dead' AND attempts = 1") == 1
	})
}

func purge(t *testing.T, e *env) {
	stop := e.relay(t, outbox.RelayConfig{KeepDelivered: outbox.Forever}, map[string]outbox.Handler{
		"ok":  func(context.Context, outbox.Delivery) error { return nil },
		"bad": func(context.Context, outbox.Delivery) error { return outbox.DeadLetter(errors.New("no")) },
	})
	e.publish(t, outbox.Message{Topic: "ok"}, outbox.Message{Topic: "ok"}, outbox.Message{Topic: "bad"}, outbox.Message{Topic: "later", Delay: time.Hour})
	waitFor(t, "settled", func() bool { return e.count(t, "state IN ('delivered', 'dead')") == 3 })
	stop()
	ctx := context.Background()
	if n, err := e.ob.Purge(ctx, e.DB, outbox.PurgeOptions{OlderThan: time.Hour}); err != nil || n != 0 {
		t.Errorf("purge older than an hour: %d %v", n, err)
	}
	if n, err := e.ob.Purge(ctx, e.DB, outbox.PurgeOptions{States: []outbox.State{outbox.StateDead}}); err != nil || n != 1 {
		t.Errorf("purge dead: %d %v", n, err)
	}
	if n, err := e.ob.Purge(ctx, e.DB, outbox.PurgeOptions{}); err != nil || n != 2 {
		t.Errorf("purge delivered: %d %v", n, err)
	}
	if n := e.count(t, ""); n != 1 {
		t.Errorf("%d rows left, want the pending one", n)
	}
}

func keepDelivered(t *testing.T, e *env) {
	e.relay(t, outbox.RelayConfig{KeepDelivered: outbox.Forever}, map[string]outbox.Handler{"t": func(context.Context, outbox.Delivery) error { return nil }})
	res := e.publish(t, outbox.Message{Topic: "t"})
	waitFor(t, "delivered and kept", func() bool { return e.count(t, idIs(res[0].ID)+" AND state = 'delivered'") == 1 })
}

func shutdownDrain(t *testing.T, e *env) {
	var started atomic.Int32
	stop := e.relay(t, outbox.RelayConfig{ShutdownGrace: 5 * time.Second}, map[string]outbox.Handler{"t": func(ctx context.Context, d outbox.Delivery) error {
		started.Add(1)
		time.Sleep(200 * time.Millisecond)
		return nil
	}})
	msgs := make([]outbox.Message, 20)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "t"}
	}
	e.publish(t, msgs...)
	waitFor(t, "all in flight", func() bool { return started.Load() == 20 })
	stop()
	if n := e.count(t, ""); n != 0 {
		t.Errorf("%d messages left after a drained shutdown", n)
	}
}

// DedupRace publishes, from workers concurrent transactions, one message
// each with the same dedup key, and commits them. begin(i) opens
// transaction i, writes its business row and returns the transaction and
// its commit. It fails t unless exactly one publisher was told it stored
// the message and every transaction committed; the caller counts rows.
func DedupRace(t testing.TB, ob *outbox.Outbox, workers int, key string, begin func(i int) (outbox.Tx, func() error, error)) {
	t.Helper()
	var wg sync.WaitGroup
	dups := make(chan bool, workers)
	errs := make(chan error, workers)
	for i := range workers {
		tx, commit, err := begin(i)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			r, err := ob.Publish(context.Background(), tx, outbox.Message{Topic: "x", DedupKey: key})
			if err != nil {
				errs <- err
				return
			}
			dups <- r.Duplicate
			errs <- commit()
		})
	}
	wg.Wait()
	close(dups)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	stored := 0
	for d := range dups {
		if !d {
			stored++
		}
	}
	if stored != 1 {
		t.Errorf("%d publishers were told they stored the message, want 1", stored)
	}
}

// PublishCommit publishes msgs with ob on tx, commits tx and returns the
// messages' ids, failing the test on any error.
func PublishCommit(t testing.TB, tx *sql.Tx, ob *outbox.Outbox, msgs ...outbox.Message) []outbox.ID {
	t.Helper()
	res, err := ob.PublishBatch(context.Background(), sqltx.From(tx), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ids := make([]outbox.ID, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids
}

// Trace is an outbox.Tracer that records every claim and settle: how many
// times each (id, attempts) was claimed, the settlements written and the
// fences they applied to, and the errors claims and settles returned.
type Trace struct {
	mu         sync.Mutex
	claimed    map[outboxdriver.Fence]int
	settled    []outboxdriver.Settlement
	applied    map[outboxdriver.Fence]bool
	claimErrs  []error
	settleErrs []error
}

// NewTrace returns an empty Trace.
func NewTrace() *Trace {
	return &Trace{claimed: map[outboxdriver.Fence]int{}, applied: map[outboxdriver.Fence]bool{}}
}

func (tr *Trace) TraceClaim(_ context.Context, cs []outboxdriver.Claimed, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, c := range cs {
		tr.claimed[outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}]++
	}
	if err != nil {
		tr.claimErrs = append(tr.claimErrs, err)
	}
}

func (tr *Trace) TraceSettle(_ context.Context, s []outboxdriver.Settlement, applied []outboxdriver.Fence, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.settled = append(tr.settled, s...)
	for _, f := range applied {
		tr.applied[f] = true
	}
	if err != nil {
		tr.settleErrs = append(tr.settleErrs, err)
	}
}

// SettleOf returns whether a settle for f was written and whether it applied.
func (tr *Trace) SettleOf(f outboxdriver.Fence) (written, applied bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, s := range tr.settled {
		if s.Fence == f {
			written = true
		}
	}
	return written, tr.applied[f]
}

// ClaimErrors returns the errors claims returned so far.
func (tr *Trace) ClaimErrors() []error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]error(nil), tr.claimErrs...)
}

// CheckClaimedOnce fails t unless n distinct (id, attempts) pairs were
// claimed, each exactly once, and no claim or settle returned an error that
// ignore does not accept (ignore may be nil).
func (tr *Trace) CheckClaimedOnce(t testing.TB, n int, ignore func(error) bool) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for f, k := range tr.claimed {
		if k != 1 {
			t.Errorf("(%s, %d) claimed %d times", f.ID, f.Attempts, k)
		}
	}
	if len(tr.claimed) != n {
		t.Errorf("%d (id, attempts) claimed, want %d", len(tr.claimed), n)
	}
	for _, err := range append(append([]error(nil), tr.claimErrs...), tr.settleErrs...) {
		if ignore == nil || !ignore(err) {
			t.Errorf("a claim or settle failed: %v", err)
		}
	}
}
