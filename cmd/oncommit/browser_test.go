package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dashboard"
	"github.com/oncommit/oncommit/outbox"
)

// chromium returns the path of Debian's chromium, skipping the test when
// it is missing, or failing it under CI=true (.ci/run installs it).
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("ONCOMMIT_CHROMIUM"), "/usr/bin/chromium", "chromium"} {
		if p == "" {
			continue
		}
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is required under CI=true: apt-get install -y chromium (.ci/run does)")
	}
	t.Skip("no chromium: apt-get install -y chromium")
	return ""
}

// browser is a tab of headless Chromium with a fresh profile, and the
// console errors and exceptions it has seen.
type browser struct {
	ctx    context.Context
	mu     sync.Mutex
	errors []string
}

func newBrowser(t *testing.T) *browser {
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		// evil.example.com resolves to the test's servers: DNS rebinding.
		chromedp.Flag("host-resolver-rules", "MAP evil.example.com 127.0.0.1"),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1200, 800),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelC(); cancelA() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	b := &browser{ctx: ctx}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				b.mu.Lock()
				b.errors = append(b.errors, m.String()+" at "+m.URL)
				b.mu.Unlock()
			}
		}
	}()
	return b
}

// step runs one step within 20 s; on an error it saves a screenshot in
// the test's artifact directory and fails t.
func (b *browser) step(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.shot(t, what)
		t.Fatalf("%s: %v", what, err)
	}
}

// text returns the text of the first element matching the CSS selector.
func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.shot(t, "text "+sel)
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// eval evaluates a JavaScript expression giving an int.
func (b *browser) eval(t *testing.T, expr string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return n
}

// clickTo clicks the element and waits until the page's address contains
// want and the new page has loaded.
func (b *browser) clickTo(t *testing.T, sel, want string) {
	t.Helper()
	b.step(t, "click "+sel, chromedp.Click(chromedp.CSS(sel)))
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`location.href.includes(`+strconv.Quote(want)+`) && document.readyState === "complete"`))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.shot(t, "after click "+sel)
			t.Fatalf("after clicking %s: the page did not reach %q (%v)", sel, want, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// actOnOne clicks the message page's button of action, checks that the
// confirmation counts one message, confirms, and checks the notice that
// one changed.
func (b *browser) actOnOne(t *testing.T, action string) {
	t.Helper()
	b.clickTo(t, "#act-"+action, "/act")
	if text := b.text(t, "#confirm-text"); !strings.Contains(text, action+" 1 message(s)") {
		t.Errorf("%s's confirmation: %q", action, text)
	}
	b.clickTo(t, "#confirm", "notice=")
	if notice := b.text(t, "#notice"); notice != action+": 1 message(s) changed" {
		t.Errorf("notice %q", notice)
	}
}

func (b *browser) shot(t *testing.T, name string) {
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Logf("screenshot %s: %v", name, err)
		return
	}
	path := filepath.Join(t.ArtifactDir(), strings.NewReplacer(" ", "-", "/", "_", "#", "").Replace(name)+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Logf("screenshot %s: %v", name, err)
		return
	}
	t.Logf("screenshot: %s", path)
}

// screenshotTo writes a screenshot of the page to path (the docs' figures,
// with UPDATE_SCREENSHOTS=1).
func (b *browser) screenshotTo(t *testing.T, path string) {
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (b *browser) noErrors(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.errors) > 0 {
		t.Errorf("the browser console saw: %v", b.errors)
	}
}

const xss = `</script><script>alert(1)</script>`

// TestDashboardInBrowser: in headless Chromium, the dashboard loads with no
// console error, finds a dead message by a filter, redrives it by clicks
// (through the confirmation page) so it leaves the dead list, shows a
// script in a payload, topic and error as text, and a read-only dashboard
// has no action button and refuses forged posts, as the enabled one
// refuses posts from another origin and pages asked for by a name that
// resolves to it (DNS rebinding).
func TestDashboardInBrowser(t *testing.T) {
	d, ob := sqliteOutbox(t)
	odb := sqltx.FromDB(d.pool)
	res := d.seed(t, ob,
		outbox.Message{Topic: "mail", Key: "order-1", Payload: []byte(`{"to":"a@example.com","html":"` + xss + `"}`), Headers: map[string]string{"x": xss}},
		outbox.Message{Topic: "mail", Key: "order-2", Payload: []byte(`{"to":"b@example.com"}`)},
		outbox.Message{Topic: xss, Key: "k"},
		outbox.Message{Topic: "billing", Key: "inv-7", Delay: time.Hour})
	failAll(t, ob, d.pool, "mail", 2)
	failAll(t, ob, d.pool, xss, 1)
	target := res[1].ID // dead, found by its key

	rw, err := dashboard.New(dashboard.Config{Outbox: ob, DB: odb, Actions: true, Title: "Shop outbox", Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	ro, err := dashboard.New(dashboard.Config{Outbox: ob, DB: odb, Title: "Shop outbox"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/", http.StripPrefix("/outbox", rw))
	mux.Handle("/ro/", http.StripPrefix("/ro", ro))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	// Another origin (another port) with forms posting to the dashboards.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><form method="post" action="%[1]s/outbox/act"><input type="hidden" name="action" value="delete"><input type="hidden" name="confirm" value="yes"><input type="hidden" name="id" value="%[2]s"><input type="hidden" name="csrf" value="guess"><button id="forge-rw">win</button></form>
<form method="post" action="%[1]s/ro/act"><input type="hidden" name="action" value="delete"><input type="hidden" name="confirm" value="yes"><input type="hidden" name="id" value="%[2]s"><button id="forge-ro">win</button></form>`, srv.URL, res[0].ID)
	}))
	defer evil.Close()

	b := newBrowser(t)
	b.step(t, "load the stats", chromedp.Navigate(srv.URL+"/outbox/"), chromedp.WaitVisible(chromedp.CSS("#stats")))
	if text := b.text(t, "#stats"); !strings.Contains(text, "mail") || !strings.Contains(text, "billing") || !strings.Contains(text, xss) {
		t.Errorf("stats table: %q", text)
	}
	if purge := b.eval(t, `document.querySelectorAll('#purge-form button#act-purge').length`); purge != 1 {
		t.Errorf("stats page with actions: %d purge buttons, want 1", purge)
	}
	if os.Getenv("UPDATE_SCREENSHOTS") != "" {
		b.screenshotTo(t, "../../docs/dashboard-stats.png")
	}

	// Filter: dead messages of key order-2.
	b.step(t, "open the list", chromedp.Navigate(srv.URL+"/outbox/messages"), chromedp.WaitVisible(chromedp.CSS("#f-state")),
		chromedp.SetValue(chromedp.CSS("#f-state"), "dead"), chromedp.SendKeys(chromedp.CSS("#f-key"), "order-2"))
	b.clickTo(t, "#f-apply", "key=order-2")
	if text := b.text(t, "#messages"); !strings.Contains(text, target.String()) || strings.Contains(text, res[0].ID.String()) {
		t.Fatalf("filtered list: %q, want only %s", text, target)
	}

	// Open it, redrive it, confirm.
	b.clickTo(t, "a.msg", "/message/"+target.String())
	if state := b.text(t, "#msg-state"); state != "dead" {
		t.Errorf("message page state %q", state)
	}
	b.actOnOne(t, "redrive")
	b.step(t, "the dead list after the redrive", chromedp.Navigate(srv.URL+"/outbox/messages?state=dead"), chromedp.WaitVisible(chromedp.CSS("#messages")))
	if text := b.text(t, "#messages"); strings.Contains(text, target.String()) || !strings.Contains(text, res[0].ID.String()) {
		t.Errorf("dead list after the redrive: %q", text)
	}
	if m, err := ob.Get(context.Background(), odb, target); err != nil || m.State != outbox.StatePending {
		t.Errorf("after the redrive: %+v, %v", m, err)
	}

	// The XSS payload, header and topic render as text.
	b.step(t, "the xss message", chromedp.Navigate(srv.URL+"/outbox/message/"+res[0].ID.String()), chromedp.WaitVisible(chromedp.CSS("#msg-payload")))
	payload, headers, scripts := b.text(t, "#msg-payload"), b.text(t, "#msg-headers"), b.eval(t, "document.scripts.length")
	if !strings.Contains(payload, xss) || !strings.Contains(headers, xss) || scripts != 0 {
		t.Errorf("payload %q, headers %q, %d script elements", payload, headers, scripts)
	}
	if os.Getenv("UPDATE_SCREENSHOTS") != "" {
		b.screenshotTo(t, "../../docs/dashboard-message.png")
	}
	b.step(t, "the xss topic", chromedp.Navigate(srv.URL+"/outbox/message/"+res[2].ID.String()), chromedp.WaitVisible(chromedp.CSS("#msg-topic")))
	if topic, scripts := b.text(t, "#msg-topic"), b.eval(t, "document.scripts.length"); topic != xss || scripts != 0 {
		t.Errorf("topic %q, %d script elements", topic, scripts)
	}

	// So far, no console error (the refused posts below log theirs).
	b.noErrors(t)

	// Read-only: no action button anywhere; forged posts refused.
	for _, path := range []string{"/ro/", "/ro/messages?state=dead", "/ro/message/" + res[0].ID.String()} {
		b.step(t, "read-only "+path, chromedp.Navigate(srv.URL+path), chromedp.WaitVisible(chromedp.CSS("main")))
		if forms := b.eval(t, `document.querySelectorAll('form[method=post], button[id^=act-], button[id^=bulk-]').length`); forms != 0 {
			t.Errorf("read-only %s: %d action forms", path, forms)
		}
	}
	for _, c := range []struct{ button, path, refusal string }{{"#forge-ro", "/ro/act", "read-only"}, {"#forge-rw", "/outbox/act", "cross-origin"}} {
		b.step(t, "forged post "+c.button, chromedp.Navigate(evil.URL), chromedp.WaitVisible(chromedp.CSS(c.button)))
		b.clickTo(t, c.button, c.path)
		text := b.text(t, "body")
		if m, err := ob.Get(context.Background(), odb, res[0].ID); err != nil || m.State != outbox.StateDead {
			t.Errorf("after the forged post %s: %+v, %v (page: %q)", c.button, m, err, text)
		}
		if !strings.Contains(strings.ToLower(text), c.refusal) {
			t.Errorf("forged post %s: page %q, want it refused (%s)", c.button, text, c.refusal)
		}
	}
	// DNS rebinding: the dashboard's own address under a name that
	// resolves to it; no page, so no form token, and no button.
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	b.step(t, "rebound list", chromedp.Navigate("http://evil.example.com:"+port+"/outbox/messages?state=dead"), chromedp.WaitVisible(chromedp.CSS("body")))
	if text, forms := b.text(t, "body"), b.eval(t, `document.querySelectorAll('form').length`); !strings.Contains(text, `host "evil.example.com:`+port+`" is not allowed`) || forms != 0 {
		t.Errorf("the list through evil.example.com: %q, %d forms", text, forms)
	}
	if t.Failed() {
		b.shot(t, "final")
	}
}

// TestOrderedDashboardInBrowser: in headless Chromium, the dashboard of an
// Outbox with OrderByKey shows ordered delivery's state: blocked messages
// and keys on the stats page, the blocked state in the list's filter, a
// dead head's page saying it halts its key with the messages behind it
// (listed and linked) and skip and redrive but no delete, a blocked
// message's page naming its head; a bulk delete of the halted key's dead
// messages says why it changes nothing and offers no confirmation; the
// skip goes through and the key goes on. It runs on each database kind in
// turn (one Chromium at a time).
func TestOrderedDashboardInBrowser(t *testing.T) {
	for _, k := range dbKinds {
		t.Run(k.name, func(t *testing.T) { testOrderedDashboard(t, k.open(t)) })
	}
}

func testOrderedDashboard(t *testing.T, d db) {
	d.ok(t, 0, "migrate", "up")
	ob, err := outbox.New(d.dialect, outbox.Config{Table: d.table, OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	odb := sqltx.FromDB(d.pool)
	res := d.seed(t, ob, outbox.Message{Topic: "x", Key: "H"}, outbox.Message{Topic: "x", Key: "H"}, outbox.Message{Topic: "x", Key: "H"},
		outbox.Message{Topic: "y", Key: "G"})
	failAll(t, ob, d.pool, "x", 1) // H's head dies and halts H
	head, blocked := res[0].ID.String(), []string{res[1].ID.String(), res[2].ID.String()}

	dash, err := dashboard.New(dashboard.Config{Outbox: ob, DB: odb, Actions: true, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(dash)
	defer srv.Close()
	b := newBrowser(t)

	b.step(t, "load the stats", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#stats")))
	if th := b.text(t, "#stats thead"); !strings.Contains(th, "Blocked") || !strings.Contains(th, "Blocked keys") || !strings.Contains(th, "Oldest blocked key") {
		t.Errorf("stats header: %q", th)
	}
	if blockedN, keys := b.text(t, "#stats tbody tr td.stat-blocked"), b.text(t, "#stats tbody tr td.stat-blocked-keys"); blockedN != "2" || keys != "1" {
		t.Errorf("stats of x: blocked %q, blocked keys %q; want 2 and 1", blockedN, keys)
	}

	// The list's filter takes the blocked state.
	b.step(t, "open the list", chromedp.Navigate(srv.URL+"/messages"), chromedp.WaitVisible(chromedp.CSS("#f-state")),
		chromedp.SetValue(chromedp.CSS("#f-state"), "blocked"), chromedp.SendKeys(chromedp.CSS("#f-key"), "H"))
	b.clickTo(t, "#f-apply", "state=blocked")
	if text := b.text(t, "#messages"); !strings.Contains(text, blocked[0]) || !strings.Contains(text, blocked[1]) || strings.Contains(text, head) {
		t.Errorf("blocked messages of H: %q", text)
	}

	// The dead head's page.
	b.step(t, "the dead head", chromedp.Navigate(srv.URL+"/message/"+head), chromedp.WaitVisible(chromedp.CSS("#halts-key")))
	if text := b.text(t, "#halts-key"); !strings.Contains(text, "This message halts its key H.") || !strings.Contains(text, "2 message(s) wait behind it") ||
		!strings.Contains(text, "skipped") || !strings.Contains(text, "redriven") || !strings.Contains(text, blocked[0]) || !strings.Contains(text, blocked[1]) {
		t.Errorf("the dead head's page: %q", text)
	}
	if skip, redrive, del := b.eval(t, `document.querySelectorAll('#act-skip').length`), b.eval(t, `document.querySelectorAll('#act-redrive').length`), b.eval(t, `document.querySelectorAll('#act-delete').length`); skip != 1 || redrive != 1 || del != 0 {
		t.Errorf("the dead head's buttons: skip %d, redrive %d, delete %d; want 1, 1, 0", skip, redrive, del)
	}
	if os.Getenv("UPDATE_SCREENSHOTS") != "" && d.name == "sqlite" {
		b.screenshotTo(t, "../../docs/dashboard-halted.png")
	}
	b.clickTo(t, "#behind-link", "state=blocked")
	if text := b.text(t, "#count"); !strings.HasPrefix(text, "2 matching") {
		t.Errorf("the messages behind the head, by its link: %q", text)
	}
	b.step(t, "a blocked message", chromedp.Navigate(srv.URL+"/message/"+blocked[0]), chromedp.WaitVisible(chromedp.CSS("#waits-behind")))
	if text := b.text(t, "#waits-behind"); !strings.Contains(text, head) || !strings.Contains(text, "(dead)") {
		t.Errorf("a blocked message's page: %q", text)
	}
	if forms := b.eval(t, `document.querySelectorAll('button[id^=act-]').length`); forms != 0 {
		t.Errorf("a blocked message's page: %d action buttons, want none", forms)
	}

	// A bulk delete of H's dead messages: nothing would change, and why.
	b.step(t, "H's dead", chromedp.Navigate(srv.URL+"/messages?state=dead&key=H"), chromedp.WaitVisible(chromedp.CSS("#bulk-delete")))
	b.clickTo(t, "#bulk-delete", "/act")
	if text, refused := b.text(t, "#confirm-text"), b.text(t, "#refused"); !strings.Contains(text, "delete would change nothing") ||
		!strings.Contains(refused, "halts its ordered key") || !strings.Contains(refused, "skip it") || !strings.Contains(refused, head) {
		t.Errorf("the bulk delete's page: %q, %q", text, refused)
	}
	if n := b.eval(t, `document.querySelectorAll('#confirm').length`); n != 0 {
		t.Errorf("the bulk delete that would change nothing offers %d confirm buttons", n)
	}
	if m, err := ob.Get(context.Background(), odb, res[0].ID); err != nil || m.State != outbox.StateDead {
		t.Errorf("the head after the refused delete: %+v, %v", m, err)
	}

	// The skip the page offers: the key goes on.
	b.step(t, "the dead head again", chromedp.Navigate(srv.URL+"/message/"+head), chromedp.WaitVisible(chromedp.CSS("#act-skip")))
	b.actOnOne(t, "skip")
	if m, err := ob.Get(context.Background(), odb, res[1].ID); err != nil || m.State != outbox.StatePending {
		t.Errorf("H's next message after the skip: %+v, %v, want pending", m, err)
	}
	b.noErrors(t)
	if t.Failed() {
		b.shot(t, "final")
	}
}
