package dashboard_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dashboard"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
)

// mockOutbox returns an Outbox on PostgreSQL and a sqlmock pool that
// expects no statement: mock.ExpectationsWereMet says whether one was
// sent.
func mockOutbox(t *testing.T) (*outbox.Outbox, outbox.DB, sqlmock.Sqlmock) {
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return ob, sqltx.FromDB(db), mock
}

func TestNewRefusesBadConfig(t *testing.T) {
	ob, db, _ := mockOutbox(t)
	for _, c := range []struct {
		cfg   dashboard.Config
		field string
	}{
		{dashboard.Config{DB: db}, "Outbox"},
		{dashboard.Config{Outbox: ob}, "DB"},
		{dashboard.Config{Outbox: ob, DB: db, SampleEvery: -1}, "SampleEvery"},
		{dashboard.Config{Outbox: ob, DB: db, AllowedHosts: []string{"ops.example.com:8443"}}, "AllowedHosts"},
		{dashboard.Config{Outbox: ob, DB: db, AllowedHosts: []string{"https://ops.example.com"}}, "AllowedHosts"},
		{dashboard.Config{Outbox: ob, DB: db, AllowedHosts: []string{""}}, "AllowedHosts"},
		{dashboard.Config{Outbox: ob, DB: db, AllowedHosts: []string{"ops example"}}, "AllowedHosts"},
	} {
		var ce *outbox.ConfigError
		if _, err := dashboard.New(c.cfg); !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("New without %s: %v", c.field, err)
		}
	}
}

// TestPostsRefusedBeforeSQL: a read-only dashboard refuses every POST, an
// enabled one refuses posts from another site and posts without the
// page's token, and a bad id is a 400: none of them sends a statement
// (sqlmock expects none).
func TestPostsRefusedBeforeSQL(t *testing.T) {
	ob, db, mock := mockOutbox(t)
	form := url.Values{"action": {"delete"}, "confirm": {"yes"}, "state": {"dead"}, "csrf": {"guess"}}.Encode()
	for _, c := range []struct {
		name    string
		actions bool
		site    string
		want    int
		says    string
	}{
		{"read-only, same origin", false, "same-origin", http.StatusForbidden, "read-only"},
		{"read-only, cross site", false, "cross-site", http.StatusForbidden, "read-only"},
		{"enabled, cross site", true, "cross-site", http.StatusForbidden, "cross-origin"},
		{"enabled, same site other origin", true, "same-site", http.StatusForbidden, "cross-origin"},
		{"enabled, wrong token", true, "same-origin", http.StatusForbidden, "token"},
	} {
		h, err := dashboard.New(dashboard.Config{Outbox: ob, DB: db, Actions: c.actions})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest("POST", "http://localhost/act", strings.NewReader(form))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", c.site)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != c.want || !strings.Contains(strings.ToLower(w.Body.String()), c.says) {
			t.Errorf("%s: %d %q, want %d saying %q", c.name, w.Code, w.Body.String(), c.want, c.says)
		}
	}
	h, err := dashboard.New(dashboard.Config{Outbox: ob, DB: db})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "http://localhost/message/not-an-id", nil))
	if w.Code != http.StatusBadRequest {
		t.Errorf("bad id: %d", w.Code)
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "http://localhost/messages?state=gone", nil))
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "invalid filter: States") {
		t.Errorf("bad state: %d %s", w.Code, w.Body.String())
	}
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// TestBadSubscriberRefusedBeforeSQL: a list filtered by a subscriber name
// that cannot be one is a 400 that names the field, with no statement
// sent.
func TestBadSubscriberRefusedBeforeSQL(t *testing.T) {
	ob, db, mock := mockOutbox(t)
	h, err := dashboard.New(dashboard.Config{Outbox: ob, DB: db})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "http://localhost/messages?subscriber=no+spaces", nil))
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "invalid filter: Subscriber") {
		t.Errorf("bad subscriber: %d %s", w.Code, w.Body.String())
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}
