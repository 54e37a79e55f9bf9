package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/outbox"
)

// orderedWAL makes e's Outbox order by key.
func (e *walEnv) orderedWAL(t *testing.T) {
	t.Helper()
	d, err := postgres.WALDialect(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if e.ob, err = outbox.New(d, outbox.Config{Table: e.table, OrderByKey: true}); err != nil {
		t.Fatal(err)
	}
}

// keyLog records deliveries per key and fails t when two of one key run
// at once.
type keyLog struct {
	t       *testing.T
	mu      sync.Mutex
	running map[string]bool
	done    map[string][]outbox.ID // successes, in delivery order
	runs    map[outbox.ID]int
}

func newKeyLog(t *testing.T) *keyLog {
	return &keyLog{t: t, running: map[string]bool{}, done: map[string][]outbox.ID{}, runs: map[outbox.ID]int{}}
}

// handler delivers with fail deciding, per delivery, whether it fails.
func (l *keyLog) handler(fail func(d outbox.Delivery, run int) bool) outbox.Handler {
	return func(_ context.Context, d outbox.Delivery) error {
		l.mu.Lock()
		if l.running[d.Key] {
			l.t.Errorf("two messages of key %s delivered at once", d.Key)
		}
		l.running[d.Key] = true
		l.runs[d.ID]++
		run := l.runs[d.ID]
		l.mu.Unlock()
		time.Sleep(time.Millisecond)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.running[d.Key] = false
		if fail(d, run) {
			return fmt.Errorf("run %d fails", run)
		}
		l.done[d.Key] = append(l.done[d.Key], d.ID)
		return nil
	}
}

func (l *keyLog) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.done[key])
}

// check fails t unless each key's successes are its published ids, in
// order.
func (l *keyLog) check(want map[string][]outbox.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, ids := range want {
		if !slices.Equal(l.done[k], ids) {
			l.t.Errorf("key %s delivered %v, want %v", k, l.done[k], ids)
		}
	}
}

// publishKeys publishes n messages on each key, interleaved, one
// transaction per message (every third one a batch of the next key's
// too), and returns the ids per key in publish order.
func publishKeys(t *testing.T, e *walEnv, keys []string, n int) map[string][]outbox.ID {
	t.Helper()
	want := map[string][]outbox.ID{}
	pub := walDrivers()[0].publish
	for i := range n {
		for j, k := range keys {
			msgs := []outbox.Message{{Topic: "t", Key: k, Payload: fmt.Appendf(nil, `{"n":%d}`, i)}}
			if (i+j)%3 == 0 {
				msgs = append(msgs, outbox.Message{Topic: "t", Key: k, Payload: fmt.Appendf(nil, `{"n":%d,"second":true}`, i)})
			}
			for _, r := range pub(t, e, msgs, true) {
				want[k] = append(want[k], r.ID)
			}
		}
	}
	return want
}

// Ordered delivery over the WAL transport: each key's messages are
// delivered one at a time in commit order. When a key's message fails, it
// is stored in the table as the key's head and the key's later messages
// read from the slot queue behind it in the table until it is settled;
// the other keys go on from the slot meanwhile.
func TestWALOrdered(t *testing.T) {
	e := newWALEnv(t)
	e.orderedWAL(t)
	keys := []string{"a", "b", "c", "d"}
	want := publishKeys(t, e, keys, 6)
	if n := e.count(t, ""); n != 0 {
		t.Fatalf("the ordered publishes wrote %d rows, want none", n)
	}
	first := want["a"][0]
	var retryOpen atomic.Bool
	log := newKeyLog(t)
	r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{PollInterval: 50 * time.Millisecond, RetryBase: time.Hour, RetryCap: time.Hour, Concurrency: 4, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Handle("t", log.handler(func(d outbox.Delivery, _ int) bool { return d.ID == first && !retryOpen.Load() })); err != nil {
		t.Fatal(err)
	}
	dialecttest.StartRelay(t, r)
	waitFor(t, 20*time.Second, "keys b, c and d delivered while a waits", func() bool {
		return log.count("b") == len(want["b"]) && log.count("c") == len(want["c"]) && log.count("d") == len(want["d"])
	})
	waitFor(t, 10*time.Second, "key a's later messages queued behind its failed head", func() bool {
		return e.count(t, "message_key = 'a' AND state = 'blocked'") == len(want["a"])-1
	})
	if n := log.count("a"); n != 0 {
		t.Fatalf("key a delivered %d messages behind its failed head", n)
	}
	if n := e.count(t, fmt.Sprintf("id = '%s' AND state = 'pending' AND attempts = 1 AND last_error = 'run 1 fails'", first)); n != 1 {
		t.Fatalf("key a's head is not stored pending with its attempt")
	}
	if n := e.count(t, "message_key <> 'a'"); n != 0 {
		t.Fatalf("the table holds %d messages of the keys that succeeded", n)
	}
	// The head is due now: the table's claims deliver the key in order.
	retryOpen.Store(true)
	if _, err := e.db.Exec(`UPDATE `+e.table+` SET available_at = now() WHERE id = $1`, first.String()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "key a delivered", func() bool { return log.count("a") == len(want["a"]) })
	waitFor(t, 10*time.Second, "the table emptied", func() bool { return e.count(t, "") == 0 })
	// With the table empty again, a new message of key a goes straight
	// from the slot.
	more := walDrivers()[0].publish(t, e, []outbox.Message{{Topic: "t", Key: "a"}}, true)
	want["a"] = append(want["a"], more[0].ID)
	waitFor(t, 20*time.Second, "key a's new message delivered", func() bool { return log.count("a") == len(want["a"]) })
	log.check(want)
}

// Dead under HaltKey, a message read from the slot halts its key: the
// key's later messages are stored blocked behind it, other keys go on,
// and a redrive delivers the key in order. Under ContinueKey the key goes
// on past it.
func TestWALOrderedDead(t *testing.T) {
	for _, policy := range []outbox.DeadKeyPolicy{outbox.HaltKey, outbox.ContinueKey} {
		name := map[outbox.DeadKeyPolicy]string{outbox.HaltKey: "halt", outbox.ContinueKey: "continue"}[policy]
		t.Run(name, func(t *testing.T) {
			e := newWALEnv(t)
			e.orderedWAL(t)
			want := publishKeys(t, e, []string{"a", "b"}, 4)
			first := want["a"][0]
			var fixed atomic.Bool
			log := newKeyLog(t)
			r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{MaxAttempts: 1, DeadKeys: policy, PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Handle("t", log.handler(func(d outbox.Delivery, _ int) bool { return d.ID == first && !fixed.Load() })); err != nil {
				t.Fatal(err)
			}
			dialecttest.StartRelay(t, r)
			waitFor(t, 20*time.Second, "key b delivered", func() bool { return log.count("b") == len(want["b"]) })
			if policy == outbox.ContinueKey {
				waitFor(t, 20*time.Second, "key a went on past its dead message", func() bool { return log.count("a") == len(want["a"])-1 })
				if n := e.count(t, fmt.Sprintf("id = '%s' AND state = 'dead' AND settled_at IS NOT NULL", first)); n != 1 {
					t.Fatal("the dead message is not stored dead and settled")
				}
				// While the dead message stays, the key's new messages go
				// through the table; a redrive then delivers it.
				fixed.Store(true)
				more := walDrivers()[0].publish(t, e, []outbox.Message{{Topic: "t", Key: "a"}}, true)
				waitFor(t, 20*time.Second, "key a's new message delivered", func() bool { return log.count("a") == len(want["a"]) })
				if n, err := e.ob.Redrive(context.Background(), pgxtx.FromStdlib(e.db), "t"); err != nil || n != 1 {
					t.Fatalf("Redrive: %d, %v; want 1", n, err)
				}
				waitFor(t, 20*time.Second, "the redriven message delivered", func() bool { return log.count("a") == len(want["a"])+1 })
				want["a"] = append(append(want["a"][1:], more[0].ID), first)
				log.check(want)
				return
			}
			waitFor(t, 20*time.Second, "key a halted behind its dead head", func() bool {
				return e.count(t, "message_key = 'a' AND state = 'blocked'") == len(want["a"])-1
			})
			if n := e.count(t, fmt.Sprintf("id = '%s' AND state = 'dead' AND settled_at IS NULL", first)); n != 1 {
				t.Fatal("the dead head is not stored dead and unsettled (halting its key)")
			}
			time.Sleep(300 * time.Millisecond) // claims poll every 50ms: nothing of key a may move
			if n := log.count("a"); n != 0 {
				t.Fatalf("key a delivered %d messages behind its dead head", n)
			}
			fixed.Store(true)
			if n, err := e.ob.Redrive(context.Background(), pgxtx.FromStdlib(e.db), "t"); err != nil || n != 1 {
				t.Fatalf("Redrive: %d, %v; want 1", n, err)
			}
			waitFor(t, 20*time.Second, "key a delivered after the redrive", func() bool { return log.count("a") == len(want["a"]) })
			waitFor(t, 10*time.Second, "the table emptied", func() bool { return e.count(t, "") == 0 })
			log.check(want)
		})
	}
}

// An ordered message the WAL transport cannot keep in commit order (a
// DedupKey or a delay) is refused before any SQL is sent; the transaction
// stays usable.
func TestWALOrderedRefusesTableOnly(t *testing.T) {
	e := newWALEnv(t)
	e.orderedWAL(t)
	tx, err := e.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, m := range []outbox.Message{
		{Topic: "t", Key: "k", DedupKey: "d"},
		{Topic: "t", Key: "k", Delay: time.Second},
		{Topic: "t", Key: "k", NotBefore: time.Now().Add(time.Minute)},
	} {
		var me *outbox.MessageError
		if _, err := e.ob.Publish(context.Background(), sqltx.From(tx), m); !errors.As(err, &me) || !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Errorf("%+v: %v, want a MessageError", m, err)
		}
	}
	// Without a key the message is not ordered: the table takes it.
	if _, err := e.ob.Publish(context.Background(), sqltx.From(tx), outbox.Message{Topic: "t", DedupKey: "d"}); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`SELECT 1`); err != nil {
		t.Errorf("the transaction after refused messages: %v", err)
	}
}

// A relay that takes the slot over finds the keys with messages in the
// table: a key whose head failed under an earlier reader keeps its later
// messages queued behind that head.
func TestWALOrderedAcrossReaders(t *testing.T) {
	e := newWALEnv(t)
	e.orderedWAL(t)
	log := newKeyLog(t)
	var first outbox.ID
	var mu sync.Mutex
	newRelay := func() *outbox.Relay {
		r, err := e.ob.Relay(pgxtx.FromStdlib(e.db), outbox.RelayConfig{PollInterval: 50 * time.Millisecond, RetryBase: time.Hour, RetryCap: time.Hour, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Handle("t", log.handler(func(d outbox.Delivery, run int) bool {
			mu.Lock()
			defer mu.Unlock()
			return d.ID == first && run == 1
		})); err != nil {
			t.Fatal(err)
		}
		return r
	}
	pub := walDrivers()[0].publish
	want := map[string][]outbox.ID{}
	res := pub(t, e, []outbox.Message{{Topic: "t", Key: "k"}}, true)
	mu.Lock()
	first = res[0].ID
	mu.Unlock()
	want["k"] = append(want["k"], first)
	stopA := dialecttest.StartRelay(t, newRelay())
	waitFor(t, 20*time.Second, "k's head stored after its failure", func() bool { return e.count(t, "state = 'pending' AND attempts = 1") == 1 })
	stopA()
	for range 3 {
		for _, k := range []string{"k", "other"} {
			want[k] = append(want[k], pub(t, e, []outbox.Message{{Topic: "t", Key: k}}, true)[0].ID)
		}
	}
	dialecttest.StartRelay(t, newRelay())
	waitFor(t, 20*time.Second, "the other key delivered", func() bool { return log.count("other") == 3 })
	waitFor(t, 10*time.Second, "k's later messages queued behind its head", func() bool { return e.count(t, "message_key = 'k' AND state = 'blocked'") == 3 })
	if n := log.count("k"); n != 0 {
		t.Fatalf("key k delivered %d messages behind its failed head", n)
	}
	if _, err := e.db.Exec(`UPDATE `+e.table+` SET available_at = now() WHERE id = $1`, first.String()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "key k delivered", func() bool { return log.count("k") == 4 })
	log.check(want)
}
