// Package dashboard is a web page for operators of an oncommit outbox: per
// topic counts (per subscriber of a topic with subscribers) with the age
// of the oldest due message (with ordered delivery, the blocked messages
// and keys too), a chart of the queue depth over the last hour, lists of
// messages by state, topic, subscriber, key, error text and time, each
// message's subscriber, payload, headers and last error (and its
// place in its ordered key: a dead head says it halts its key and lists
// what waits behind it), and, when the service enables them, buttons that
// redrive, retry, delete, skip (the dead head of an ordered key) and purge
// messages. A confirmation says which of the selected messages an action
// leaves alone, and why.
//
// It is an [http.Handler] a service mounts behind its own authentication:
//
//	dash, err := dashboard.New(dashboard.Config{Outbox: ob, DB: sqltx.FromDB(db)})
//	...
//	mux.Handle("/outbox/", requireAdmin(http.StripPrefix("/outbox", dash)))
//
// It is read-only unless Config.Actions is true: then actions are POST
// forms, refused from other origins ([http.CrossOriginProtection]) and
// without the page's token, and each asks for a confirmation page before
// it changes anything; the confirmation acts only on the messages it
// counted, and shows a new one when they changed. It answers only
// requests whose Host names localhost, a loopback address, the address
// the request arrived on or one of Config.AllowedHosts (421 otherwise), so
// a site whose name an attacker points at 127.0.0.1 (DNS rebinding) can
// neither read its pages nor post its forms. It has no authentication of
// its own: with actions, serve it on a loopback address only, or behind
// authentication. Everything a message holds is escaped by html/template;
// the page uses no JavaScript and loads nothing from elsewhere (its one
// stylesheet is embedded).
package dashboard

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oncommit/oncommit/internal/opfmt"
	"github.com/oncommit/oncommit/outbox"
)

//go:embed templates/*.html static/*
var files embed.FS

// DefaultSampleEvery is the default of Config.SampleEvery.
const DefaultSampleEvery = 30 * time.Second

// Config configures a dashboard. Outbox and DB are required.
type Config struct {
	// Outbox is the outbox whose table is shown.
	Outbox *outbox.Outbox
	// DB is the pool the dashboard reads (and acts) through.
	DB outbox.DB
	// Actions enables the redrive, retry, delete, skip and purge buttons.
	// Anyone who reaches the handler can then use them: mount it behind
	// authentication, or serve it on a loopback address only. Defaults to
	// false: read-only, and every POST is refused.
	Actions bool
	// AllowedHosts are the host names (or IP addresses), without a port,
	// that a request's Host header may name beyond those always allowed:
	// localhost and the names under .localhost, the loopback addresses,
	// and the address the request arrived on. A request naming another
	// host is refused (421 Misdirected Request) before it reaches a page
	// or an action, so that a page on a name an attacker resolves to this
	// server (DNS rebinding) cannot read the pages or post their forms.
	// List the names the dashboard is reached by ("ops.example.com"), or
	// "*" for every host when a proxy in front checks the Host itself.
	// Defaults to none beyond those always allowed.
	AllowedHosts []string
	// Actor returns who makes a request, for the log line of each action
	// (see outbox.ActOptions): the user the service's authentication
	// found, say. Defaults to a function returning "dashboard".
	Actor func(*http.Request) string
	// Logger receives the actions' log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// Title heads every page. Defaults to "Outbox".
	Title string
	// SampleEvery is the least time between two samples of the queue
	// depth for the chart; a sample is taken when a page is served or by
	// [Handler.Sample]. Defaults to DefaultSampleEvery.
	SampleEvery time.Duration
}

// Handler serves the dashboard. Build one with [New].
type Handler struct {
	cfg   Config
	hosts map[string]bool
	tmpl  *template.Template
	mux   *http.ServeMux
	csrf  string
	mu    sync.Mutex
	depth []sample
}

type sample struct {
	at time.Time
	n  int64
}

// New returns the dashboard of cfg.Outbox's table.
func New(cfg Config) (*Handler, error) {
	if cfg.Outbox == nil {
		return nil, &outbox.ConfigError{Field: "Outbox", Reason: "is required"}
	}
	if cfg.DB == nil {
		return nil, &outbox.ConfigError{Field: "DB", Reason: "is required"}
	}
	if cfg.SampleEvery < 0 {
		return nil, &outbox.ConfigError{Field: "SampleEvery", Reason: "must not be negative"}
	}
	if err := checkHosts(cfg.AllowedHosts); err != nil {
		return nil, err
	}
	if cfg.SampleEvery == 0 {
		cfg.SampleEvery = DefaultSampleEvery
	}
	if cfg.Title == "" {
		cfg.Title = "Outbox"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Actor == nil {
		cfg.Actor = func(*http.Request) string { return "dashboard" }
	}
	tmpl, err := template.New("").Funcs(funcs).ParseFS(files, "templates/*.html")
	if err != nil {
		return nil, err
	}
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	h := &Handler{cfg: cfg, hosts: hostSet(cfg.AllowedHosts), tmpl: tmpl, mux: http.NewServeMux(), csrf: hex.EncodeToString(tok[:])}
	static, _ := fs.Sub(files, "static")
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /{$}", h.index)
	h.mux.HandleFunc("GET /messages", h.list)
	h.mux.HandleFunc("GET /message/{id}", h.message)
	act := http.NewCrossOriginProtection().Handler(http.HandlerFunc(h.act))
	h.mux.HandleFunc("POST /act", func(w http.ResponseWriter, r *http.Request) {
		if !h.cfg.Actions {
			http.Error(w, "dashboard: read-only (actions are not enabled)", http.StatusForbidden)
			return
		}
		act.ServeHTTP(w, r)
	})
	return h, nil
}

// ServeHTTP serves the dashboard's pages. Mount it with or without
// http.StripPrefix: links are made relative to where it is mounted. A
// request whose Host is not allowed (see Config.AllowedHosts) gets 421.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	if !h.hostAllowed(r) {
		http.Error(w, fmt.Sprintf("dashboard: host %q is not allowed (see Config.AllowedHosts, oncommit serve --allowed-hosts)", r.Host), http.StatusMisdirectedRequest)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// Sample records the queue depth for the chart now, unless a sample is
// younger than Config.SampleEvery. A service that wants a full chart
// without visitors calls it on a ticker.
func (h *Handler) Sample(ctx context.Context) error {
	st, err := h.cfg.Outbox.Stats(ctx, h.cfg.DB)
	if err != nil {
		return err
	}
	h.record(st)
	return nil
}

func (h *Handler) record(st []outbox.TopicStats) {
	var n int64
	for _, s := range st {
		n += s.Pending + s.Blocked + s.Processing
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if k := len(h.depth); k > 0 && now.Sub(h.depth[k-1].at) < h.cfg.SampleEvery {
		return
	}
	h.depth = append(h.depth, sample{now, n})
	for len(h.depth) > 0 && now.Sub(h.depth[0].at) > time.Hour {
		h.depth = h.depth[1:]
	}
}

// page is what every template gets.
type page struct {
	Title, Base, Table, CSRF, Notice, Error string
	Actions                                 bool
	// Ordered: the Outbox orders by key; the stats show blocked
	// messages and keys.
	Ordered bool
	Stats   []outbox.TopicStats
	// Subscribers: some row of Stats, or some message of Page, is a
	// subscriber's; the table has a Subscriber column.
	Subscribers             bool
	Chart                   *chart
	Q                       map[string]string
	States                  []outbox.State
	Count                   int64
	Page                    outbox.Page
	NextURL                 string
	BulkActions, MsgActions []string
	M                       outbox.MessageInfo
	Action, What, Back      string
	PurgeAges               []string
	// Refused: the messages an action leaves alone, and why.
	Refused []outbox.Refusal
	// Key is the message's key's state (ordered messages); Behind the
	// first of the messages blocked behind a head.
	Key    outbox.KeyState
	Behind []outbox.MessageInfo
}

// base is the path the handler is mounted at: the request's path without
// the part the handler sees (http.StripPrefix keeps RequestURI).
func base(r *http.Request) string {
	full := r.URL.Path
	if u, err := url.ParseRequestURI(r.RequestURI); err == nil {
		full = u.Path
	}
	return strings.TrimSuffix(full, r.URL.Path)
}

func (h *Handler) newPage(r *http.Request) *page {
	return &page{Title: h.cfg.Title, Base: base(r), Table: h.cfg.Outbox.Table().String(), CSRF: h.csrf, Actions: h.cfg.Actions,
		Ordered: h.cfg.Outbox.OrdersByKey(), Notice: r.URL.Query().Get("notice")}
}

func (h *Handler) render(w http.ResponseWriter, status int, name string, p *page) {
	var b bytes.Buffer
	if err := h.tmpl.ExecuteTemplate(&b, name, p); err != nil {
		http.Error(w, "dashboard: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = b.WriteTo(w)
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	p := h.newPage(r)
	p.Error = err.Error()
	status := http.StatusInternalServerError
	if errors.Is(err, outbox.ErrInvalidFilter) {
		status = http.StatusBadRequest
	} else if errors.Is(err, outbox.ErrNotFound) {
		status = http.StatusNotFound
	}
	h.render(w, status, "index", p)
}

func (h *Handler) index(w http.ResponseWriter, r *http.Request) {
	st, err := h.cfg.Outbox.Stats(r.Context(), h.cfg.DB)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.record(st)
	p := h.newPage(r)
	p.Stats = st
	p.Subscribers = slices.ContainsFunc(st, func(s outbox.TopicStats) bool { return s.Subscriber != "" })
	p.PurgeAges = purgeAges
	h.mu.Lock()
	p.Chart = newChart(h.depth, time.Now(), h.cfg.SampleEvery)
	h.mu.Unlock()
	h.render(w, http.StatusOK, "index", p)
}

// filterKeys are the query parameters of a filter.
var filterKeys = []string{"id", "state", "topic", "subscriber", "key", "error", "created_from", "created_to", "settled_from", "settled_to"}

// query returns the filter parameters of v that are set.
func query(v url.Values) map[string]string {
	q := map[string]string{}
	for _, k := range filterKeys {
		if s := strings.TrimSpace(v.Get(k)); s != "" {
			q[k] = s
		}
	}
	return q
}

// parseFilter turns the parameters into a filter; a bad value is a
// *outbox.FilterError.
func parseFilter(q map[string]string) (outbox.Filter, error) {
	f := outbox.Filter{Topic: q["topic"], Subscriber: q["subscriber"], Key: q["key"], ErrorContains: q["error"]}
	if s := q["id"]; s != "" {
		for _, part := range strings.Fields(strings.ReplaceAll(s, ",", " ")) {
			id, err := outbox.ParseID(part)
			if err != nil {
				return f, &outbox.FilterError{Field: "IDs", Reason: err.Error()}
			}
			f.IDs = append(f.IDs, id)
		}
	}
	if s := q["state"]; s != "" {
		for _, st := range strings.Split(s, ",") {
			f.States = append(f.States, outbox.State(strings.TrimSpace(st)))
		}
	}
	for _, c := range []struct {
		key, field string
		to         *time.Time
	}{{"created_from", "CreatedFrom", &f.CreatedFrom}, {"created_to", "CreatedTo", &f.CreatedTo}, {"settled_from", "SettledFrom", &f.SettledFrom}, {"settled_to", "SettledTo", &f.SettledTo}} {
		if s := q[c.key]; s != "" {
			at, err := time.Parse(time.RFC3339, s)
			if err != nil {
				return f, &outbox.FilterError{Field: c.field, Reason: "want a time such as 2006-01-02T15:04:05Z"}
			}
			*c.to = at
		}
	}
	return f, nil
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	q := query(r.URL.Query())
	f, err := parseFilter(q)
	if err == nil && r.URL.Query().Get("after") != "" {
		f.After, err = outbox.ParseID(r.URL.Query().Get("after"))
		if err != nil {
			err = &outbox.FilterError{Field: "After", Reason: err.Error()}
		}
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx := r.Context()
	pg, err := h.cfg.Outbox.List(ctx, h.cfg.DB, f, outbox.DefaultPageSize)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	cf := f
	cf.After = outbox.ID{}
	n, err := h.cfg.Outbox.Count(ctx, h.cfg.DB, cf)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	p := h.newPage(r)
	p.Q, p.Page, p.Count = q, pg, n
	p.Subscribers = slices.ContainsFunc(pg.Messages, func(m outbox.MessageInfo) bool { return m.Subscriber != "" })
	p.States = []outbox.State{outbox.StatePending, outbox.StateBlocked, outbox.StateProcessing, outbox.StateDead, outbox.StateDelivered}
	if !pg.Next.IsZero() {
		v := url.Values{}
		for k, s := range q {
			v.Set(k, s)
		}
		v.Set("after", pg.Next.String())
		p.NextURL = p.Base + "/messages?" + v.Encode()
	}
	if len(q) > 0 {
		p.BulkActions = actionsFor(f.States)
	}
	h.render(w, http.StatusOK, "list", p)
}

// actionsFor returns the actions that may change messages in states (any
// state when empty).
func actionsFor(states []outbox.State) []string {
	var out []string
	has := func(s outbox.State) bool {
		if len(states) == 0 {
			return true
		}
		for _, x := range states {
			if x == s {
				return true
			}
		}
		return false
	}
	if has(outbox.StateDead) {
		out = append(out, "redrive")
	}
	if has(outbox.StatePending) {
		out = append(out, "retry")
	}
	if has(outbox.StatePending) || has(outbox.StateDead) || has(outbox.StateDelivered) {
		out = append(out, "delete")
	}
	return out
}

func (h *Handler) message(w http.ResponseWriter, r *http.Request) {
	id, err := outbox.ParseID(r.PathValue("id"))
	if err != nil {
		h.fail(w, r, &outbox.FilterError{Field: "IDs", Reason: err.Error()})
		return
	}
	m, err := h.cfg.Outbox.Get(r.Context(), h.cfg.DB, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	p := h.newPage(r)
	p.M = m
	p.Q = map[string]string{"id": m.ID.String()}
	if m.KeySeq != 0 && (m.Subscriber == "" || m.Key != "") {
		// An ordered message: its key's head, and what waits behind it
		// (a subscriber's copy: in its subscriber's order of the key).
		if p.Key, err = h.cfg.Outbox.SubscriberKeyState(r.Context(), h.cfg.DB, m.Subscriber, m.Key); err == nil && p.Key.Head.ID == m.ID && p.Key.Blocked > 0 {
			var pg outbox.Page
			pg, err = h.cfg.Outbox.List(r.Context(), h.cfg.DB, outbox.Filter{Key: m.Key, Subscriber: m.Subscriber, States: []outbox.State{outbox.StateBlocked}}, behindShown)
			p.Behind = pg.Messages
		}
		if err != nil {
			h.fail(w, r, err)
			return
		}
	}
	switch {
	case m.HaltsKey() && h.cfg.Outbox.OrdersByKey():
		// A halted head: skip it (the key goes on) or redrive it;
		// deleting it would leave its key waiting forever, and
		// Outbox.Act refuses to.
		p.MsgActions = []string{"skip", "redrive"}
	case m.HaltsKey():
		p.MsgActions = []string{"redrive"}
	case m.State == outbox.StateDead:
		p.MsgActions = []string{"redrive", "delete"}
	case m.State == outbox.StatePending && m.KeySeq != 0:
		p.MsgActions = []string{"retry"} // its key's head: no delete
	case m.State == outbox.StatePending:
		p.MsgActions = []string{"retry", "delete"}
	case m.State == outbox.StateDelivered:
		p.MsgActions = []string{"delete"}
	}
	h.render(w, http.StatusOK, "message", p)
}

// behindShown is how many of the messages blocked behind a head its page
// lists.
const behindShown = 10

var actions = map[string]outbox.Action{"redrive": outbox.ActRedrive, "retry": outbox.ActRetry, "delete": outbox.ActDelete, "skip": outbox.ActSkip}

// purgeAges are the choices of the stats page's purge form.
var purgeAges = []string{"1h", "24h", "168h", "720h"}

// purgeStates are the states the purge form offers.
var purgeStates = map[string][]outbox.State{
	"dead,delivered": {outbox.StateDead, outbox.StateDelivered},
	"dead":           {outbox.StateDead},
	"delivered":      {outbox.StateDelivered},
}

// purge runs the stats page's purge form: a confirmation page with how
// many messages it would delete, then the purge, logged with the actor.
// The confirmation carries the time of its count (as_of), and the purge
// deletes only messages settled before as_of less the age: none that
// grew old enough while the operator read the page.
func (h *Handler) purge(w http.ResponseWriter, r *http.Request) {
	age, states := r.PostForm.Get("older_than"), r.PostForm.Get("purge_states")
	ss, ok := purgeStates[states]
	if !ok || !slices.Contains(purgeAges, age) {
		http.Error(w, "dashboard: purge: unknown age or states", http.StatusBadRequest)
		return
	}
	older, _ := time.ParseDuration(age)
	ctx := r.Context()
	if r.PostForm.Get("confirm") != "yes" {
		asOf := time.Now()
		n, err := h.cfg.Outbox.Count(ctx, h.cfg.DB, outbox.Filter{States: ss, SettledTo: asOf.Add(-older)})
		if err != nil {
			h.fail(w, r, err)
			return
		}
		p := h.newPage(r)
		p.Action, p.Count, p.What, p.Back = "purge", n, opfmt.Purge(ss, older), base(r)+"/"
		p.Q = map[string]string{"older_than": age, "purge_states": states, "as_of": asOf.UTC().Format(time.RFC3339Nano)}
		h.render(w, http.StatusOK, "confirm", p)
		return
	}
	asOf, err := time.Parse(time.RFC3339Nano, r.PostForm.Get("as_of"))
	if err != nil || asOf.After(time.Now()) {
		http.Error(w, "dashboard: purge: missing or bad as_of (the time of the confirmation's count)", http.StatusBadRequest)
		return
	}
	// Rounded up: a cut-off no later than as_of less the age.
	older = (older + time.Since(asOf) + time.Millisecond - 1).Truncate(time.Millisecond)
	n, err := h.cfg.Outbox.Purge(ctx, h.cfg.DB, outbox.PurgeOptions{States: ss, OlderThan: older,
		Operator: &outbox.ActOptions{Actor: h.cfg.Actor(r), Logger: h.cfg.Logger}})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	http.Redirect(w, r, base(r)+"/?notice="+url.QueryEscape(fmt.Sprintf("purge: %d message(s) deleted", n)), http.StatusSeeOther)
}

// selection returns the digest of an action on ids selected by f, which
// a confirmation page carries: the confirmation acts only when the
// messages the action would change are still the ones it counted.
func selection(action string, f outbox.Filter, ids []outbox.ID) string {
	d := sha256.New()
	fmt.Fprintf(d, "%s\n%s\n", action, opfmt.Filter(f))
	for _, id := range ids {
		fmt.Fprintln(d, id)
	}
	return hex.EncodeToString(d.Sum(nil)[:16])
}

// act runs an action posted by a form of the dashboard: the first post
// shows a confirmation page with how many messages the action would
// change (outbox.Outbox.Plan) and a digest of their ids, and which of the
// selected messages it leaves alone and why (when that is all of them,
// the page has no confirm button: it says why nothing would change); the second
// (confirm=yes) acts on those messages only and redirects (303) back to
// the list with a notice of how many changed. When the messages it would
// change are no longer the ones counted (a message published or
// dead-lettered meanwhile, one a relay or another operator took), it
// changes nothing and shows a new confirmation page (409).
func (h *Handler) act(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "dashboard: "+err.Error(), http.StatusBadRequest)
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(h.csrf)) != 1 {
		http.Error(w, "dashboard: missing or wrong form token", http.StatusForbidden)
		return
	}
	name := r.PostForm.Get("action")
	if name == "purge" {
		h.purge(w, r)
		return
	}
	a, ok := actions[name]
	if !ok {
		http.Error(w, "dashboard: unknown action", http.StatusBadRequest)
		return
	}
	q := query(r.PostForm)
	f, err := parseFilter(q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	back := base(r) + "/messages"
	if v := (url.Values{}); len(q) > 0 {
		for k, s := range q {
			v.Set(k, s)
		}
		back += "?" + v.Encode()
	}
	ctx := r.Context()
	plan, err := h.cfg.Outbox.Plan(ctx, h.cfg.DB, a, f)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ids := plan.IDs
	sel := selection(name, f, ids)
	// A confirmation page until the post confirms the messages still
	// counted; one that says why when the action would change none.
	confirmed := r.PostForm.Get("confirm") == "yes"
	if stale := confirmed && r.PostForm.Get("selection") != sel; !confirmed || stale || len(ids) == 0 {
		p := h.newPage(r)
		p.Action, p.Count, p.What, p.Back, p.Refused = name, int64(len(ids)), opfmt.Filter(f), back, plan.Refused
		p.Q = maps.Clone(q)
		p.Q["selection"] = sel
		status := http.StatusOK
		if stale {
			status = http.StatusConflict
			p.Error = "The messages this action would change are no longer the ones shown; nothing was changed. Confirm again to act on those below."
		}
		h.render(w, status, "confirm", p)
		return
	}
	n, err := h.cfg.Outbox.ActOn(ctx, h.cfg.DB, a, f, ids, &outbox.ActOptions{Actor: h.cfg.Actor(r), Logger: h.cfg.Logger})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	sep := "?"
	if strings.Contains(back, "?") {
		sep = "&"
	}
	http.Redirect(w, r, back+sep+"notice="+url.QueryEscape(fmt.Sprintf("%s: %d message(s) changed", name, n)), http.StatusSeeOther)
}

var funcs = template.FuncMap{
	"age": func(d time.Duration) string {
		if d == 0 {
			return "-"
		}
		return d.Round(time.Millisecond).String()
	},
	"when": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
	"attempt": func(m outbox.MessageInfo) int {
		return m.Attempts - m.AttemptsBase
	},
	"short": func(s string) string {
		if r := []rune(s); len(r) > 120 {
			return string(r[:120]) + "…"
		}
		return s
	},
	// headers decodes a headers object into sorted key, value pairs; nil
	// when it is not one (then pretty shows it as stored).
	"headers": func(b []byte) [][2]string {
		var m map[string]string
		if b == nil || json.Unmarshal(b, &m) != nil || len(m) == 0 {
			return nil
		}
		out := make([][2]string, 0, len(m))
		for k, v := range m {
			out = append(out, [2]string{k, v})
		}
		slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
		return out
	},
	// pretty indents JSON; anything else is shown as it is (escaped by
	// the template like every value).
	"pretty": func(b []byte) string {
		if b == nil {
			return "(none)"
		}
		var out bytes.Buffer
		if json.Indent(&out, b, "", "  ") == nil {
			return out.String()
		}
		return string(b)
	},
}
