package dialecttest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// keyTrimCases are the conformance cases of the key trim
// (outboxdriver.KeyTrimmer), among the ordered cases.
var keyTrimCases = []envCase{
	{"OrderedTrimKeys", orderedTrimKeys},
	{"OrderedTrimKeysRace", orderedTrimKeysRace},
	{"OrderedTrimKeysJanitor", orderedTrimKeysJanitor},
}

// kt returns e's dialect as a KeyTrimmer, or skips t, saying so, when it
// does not trim key rows.
func (e *env) kt(t *testing.T) outboxdriver.KeyTrimmer {
	t.Helper()
	kt, ok := e.rd.(outboxdriver.KeyTrimmer)
	if !ok {
		t.Skipf("the %s dialect does not trim key rows (no outboxdriver.KeyTrimmer)", e.ob.Dialect().Name())
	}
	return kt
}

func (e *env) trimKeys(t *testing.T, limit int) int64 {
	t.Helper()
	n, err := e.kt(t).TrimKeys(context.Background(), e.DB, e.ob.Table(), limit)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// keyRow returns the last_seq of key's row in the keys table, or -1 when
// the key has no row.
func (e *env) keyRow(t *testing.T, key string) int64 {
	t.Helper()
	rows, err := e.DB.QueryDB(context.Background(), `SELECT last_seq FROM `+e.Table+`_keys WHERE message_key = '`+key+`'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seq := int64(-1)
	for rows.Next() {
		if err := rows.Scan(&seq); err != nil {
			t.Fatal(err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return seq
}

// settleHead claims key's head (the only claimable message) and settles
// it with failed (the zero Settlement for a success).
func (e *env) settleHead(t *testing.T, id outbox.ID, key string, failed outboxdriver.Settlement, halt bool) {
	t.Helper()
	cs := e.claimOrdered(t, 10, 0, time.Minute)
	if len(cs) != 1 || cs[0].ID != id {
		t.Fatalf("claimed %v, want %s", cs, id)
	}
	fence := outboxdriver.Fence{ID: cs[0].ID, Attempts: cs[0].Attempts}
	out := outboxdriver.RunOutcome{Head: fence, Key: key, Halt: halt}
	if failed.Kind == 0 {
		out.Done = []outbox.ID{id}
	} else {
		failed.Fence = fence
		out.Failed = failed
	}
	if applied := e.settleRuns(t, out); len(applied) != 1 {
		t.Fatalf("settle of %s applied %v", key, applied)
	}
}

// orderedTrimKeys: the trim deletes the row of a key with nothing left,
// in batches of its limit, and keeps the rows of keys with a live (pending,
// blocked), dead (Continue or Halt) message or an open publisher; a trimmed
// key published again starts a fresh sequence and is delivered.
func orderedTrimKeys(t *testing.T, e *env) {
	e.kt(t)
	ctx := context.Background()
	if _, err := e.kt(t).TrimKeys(ctx, e.DB, e.ob.Table(), 0); !errors.Is(err, outboxdriver.ErrInvalidConfig) {
		t.Errorf("TrimKeys with limit 0: %v, want ErrInvalidConfig", err)
	}
	dead := outboxdriver.Settlement{Kind: outboxdriver.SettleDead, Error: "poison"}
	// One key at a time, so that each claim finds only its head. C1..C3
	// (dead under Continue, like Cont) come first in the keys table and in
	// key order: they must not fill the batch of the trim with limit 2.
	for _, k := range []string{"C1", "C2", "C3", "D1", "D2", "D3", "Cont", "Halt", "Open"} {
		id := e.publish(t, outbox.Message{Topic: "x", Key: k})[0].ID
		switch k {
		case "Cont", "C1", "C2", "C3":
			e.settleHead(t, id, k, dead, false)
		case "Halt":
			e.settleHead(t, id, k, dead, true)
		default:
			e.settleHead(t, id, k, outboxdriver.Settlement{}, false)
		}
	}
	pend := e.publish(t, outbox.Message{Topic: "y", Key: "Pend"}, outbox.Message{Topic: "y", Key: "Pend"})
	if got := e.states(t, resIDs(pend)...); got != "pending blocked" {
		t.Fatalf("Pend: %s", got)
	}
	// Open: a publisher of the key holds its row until it commits; the
	// trim skips the row (PostgreSQL, MySQL) or waits for the commit
	// (SQLite's one writer), and then finds the key live.
	tx := e.Begin(t)
	if _, err := e.ob.Publish(ctx, tx.Tx, outbox.Message{Topic: "y", Key: "Open"}); err != nil {
		t.Fatal(err)
	}
	trimmed := make(chan int64, 1)
	go func() {
		n, err := e.kt(t).TrimKeys(ctx, e.DB, e.ob.Table(), 2)
		if err != nil {
			t.Error(err)
		}
		trimmed <- n
	}()
	var first int64
	select {
	case first = <-trimmed:
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	case <-time.After(300 * time.Millisecond):
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		first = <-trimmed
	}
	if first != 2 {
		t.Errorf("trim with limit 2 deleted %d rows, want 2", first)
	}
	if n := e.trimKeys(t, 100); n != 1 {
		t.Errorf("second trim deleted %d rows, want the last of D1, D2, D3", n)
	}
	for _, k := range []string{"D1", "D2", "D3"} {
		if seq := e.keyRow(t, k); seq != -1 {
			t.Errorf("key %s: row kept (last_seq %d) with nothing left", k, seq)
		}
	}
	for _, k := range []string{"C1", "C2", "C3", "Cont", "Halt", "Open", "Pend"} {
		if seq := e.keyRow(t, k); seq == -1 {
			t.Errorf("key %s: row trimmed", k)
		}
	}
	if seq := e.keyRow(t, "Open"); seq != 2 {
		t.Errorf("Open: last_seq %d after its second publish, want 2", seq)
	}
	// A trimmed key published again starts at 1 and is delivered.
	again := e.publish(t, outbox.Message{Topic: "x", Key: "D1"}, outbox.Message{Topic: "x", Key: "D1"})
	if e.count(t, idIs(again[0].ID)+" AND key_seq = 1 AND state = 'pending'") != 1 || e.count(t, idIs(again[1].ID)+" AND key_seq = 2 AND state = 'blocked'") != 1 {
		t.Errorf("D1 published again: %s, want a fresh sequence from 1", e.states(t, resIDs(again)...))
	}
	// Redrive the Continue-dead message: its key row was kept, so it
	// re-enters at its place and is delivered.
	if n, err := e.ob.Redrive(ctx, e.DB, "x"); err != nil || n != 5 {
		t.Fatalf("redrive: %d %v, want C1, C2, C3, Cont and Halt", n, err)
	}
	rec := newOrderedRecorder(t, nil)
	e.relay(t, outbox.RelayConfig{}, map[string]outbox.Handler{"x": rec.handler, "y": rec.handler})
	waitFor(t, "all delivered", func() bool { return e.count(t, "") == 0 })
	if got := len(rec.successes("D1")); got != 2 {
		t.Errorf("D1 delivered %d times, want 2", got)
	}
	// Now every key has nothing left: all their rows go.
	if n := e.trimKeys(t, 100); n != 8 {
		t.Errorf("final trim deleted %d rows, want C1, C2, C3, D1, Cont, Halt, Open, Pend", n)
	}
}

// orderedTrimKeysRace: publishers of one key racing the trim never break
// the key's order. Each round delivers the key's messages (so its row is
// trimmable), then trims while two transactions publish the key one after
// the other: the first becomes the head, numbered 1 when the trim won or
// after the last number when the publisher did, the second is blocked
// right after it, and they are claimed in that order.
func orderedTrimKeysRace(t *testing.T, e *env) {
	kt := e.kt(t)
	ctx := context.Background()
	const rounds = 300
	prev := e.publish(t, outbox.Message{Topic: "x", Key: "R"})[0].ID
	var fresh, kept int
	for range rounds {
		e.settleHead(t, prev, "R", outboxdriver.Settlement{}, false)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				if _, err := kt.TrimKeys(ctx, e.DB, e.ob.Table(), 10); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		a := e.publish(t, outbox.Message{Topic: "x", Key: "R"})[0].ID
		b := e.publish(t, outbox.Message{Topic: "x", Key: "R"})[0].ID
		wg.Wait()
		if got := e.states(t, a, b); got != "pending blocked" {
			t.Fatalf("after the race: %s, want pending blocked", got)
		}
		seq := e.keyRow(t, "R")
		if seq < 2 || e.count(t, idIs(a)+fmt.Sprintf(" AND key_seq = %d", seq-1)) != 1 || e.count(t, idIs(b)+fmt.Sprintf(" AND key_seq = %d", seq)) != 1 {
			t.Fatalf("key row last_seq %d does not number the two messages in publish order", seq)
		}
		if seq == 2 {
			fresh++
		} else {
			kept++
		}
		e.settleHead(t, a, "R", outboxdriver.Settlement{}, false)
		prev = b
	}
	t.Logf("%d rounds: the trim deleted the key row first %d times, the publisher kept it %d times", rounds, fresh, kept)
}

// orderedTrimKeysJanitor: a relay's janitor trims key rows on its
// schedule, without KeepDelivered.
func orderedTrimKeysJanitor(t *testing.T, e *env) {
	e.kt(t)
	rec := newOrderedRecorder(t, nil)
	e.relay(t, outbox.RelayConfig{JanitorEvery: 10 * time.Millisecond}, map[string]outbox.Handler{"x": rec.handler})
	e.publish(t, outbox.Message{Topic: "x", Key: "J"}, outbox.Message{Topic: "x", Key: "J"})
	waitFor(t, "J delivered", func() bool { return len(rec.successes("J")) == 2 })
	waitFor(t, "J's key row trimmed by the janitor", func() bool { return e.keyRow(t, "J") == -1 })
}
