package pgwal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/internal/walenv"
	"github.com/oncommit/oncommit/outboxdriver"
)

// walURL is the PostgreSQL cluster with wal_level=logical (pgtest.WALURL).
func walURL(t *testing.T) string { return pgtest.WALURL(t) }

// slot sets up a fresh slot and publication on url, dropped when t ends.
func slot(t *testing.T, url string) (slot, pub string) {
	t.Helper()
	var b [5]byte
	_, _ = rand.Read(b[:])
	slot, pub = "s_"+hex.EncodeToString(b[:]), "p_"+hex.EncodeToString(b[:])
	ctx := context.Background()
	c, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if created, err := Setup(ctx, c, slot, pub); err != nil || !created {
		t.Fatalf("Setup: %v, %v", created, err)
	}
	if created, err := Setup(ctx, c, slot, pub); err != nil || created {
		t.Fatalf("Setup again: created %v, %v; want an idempotent no-op", created, err)
	}
	t.Cleanup(func() {
		defer c.Close(ctx)
		for range 50 { // the server frees a closed reader's slot shortly after
			if err := Drop(ctx, c, slot, pub); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("slot %s not dropped", slot)
	})
	return slot, pub
}

// emit publishes one transaction of envelopes under prefix, committed or
// rolled back.
func emit(t *testing.T, url, prefix string, commit bool, es ...walenv.Envelope) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var b []byte
	for _, e := range es {
		b = walenv.Append(b, e)
	}
	if _, err := tx.Exec(ctx, EmitSQL, prefix, b); err != nil {
		t.Fatal(err)
	}
	if commit {
		err = tx.Commit(ctx)
	} else {
		err = tx.Rollback(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func open(t *testing.T, url, slot, pub string) *Reader {
	t.Helper()
	r, err := Open(context.Background(), ReaderConfig{ConnString: url, Slot: slot, Publication: pub, Prefix: "oncommit", StatusInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func next(t *testing.T, r *Reader) []Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// nothing asserts that r reads no transaction within a short wait.
func nothing(t *testing.T, r *Reader) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if msgs, err := r.Next(ctx); err == nil || ctx.Err() == nil {
		t.Fatalf("read %d messages (%v), want none before the wait ends", len(msgs), err)
	}
}

func topics(msgs []Msg) (s []string) {
	for _, m := range msgs {
		s = append(s, m.Topic)
	}
	return s
}

// The reader gets committed transactions of its prefix, whole and in commit
// order, never a rolled-back one; a transaction is read again after a
// restart until it and every one before it are settled, and never after.
func TestReadSettleConfirm(t *testing.T) {
	url := walURL(t)
	s, p := slot(t, url)
	before := time.Now()
	emit(t, url, "oncommit", true, walenv.Envelope{ID: outboxdriver.ID{1}, Topic: "a1", Key: "k", Payload: []byte(`{"n":1}`)},
		walenv.Envelope{ID: outboxdriver.ID{2}, Topic: "a2"})
	emit(t, url, "other", true, walenv.Envelope{Topic: "not ours"})
	emit(t, url, "oncommit", false, walenv.Envelope{Topic: "rolled back"})
	emit(t, url, "oncommit", true, walenv.Envelope{ID: outboxdriver.ID{3}, Topic: "b1"})

	r := open(t, url, s, p)
	a := next(t, r)
	if got := topics(a); len(got) != 2 || got[0] != "a1" || got[1] != "a2" {
		t.Fatalf("first transaction: %v", got)
	}
	if m := a[0]; m.ID != (outboxdriver.ID{1}) || m.Key != "k" || string(m.Payload) != `{"n":1}` || m.CommitTime.Before(before.Add(-time.Second)) || m.End == 0 || a[1].End != m.End || a[1].LSN != m.LSN {
		t.Errorf("first message: %+v", m)
	}
	b := next(t, r)
	if got := topics(b); len(got) != 1 || got[0] != "b1" || b[0].End <= a[0].End {
		t.Fatalf("second transaction: %v (end %v after %v)", got, b[0].End, a[0].End)
	}
	nothing(t, r)

	// b settled, a not: nothing may be confirmed past a.
	r.Settled(b[0])
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	r = reopen(t, url, s, p)
	a = next(t, r)
	if got := topics(a); len(got) != 2 || got[0] != "a1" {
		t.Fatalf("after a restart with a unsettled: %v, want a again", got)
	}
	b = next(t, r)
	if got := topics(b); len(got) != 1 || got[0] != "b1" {
		t.Fatalf("after a restart: %v, want b again", got)
	}
	for _, m := range a {
		r.Settled(m)
	}
	r.Settled(b[0])
	if pos, n := r.Position(); pos < b[0].End || n != 0 {
		t.Fatalf("all settled: position %v (want >= %v), %d outstanding", pos, b[0].End, n)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	r = reopen(t, url, s, p)
	defer r.Close(context.Background())
	nothing(t, r)
	emit(t, url, "oncommit", true, walenv.Envelope{Topic: "c1"})
	if got := topics(next(t, r)); len(got) != 1 || got[0] != "c1" {
		t.Fatalf("after everything settled: %v, want only the new c1", got)
	}
}

// reopen opens the slot again once the server has let go of the last
// reader (it frees the slot when it sees the connection close).
func reopen(t *testing.T, url, slot, pub string) *Reader {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := Open(context.Background(), ReaderConfig{ConnString: url, Slot: slot, Publication: pub, Prefix: "oncommit", StatusInterval: 50 * time.Millisecond})
		if err == nil {
			return r
		}
		if !errors.Is(err, ErrSlotBusy) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// One reader per slot: a second one gets ErrSlotBusy until the first
// closes, then takes over where the first confirmed.
func TestOneReaderPerSlot(t *testing.T) {
	url := walURL(t)
	s, p := slot(t, url)
	emit(t, url, "oncommit", true, walenv.Envelope{Topic: "x"})
	r1 := open(t, url, s, p)
	x := next(t, r1)
	if _, err := Open(context.Background(), ReaderConfig{ConnString: url, Slot: s, Publication: p, Prefix: "oncommit"}); !errors.Is(err, ErrSlotBusy) {
		t.Fatalf("second reader: %v, want ErrSlotBusy", err)
	}
	r1.Settled(x[0])
	emit(t, url, "oncommit", true, walenv.Envelope{Topic: "y"})
	if err := r1.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	r2 := reopen(t, url, s, p)
	defer r2.Close(context.Background())
	if got := topics(next(t, r2)); len(got) != 1 || got[0] != "y" {
		t.Fatalf("the reader that took over read %v, want y", got)
	}
}

func TestOpenRefuses(t *testing.T) {
	url := walURL(t)
	ctx := context.Background()
	cfg := ReaderConfig{ConnString: url, Slot: "no_such_slot", Publication: "p", Prefix: "oncommit"}
	if _, err := Open(ctx, cfg); !errors.Is(err, ErrSlotMissing) {
		t.Errorf("missing slot: %v, want ErrSlotMissing", err)
	}
	for _, c := range []ReaderConfig{{ConnString: url, Slot: "Bad", Publication: "p", Prefix: "x"}, {ConnString: url, Slot: "s", Publication: "p; drop", Prefix: "x"}, {ConnString: url, Slot: "s", Publication: "p"}} {
		if _, err := Open(ctx, c); !errors.Is(err, ErrName) {
			t.Errorf("%+v: %v, want ErrName", c, err)
		}
	}
	// The main test server runs with wal_level=replica.
	main := pgtest.URL(t)
	c, err := pgconn.Connect(ctx, main)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if level, err := query(ctx, c, "SHOW wal_level"); err != nil || level[0][0] == "logical" {
		t.Skipf("the main server's wal_level: %v, %v", level, err)
	}
	if _, err := Setup(ctx, c, "s", "p"); !errors.Is(err, ErrWALLevel) {
		t.Errorf("Setup with wal_level=replica: %v, want ErrWALLevel", err)
	}
	if _, err := Open(ctx, ReaderConfig{ConnString: main, Slot: "s", Publication: "p", Prefix: "oncommit"}); !errors.Is(err, ErrWALLevel) {
		t.Errorf("Open with wal_level=replica: %v, want ErrWALLevel", err)
	}
}
