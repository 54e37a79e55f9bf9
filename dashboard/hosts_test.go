package dashboard_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/oncommit/oncommit/dashboard"
)

// TestAllowedHosts: the dashboard answers requests naming localhost, a
// loopback address, the address the request arrived on or a configured
// host (any port, any case); any other Host gets 421 before a page or an
// action runs (sqlmock expects no statement).
func TestAllowedHosts(t *testing.T) {
	ob, db, mock := mockOutbox(t)
	local := &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 8080}
	for _, c := range []struct {
		allowed []string
		host    string
		local   net.Addr
		ok      bool
	}{
		{nil, "localhost", nil, true},
		{nil, "localhost:8080", nil, true},
		{nil, "LocalHost.:8080", nil, true},
		{nil, "app.localhost:8080", nil, true},
		{nil, "127.0.0.1:8080", nil, true},
		{nil, "127.9.9.9", nil, true},
		{nil, "[::1]:8080", nil, true},
		{nil, "10.1.2.3:8080", local, true},
		{nil, "10.1.2.3:8080", nil, false},
		{nil, "10.1.2.4:8080", local, false},
		{nil, "evil.example.com", nil, false},
		{nil, "evil.example.com:8080", local, false},
		{nil, "localhost.evil.example.com:8080", nil, false},
		{nil, "127.0.0.1.evil.example.com", nil, false},
		{nil, "", nil, false},
		{[]string{"ops.example.com", "192.0.2.7"}, "OPS.example.com:443", nil, true},
		{[]string{"ops.example.com", "192.0.2.7"}, "192.0.2.7:8080", nil, true},
		{[]string{"ops.example.com", "192.0.2.7"}, "evil.example.com", nil, false},
		{[]string{"*"}, "evil.example.com:8080", nil, true},
	} {
		h, err := dashboard.New(dashboard.Config{Outbox: ob, DB: db, Actions: true, AllowedHosts: c.allowed})
		if err != nil {
			t.Fatal(err)
		}
		for _, req := range []*http.Request{
			httptest.NewRequest("GET", "/static/style.css", nil),
			httptest.NewRequest("POST", "/act", strings.NewReader("action=delete&state=dead&confirm=yes")),
		} {
			req.Host = c.host
			if c.local != nil {
				req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, c.local))
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if refused := w.Code == http.StatusMisdirectedRequest; refused == c.ok || (refused && !strings.Contains(w.Body.String(), "is not allowed")) {
				t.Errorf("%s %q (allowed %q, arrived on %v): %d %q, want allowed %v", req.Method, c.host, c.allowed, c.local, w.Code, w.Body.String(), c.ok)
			}
		}
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}
