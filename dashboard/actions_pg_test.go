package dashboard_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"html"
	"io"
	"log/slog"
	"net"
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
	get, post := client(t, h)
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
	w := post(form)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "skip 1 message(s) matching") {
		t.Errorf("skip's confirmation page: %d %s", w.Code, w.Body.String())
	}
	if logged.Len() != 0 {
		t.Errorf("the confirmation page acted: %s", logged.String())
	}
	w = post(confirmForm(t, w.Body.String()))
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
	w = post(pf)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "purge 2 message(s) matching") {
		t.Errorf("purge's confirmation page: %d %s", w.Code, w.Body.String())
	}
	if w := post(confirmForm(t, w.Body.String())); w.Code != http.StatusSeeOther {
		t.Fatalf("purge: %d", w.Code)
	}
	if !strings.Contains(logged.String(), `"filter":"state=dead settled<1h0m0.`) { // and the milliseconds the confirmation took
		t.Errorf("purge's log line: %s", logged.String())
	}
	checkLine(t, &logged, map[string]any{"action": "purge", "actor": "dash:alice", "changed": 2.0})
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

// client returns a GET and a POST to h as a browser on localhost sends
// them (same origin, user alice); get fails t unless the page is served.
func client(t *testing.T, h http.Handler) (get func(path string) string, post func(form url.Values) *httptest.ResponseRecorder) {
	get = func(path string) string {
		t.Helper()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "http://localhost"+path, nil))
		if w.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, w.Code, w.Body.String())
		}
		return w.Body.String()
	}
	post = func(form url.Values) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest("POST", "http://localhost/act", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		req.Header.Set("X-User", "alice")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	return get, post
}

var (
	confirmFormRE = regexp.MustCompile(`(?s)<form method="post" action="[^"]*/act">(.*?)</form>`)
	hiddenRE      = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// confirmForm returns the fields of the confirmation page's form: what
// its "Yes" button posts.
func confirmForm(t *testing.T, page string) url.Values {
	t.Helper()
	m := confirmFormRE.FindStringSubmatch(page)
	if m == nil || !strings.Contains(m[1], `id="confirm"`) {
		t.Fatalf("no confirmation form on the page:\n%s", page)
	}
	form := url.Values{}
	for _, f := range hiddenRE.FindAllStringSubmatch(m[1], -1) {
		form.Set(html.UnescapeString(f[1]), html.UnescapeString(f[2]))
	}
	return form
}

// pgTable migrates a table of its own on PostgreSQL and publishes msgs.
func pgTable(t *testing.T, msgs ...outbox.Message) (ob *outbox.Outbox, pool *sql.DB, table string, res []outbox.Result) {
	t.Helper()
	ctx := context.Background()
	table = pgtest.Schema(t) + ".outbox"
	pool = pgtest.Open(t, "pgx")
	if err := postgres.Migrate(ctx, pool, table); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	return ob, pool, table, publish(t, ob, pool, msgs...)
}

func publish(t *testing.T, ob *outbox.Outbox, pool *sql.DB, msgs ...outbox.Message) []outbox.Result {
	t.Helper()
	tx, err := pool.Begin()
	if err != nil {
		t.Fatal(err)
	}
	res, err := ob.PublishBatch(context.Background(), sqltx.From(tx), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestConfirmActsOnWhatItShowed: a confirmation acts only on the messages
// it counted. A message published after the confirmation page was shown
// makes the confirmation change nothing and show a new page (409) with
// the new count, which then acts; a confirmation without the page's
// digest acts on nothing. A purge deletes only messages settled before
// the cut-off of its count, however long the operator took to confirm.
func TestConfirmActsOnWhatItShowed(t *testing.T) {
	ctx := context.Background()
	ob, pool, table, _ := pgTable(t, outbox.Message{Topic: "x", Delay: time.Hour}, outbox.Message{Topic: "x", Delay: time.Hour})
	db := sqltx.FromDB(pool)
	var logged bytes.Buffer
	h, err := dashboard.New(dashboard.Config{Outbox: ob, DB: db, Actions: true, Logger: slog.New(slog.NewJSONHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	get, post := client(t, h)
	tok := tokenRE.FindStringSubmatch(get("/messages?topic=x"))[1]
	count := func() int64 {
		t.Helper()
		n, err := ob.Count(ctx, db, outbox.Filter{Topic: "x"})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	w := post(url.Values{"csrf": {tok}, "action": {"delete"}, "topic": {"x"}})
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "delete 2 message(s) matching") {
		t.Fatalf("confirmation page: %d %s", w.Code, w.Body.String())
	}
	shown := confirmForm(t, w.Body.String())
	publish(t, ob, pool, outbox.Message{Topic: "x", Delay: time.Hour}) // while the operator reads
	w = post(shown)
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "no longer the ones shown") || !strings.Contains(w.Body.String(), "delete 3 message(s) matching") {
		t.Errorf("confirmation of a changed selection: %d %s", w.Code, w.Body.String())
	}
	if n := count(); n != 3 || logged.Len() != 0 {
		t.Fatalf("the confirmation of 2 messages acted on a selection of 3: %d left, log %s", n, logged.String())
	}
	forged := url.Values{"csrf": {tok}, "action": {"delete"}, "topic": {"x"}, "confirm": {"yes"}}
	if w := post(forged); w.Code != http.StatusConflict || count() != 3 {
		t.Errorf("confirmation without the digest: %d, %d left", w.Code, count())
	}
	w = post(confirmForm(t, w.Body.String()))
	if w.Code != http.StatusSeeOther || !strings.Contains(w.Header().Get("Location"), url.QueryEscape("delete: 3 message(s) changed")) || count() != 0 {
		t.Errorf("confirmation of the new page: %d %v, %d left", w.Code, w.Header(), count())
	}
	checkLine(t, &logged, map[string]any{"action": "delete", "filter": `ids=3 topic="x"`, "changed": 3.0})

	// Purge: the page was shown ten minutes ago (as_of), when the message
	// settled 65 minutes ago now was 55 minutes old.
	res := publish(t, ob, pool, outbox.Message{Topic: "p"}, outbox.Message{Topic: "p"})
	for i, age := range []string{"2 hours", "65 minutes"} {
		if _, err := pool.Exec(`UPDATE `+table+` SET state = 'dead', settled_at = now() - interval '`+age+`' WHERE id = $1`, res[i].ID.String()); err != nil {
			t.Fatal(err)
		}
	}
	pf := url.Values{"csrf": {tok}, "action": {"purge"}, "purge_states": {"dead"}, "older_than": {"1h"}, "confirm": {"yes"}}
	for _, asOf := range []string{"", "yesterday", time.Now().Add(time.Hour).Format(time.RFC3339Nano)} {
		pf.Set("as_of", asOf)
		if w := post(pf); w.Code != http.StatusBadRequest {
			t.Errorf("purge with as_of %q: %d, want 400", asOf, w.Code)
		}
	}
	pf.Set("as_of", time.Now().Add(-10*time.Minute).Format(time.RFC3339Nano))
	if w := post(pf); w.Code != http.StatusSeeOther || !strings.Contains(w.Header().Get("Location"), url.QueryEscape("purge: 1 message(s) deleted")) {
		t.Errorf("purge: %d %v", w.Code, w.Header())
	}
	if _, err := ob.Get(ctx, db, res[0].ID); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("the message settled 2 hours ago: %v, want it purged", err)
	}
	if m, err := ob.Get(ctx, db, res[1].ID); err != nil || m.State != outbox.StateDead {
		t.Errorf("the message 55 minutes old when the purge was shown: %v %v, want it kept", m.State, err)
	}
}

// TestDNSRebinding: a site whose name resolves to the dashboard's address
// (DNS rebinding: a browser then sends that name as Host, and an Origin
// equal to it, which passes the cross-origin check) can neither read a
// page with its form token nor post a confirmation: 421, and the message
// stays. The same confirmation posted on 127.0.0.1 acts.
func TestDNSRebinding(t *testing.T) {
	ob, pool, _, res := pgTable(t, outbox.Message{Topic: "x", Delay: time.Hour})
	h, err := dashboard.New(dashboard.Config{Outbox: ob, DB: sqltx.FromDB(pool), Actions: true, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	// evil.example.com resolves to the server's address.
	evil := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
	}}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer evil.CloseIdleConnections()
	do := func(c *http.Client, origin string, form url.Values) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", origin+"/messages?topic=x", nil)
		if form != nil {
			req, err = http.NewRequest("POST", origin+"/act", strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", origin)
		}
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, page := do(srv.Client(), srv.URL, nil)
	m := tokenRE.FindStringSubmatch(page)
	if code != http.StatusOK || m == nil {
		t.Fatalf("list on %s: %d, token %v", srv.URL, code, m)
	}
	code, body := do(srv.Client(), srv.URL, url.Values{"csrf": {m[1]}, "action": {"delete"}, "id": {res[0].ID.String()}})
	if code != http.StatusOK {
		t.Fatalf("confirmation page: %d %s", code, body)
	}
	confirm := confirmForm(t, body)

	rebound := "http://evil.example.com:" + port
	if code, page := do(evil, rebound, nil); code != http.StatusMisdirectedRequest || tokenRE.MatchString(page) {
		t.Errorf("list through %s: %d %q, want 421 without the form token", rebound, code, page)
	}
	if code, body := do(evil, rebound, confirm); code != http.StatusMisdirectedRequest {
		t.Errorf("confirmation posted through %s: %d %q, want 421", rebound, code, body)
	}
	if _, err := ob.Get(context.Background(), sqltx.FromDB(pool), res[0].ID); err != nil {
		t.Fatalf("after the rebound post: %v, want the message there", err)
	}
	if code, body := do(srv.Client(), srv.URL, confirm); code != http.StatusOK || !strings.Contains(body, "delete: 1 message(s) changed") {
		t.Errorf("the same confirmation on %s: %d %q", srv.URL, code, body)
	}
}

// TestSubscribersOnPostgres: with a topic of two subscribers, the stats
// page has a Subscriber column and a row per subscriber, linking to that
// subscriber's messages; the list takes ?subscriber= (and its form
// keeps it) and shows each copy's subscriber; a message's page names its
// subscriber; a bulk redrive from a list filtered by subscriber changes
// only that subscriber's dead copies, and its log line says so.
func TestSubscribersOnPostgres(t *testing.T) {
	ctx := context.Background()
	table := pgtest.Schema(t) + ".outbox"
	pool := pgtest.Open(t, "pgx")
	if err := postgres.Migrate(ctx, pool, table); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: table, Subscribers: map[string][]string{"order.placed": {"mail", "fwd"}}})
	if err != nil {
		t.Fatal(err)
	}
	db := sqltx.FromDB(pool)
	publish(t, ob, pool, outbox.Message{Topic: "order.placed", Key: "k1"}, outbox.Message{Topic: "order.placed", Key: "k2"}, outbox.Message{Topic: "audit", Key: "a"})
	// Dead: mail's two copies and fwd's of k1.
	copies := func(f outbox.Filter) []outbox.MessageInfo {
		t.Helper()
		p, err := ob.List(ctx, db, f, 100)
		if err != nil {
			t.Fatal(err)
		}
		return p.Messages
	}
	mail := copies(outbox.Filter{Subscriber: "mail"})
	fwd1 := copies(outbox.Filter{Subscriber: "fwd", Key: "k1"})
	if len(mail) != 2 || len(fwd1) != 1 || mail[0].Subscriber != "mail" || mail[0].Key != "k1" || fwd1[0].Subscriber != "fwd" {
		t.Fatalf("copies: mail %+v, fwd's of k1 %+v", mail, fwd1)
	}
	for _, m := range append(mail, fwd1...) {
		if _, err := pool.Exec(`UPDATE `+table+` SET state = 'dead', settled_at = now(), last_error = 'down' WHERE id = $1`, m.ID.String()); err != nil {
			t.Fatal(err)
		}
	}
	var logged bytes.Buffer
	h, err := dashboard.New(dashboard.Config{Outbox: ob, DB: db, Actions: true, Logger: slog.New(slog.NewJSONHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	get, post := client(t, h)

	page := get("/")
	for _, w := range []string{"<th>Subscriber</th>", `<td class="subscriber"></td>`, // audit's row
		`href="/messages?topic=order.placed&amp;subscriber=mail">mail</a>`, `href="/messages?state=dead&amp;topic=order.placed&amp;subscriber=mail">2</a>`,
		`href="/messages?topic=order.placed&amp;subscriber=fwd">fwd</a>`, `href="/messages?state=dead&amp;topic=order.placed&amp;subscriber=fwd">1</a>`} {
		if !strings.Contains(page, w) {
			t.Errorf("stats page lacks %s", w)
		}
	}
	if strings.Index(page, ">fwd</a>") > strings.Index(page, ">mail</a>") {
		t.Error("stats page: mail's row before fwd's")
	}

	page = get("/messages?subscriber=mail")
	if !strings.Contains(page, `id="f-subscriber" value="mail"`) || !strings.Contains(page, `<p id="count">2 matching.`) ||
		strings.Count(page, `<td class="subscriber">mail</td>`) != 2 || strings.Contains(page, `<td class="subscriber">fwd</td>`) {
		t.Errorf("list of mail's copies:\n%s", page)
	}
	if page := get("/messages?topic=audit"); strings.Contains(page, "<th>Subscriber</th>") {
		t.Errorf("list without copies has a Subscriber column:\n%s", page)
	}
	if page := get("/message/" + mail[0].ID.String()); !strings.Contains(page, `<dd id="msg-subscriber">mail</dd>`) {
		t.Errorf("page of mail's copy lacks its subscriber:\n%s", page)
	}
	if page := get("/message/" + copies(outbox.Filter{Topic: "audit"})[0].ID.String()); strings.Contains(page, "msg-subscriber") {
		t.Error("page of a message without subscribers names one")
	}

	// Redrive the dead list of mail: mail's copies only.
	page = get("/messages?state=dead&subscriber=mail")
	tok := tokenRE.FindStringSubmatch(page)[1]
	if !strings.Contains(page, `name="subscriber" value="mail"`) {
		t.Errorf("the bulk actions' forms do not carry the subscriber:\n%s", page)
	}
	w := post(url.Values{"csrf": {tok}, "action": {"redrive"}, "state": {"dead"}, "subscriber": {"mail"}})
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "redrive 2 message(s) matching") {
		t.Fatalf("redrive's confirmation page: %d %s", w.Code, w.Body.String())
	}
	w = post(confirmForm(t, w.Body.String()))
	if w.Code != http.StatusSeeOther || !strings.Contains(w.Header().Get("Location"), "subscriber=mail") {
		t.Fatalf("redrive: %d %v", w.Code, w.Header())
	}
	checkLine(t, &logged, map[string]any{"action": "redrive", "filter": `ids=2 state=dead subscriber="mail"`, "changed": 2.0})
	for _, m := range mail {
		if got, err := ob.Get(ctx, db, m.ID); err != nil || got.State != outbox.StatePending {
			t.Errorf("mail's copy of %s after the redrive: %v %v, want pending", m.Key, got.State, err)
		}
	}
	if got, err := ob.Get(ctx, db, fwd1[0].ID); err != nil || got.State != outbox.StateDead {
		t.Errorf("fwd's copy of k1 after mail's redrive: %v %v, want dead", got.State, err)
	}
}

// TestSubscriberKeyOnPostgres: with ordered delivery, each subscriber's
// copies of a key have an order of their own: the page of a subscriber's
// head counts and lists the copies of that subscriber behind it, not the
// other's, and links to the blocked list of the key and subscriber.
func TestSubscriberKeyOnPostgres(t *testing.T) {
	ctx := context.Background()
	table := pgtest.Schema(t) + ".outbox"
	pool := pgtest.Open(t, "pgx")
	if err := postgres.Migrate(ctx, pool, table); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: table, OrderByKey: true, Subscribers: map[string][]string{"o": {"mail", "fwd"}}})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, ob, pool, outbox.Message{Topic: "o", Key: "k"}, outbox.Message{Topic: "o", Key: "k"}, outbox.Message{Topic: "o", Key: "k"})
	db := sqltx.FromDB(pool)
	p, err := ob.List(ctx, db, outbox.Filter{Subscriber: "mail"}, 10)
	if err != nil || len(p.Messages) != 3 {
		t.Fatalf("mail's copies: %v %v", p.Messages, err)
	}
	h, err := dashboard.New(dashboard.Config{Outbox: ob, DB: db})
	if err != nil {
		t.Fatal(err)
	}
	get, _ := client(t, h)
	page := get("/message/" + p.Messages[0].ID.String())
	if !strings.Contains(page, `href="/messages?state=blocked&amp;key=k&amp;subscriber=mail">2 message(s) wait behind it`) ||
		!strings.Contains(page, p.Messages[1].ID.String()) || !strings.Contains(page, p.Messages[2].ID.String()) || strings.Count(page, `class="msg"`) != 2 {
		t.Errorf("page of mail's head of k:\n%s", page)
	}
	if page := get("/message/" + p.Messages[1].ID.String()); !strings.Contains(page, `id="waits-behind"`) || !strings.Contains(page, p.Messages[0].ID.String()) {
		t.Errorf("page of a copy blocked behind mail's head:\n%s", page)
	}
}
