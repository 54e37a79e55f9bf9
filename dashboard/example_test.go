package dashboard_test

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dashboard"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
)

type ctxUser struct{}

// requireOperator lets through only requests that authenticate as an
// operator, with the user in the request's context.
func requireOperator(user, password string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 ||
			subtle.ConstantTimeCompare([]byte(p), []byte(password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="outbox", charset="UTF-8"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxUser{}, u)))
	})
}

// The dashboard mounted behind the service's authentication (HTTP basic
// authentication here; a single sign-on or session check goes in the same
// place), with the authenticated user as the actor of each action's log
// line, reached by the name ops.example.com. docs/operations.md shows the
// same code.
func ExampleNew() {
	db, _, err := sqlmock.New() // the service's *sql.DB
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
	if err != nil {
		panic(err)
	}
	dash, err := dashboard.New(dashboard.Config{
		Outbox:  ob,
		DB:      sqltx.FromDB(db),
		Actions: true, // redrive, retry, delete, skip and purge; read-only without it
		Actor: func(r *http.Request) string { // who, in each action's log line
			u, _ := r.Context().Value(ctxUser{}).(string)
			return "dashboard:" + u
		},
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, nil)),
		AllowedHosts: []string{"ops.example.com"}, // the name it is reached by
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/", requireOperator("ops", "s3cret", http.StripPrefix("/outbox", dash)))

	for _, auth := range []bool{false, true} {
		req := httptest.NewRequest("GET", "https://ops.example.com/outbox/static/style.css", nil)
		if auth {
			req.SetBasicAuth("ops", "s3cret")
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println("authenticated:", auth, "status:", w.Code)
	}
	// Output:
	// authenticated: false status: 401
	// authenticated: true status: 200
}
