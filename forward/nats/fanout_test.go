package natsfwd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/fwdtest"
	"github.com/oncommit/oncommit/outbox"
)

// TestFanOutLocalHandlerAndForwarder: a local handler and a forwarder on
// the same topic (Config.Subscribers {"order.placed": {"mail", "nats"}}).
// mail's handler fails the first 3 attempts of every message; its
// retries never reach the forwarder: the forwarder gets each of its
// copies once, on their first attempt, and the stream holds each message
// once, its Nats-Msg-Id the nats copy's id (Result.Copies[1], not
// Result.ID, which is mail's copy), with the message's own key in
// Oncommit-Key. mail sees each message 4 times, attempts 1 to 4, and the
// table ends empty.
func TestFanOutLocalHandlerAndForwarder(t *testing.T) {
	const (
		topic = "order.placed"
		n     = 20
		fails = 3 // mail's failed attempts per message
	)
	x := setup(t, false)
	env, s := x.env, x.s
	// fwdtest's Outbox has no subscribers: one of the test's own on the
	// same table.
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: env.Ob.Table().String(),
		Subscribers: map[string][]string{topic: {"mail", "nats"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := ob.Subscribers(topic); !slices.Equal(got, []string{"mail", "nats"}) {
		t.Fatalf("Subscribers(%q) = %v", topic, got)
	}

	msgs := fwdtest.Messages(topic, n, 0)
	for i := range msgs {
		if i%2 == 0 { // half of them with a key, half without
			msgs[i].Key = fmt.Sprintf("order-%d", i)
		}
	}
	ctx := context.Background()
	tx, err := env.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ob.PublishBatch(ctx, pgxtx.From(tx), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	number := map[string]int{} // the message's n, by copy id
	var natsIDs []outbox.ID
	for i, r := range res {
		if len(r.Copies) != 2 || r.Duplicate || r.ID != r.Copies[0] || r.Copies[0] == r.Copies[1] || r.Copies[0].IsZero() || r.Copies[1].IsZero() {
			t.Fatalf("message %d: result %+v, want two distinct copies, ID the first", i, r)
		}
		number[r.Copies[0].String()], number[r.Copies[1].String()] = i, i
		natsIDs = append(natsIDs, r.Copies[1])
	}
	if m := env.Rows(t); m["pending"] != 2*n || len(m) != 1 {
		t.Fatalf("after publishing %d messages the table holds %v, want %d pending copies", n, m, 2*n)
	}

	var (
		mu       sync.Mutex
		mail     = map[int][]int{} // attempts by the message's n
		mailIDs  = map[outbox.ID]bool{}
		fwdSeen  = map[outbox.ID][]int{} // the forwarder's attempts by copy id
		badDelis []string
	)
	check := func(d outbox.Delivery, sub string) {
		i, ok := number[d.ID.String()]
		if d.Subscriber != sub || d.Topic != topic || !ok || d.Key != msgs[i].Key || payloadN(t, d.Payload) != i {
			badDelis = append(badDelis, fmt.Sprintf("%s handler got subscriber %q topic %q key %q id %s payload %s", sub, d.Subscriber, d.Topic, d.Key, d.ID, d.Payload))
		}
	}
	errFail := errors.New("mail server down")
	r, err := ob.Relay(pgxtx.FromPool(env.Pool), outbox.RelayConfig{
		PollInterval: 20 * time.Millisecond, RetryBase: 10 * time.Millisecond, RetryCap: 20 * time.Millisecond,
		MaxAttempts: 10, Logger: fwdtest.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Subscribe(topic, "mail", func(_ context.Context, d outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		check(d, "mail")
		i := payloadN(t, d.Payload)
		mail[i] = append(mail[i], d.Attempt)
		mailIDs[d.ID] = true
		if d.Attempt <= fails {
			return errFail
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	h := x.f.Handler()
	if err := r.SubscribeBatch(topic, "nats", func(ctx context.Context, ds []outbox.Delivery) []error {
		mu.Lock()
		for _, d := range ds {
			check(d, "nats")
			fwdSeen[d.ID] = append(fwdSeen[d.ID], d.Attempt)
		}
		mu.Unlock()
		return h(ctx, ds)
	}); err != nil {
		t.Fatal(err)
	}
	stop := fwdtest.Run(t, r)
	env.WaitEmpty(t, time.Minute)
	stop()

	mu.Lock()
	defer mu.Unlock()
	for _, b := range badDelis {
		t.Error(b)
	}
	// mail: each message 4 times, attempts 1..4, always the same copy.
	want := []int{1, 2, 3, 4}
	for i := range msgs {
		if got := mail[i]; !slices.Equal(got, want) {
			t.Errorf("mail saw message %d with attempts %v, want %v", i, got, want)
		}
	}
	if len(mail) != n || len(mailIDs) != n {
		t.Errorf("mail saw %d payloads under %d ids, want %d of each", len(mail), len(mailIDs), n)
	}
	// The forwarder: each nats copy once, attempt 1; never a mail copy.
	for _, id := range natsIDs {
		if got := fwdSeen[id]; !slices.Equal(got, []int{1}) {
			t.Errorf("the forwarder got nats copy %s with attempts %v, want [1]", id, got)
		}
	}
	if len(fwdSeen) != n {
		t.Errorf("the forwarder got %d copies, want %d", len(fwdSeen), n)
	}
	for id := range mailIDs {
		if _, ok := fwdSeen[id]; ok {
			t.Errorf("the forwarder got mail's copy %s", id)
		}
	}

	// The stream: each message once, by payload, under its nats copy's id.
	got := read(t, s)
	checkOnce(t, got, natsIDs)
	byPayload := map[int]int{}
	for _, m := range got {
		i := payloadN(t, []byte(m.data))
		byPayload[i]++
		if j, ok := number[m.id]; !ok || j != i {
			t.Errorf("stream message %d: id %s is not a copy of the payload's message %s", m.seq, m.id, m.data)
			continue
		}
		if k, key := m.header.Get("Oncommit-Key"), msgs[i].Key; k != key {
			t.Errorf("stream message %s: Oncommit-Key %q, want the message's key %q", m.data, k, key)
		}
		if m.header.Get("Oncommit-Type") != topic {
			t.Errorf("stream message %s: Oncommit-Type %q, want %q", m.data, m.header.Get("Oncommit-Type"), topic)
		}
	}
	for i, msg := range msgs {
		if c := byPayload[i]; c != 1 {
			t.Errorf("payload %s is in the stream %d times, want once", msg.Payload, c)
		}
	}
	if m := env.Rows(t); len(m) != 0 {
		t.Errorf("the table holds %v at the end, want nothing", m)
	}
}

// payloadN returns n of a payload {"n":n} (as stored: PostgreSQL's jsonb
// adds a space).
func payloadN(t testing.TB, p []byte) int {
	t.Helper()
	var v struct{ N *int }
	if err := json.Unmarshal(p, &v); err != nil || v.N == nil {
		t.Errorf("payload %s: %v", p, err)
		return -1
	}
	return *v.N
}
