package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dashboard"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

var tokenRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// TestSkipAndPurgeOnPostgres: the page of a dead message that halts its
// ordered key offers skip (and no delete); the skip goes through the
// confirmation page with the form token, skips the head (the key goes on)
// and is logged with the actor Config.Actor finds in the request; the
// stats page's purge form deletes the skipped message the same way.
func TestSkipAndPurgeOnPostgres(t *testing.T) {
	ctx := context.Background()
	table := pgtest.Schema(t) + ".outbox"
	pool := pgtest.Open(t, "pgx")
	if err := postgres.Migrate(ctx, pool, table); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: table, OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	db := sqltx.FromDB(pool)
	tx, err := pool.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{{Topic: "x", Key: "H"}, {Topic: "x", Key: "H"}, {Topic: "y", Key: "u"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// A relay whose handler dead-letters: H's head halts H; u (topic y)
	// dies too, under ContinueKey, and halts nothing.
	r, err := ob.Relay(db, outbox.RelayConfig{Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), PollInterval: 20 * time.Millisecond, DeadKeysByTopic: map[string]outbox.DeadKeyPolicy{"y": outbox.ContinueKey}})
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"x", "y"} {
		_ = r.Handle(topic, func(context.Context, outbox.Delivery) error { return outbox.DeadLetter(errors.New("poison")) })
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := ob.Count(ctx, db, outbox.Filter{States: []outbox.State{outbox.StateDead}})
		if err == nil && n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not dead in time: %d %v", n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	var logged bytes.Buffer
	h, err := dashboard.New(dashboard.Config{Outbox: ob, DB: db, Actions: true,
		Logger: slog.New(slog.NewJSONHandler(&logged, nil)),
		Actor:  func(r *http.Request) string { return "dash:" + r.Header.Get("X-User") }})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) string {
		t.Helper()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		if w.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, w.Code, w.Body.String())
		}
		return w.Body.String()
	}
	post := func(form url.Values) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest("POST", "/act", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		req.Header.Set("X-User", "alice")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	page := get("/message/" + res[0].ID.String())
	if !strings.Contains(page, `id="act-skip"`) || strings.Contains(page, `id="act-delete"`) {
		t.Errorf("halted head's page: want a skip button and no delete:\n%s", page)
	}
	if page := get("/message/" + res[2].ID.String()); strings.Contains(page, `id="act-skip"`) || !strings.Contains(page, `id="act-delete"`) {
		t.Errorf("page of a dead message that halts nothing: want delete and no skip")
	}
	m := tokenRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no form token on the page")
	}
	form := url.Values{"csrf": {m[1]}, "action": {"skip"}, "id": {res[0].ID.String()}}
	if w := post(url.Values{"action": {"skip"}, "id": {res[0].ID.String()}, "confirm": {"yes"}}); w.Code != http.StatusForbidden {
		t.Errorf("skip without the token: %d", w.Code)
	}
	if w := post(form); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "skip 1 message(s) matching") {
		t.Errorf("skip's confirmation page: %d %s", w.Code, w.Body.String())
	}
	if logged.Len() != 0 {
		t.Errorf("the confirmation page acted: %s", logged.String())
	}
	form.Set("confirm", "yes")
	w := post(form)
	if w.Code != http.StatusSeeOther || !strings.Contains(w.Header().Get("Location"), url.QueryEscape("skip: 1 message(s) changed")) {
		t.Fatalf("skip: %d %v", w.Code, w.Header())
	}
	checkLine(t, &logged, map[string]any{"action": "skip", "actor": "dash:alice", "filter": "id=" + res[0].ID.String(), "changed": 1.0})
	if got, err := ob.Get(ctx, db, res[1].ID); err != nil || got.State != outbox.StatePending {
		t.Errorf("H's next message after the skip: %v %v, want pending", got.State, err)
	}
	// Purge from the stats page: confirmation, then the skipped message
	// and u's (settled dead) go.
	if page := get("/"); !strings.Contains(page, `id="act-purge"`) {
		t.Error("no purge form on the stats page")
	}
	if _, err := pool.Exec(`UPDATE ` + table + ` SET settled_at = now() - interval '2 hours' WHERE state = 'dead'`); err != nil {
		t.Fatal(err)
	}
	pf := url.Values{"csrf": {m[1]}, "action": {"purge"}, "purge_states": {"dead"}, "older_than": {"1h"}}
	if w := post(url.Values{"csrf": {m[1]}, "action": {"purge"}, "purge_states": {"pending"}, "older_than": {"1h"}}); w.Code != http.StatusBadRequest {
		t.Errorf("purge of pending messages: %d", w.Code)
	}
	if w := post(pf); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "purge 2 message(s) matching") {
		t.Errorf("purge's confirmation page: %d %s", w.Code, w.Body.String())
	}
	pf.Set("confirm", "yes")
	if w := post(pf); w.Code != http.StatusSeeOther {
		t.Fatalf("purge: %d", w.Code)
	}
	checkLine(t, &logged, map[string]any{"action": "purge", "actor": "dash:alice", "filter": "state=dead settled<1h0m0s ago", "changed": 2.0})
	if n, err := ob.Count(ctx, db, outbox.Filter{States: []outbox.State{outbox.StateDead}}); err != nil || n != 0 {
		t.Errorf("dead after the purge: %d %v", n, err)
	}
}

// checkLine checks the one log line in b and empties b.
func checkLine(t *testing.T, b *bytes.Buffer, want map[string]any) {
	t.Helper()
	var line map[string]any
	if err := json.Unmarshal(b.Bytes(), &line); err != nil {
		t.Fatalf("log line %q: %v", b.String(), err)
	}
	if line["msg"] != "outbox: operator action" {
		t.Errorf("log line %v", line)
	}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("log line's %s: %v, want %v (%s)", k, line[k], v, b.String())
		}
	}
	b.Reset()
}
