package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dashboard"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
)

// deadLetters publishes three messages of topic mail and runs a relay
// whose handler fails until all three are dead.
func deadLetters(ctx context.Context, ob *outbox.Outbox, db outbox.DB, begin func() outbox.Tx, commit func()) {
	if _, err := ob.PublishBatch(ctx, begin(), []outbox.Message{
		{Topic: "mail", Key: "order-1", Payload: []byte(`{"to":"a@example.com"}`)},
		{Topic: "mail", Key: "order-2", Payload: []byte(`{"to":"b@example.com"}`)},
		{Topic: "mail", Key: "order-3", Payload: []byte(`{"to":"c@example.com"}`)},
	}); err != nil {
		panic(err)
	}
	commit()
	r, err := ob.Relay(db, outbox.RelayConfig{MaxAttempts: 1, PollInterval: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	_ = r.Handle("mail", func(ctx context.Context, d outbox.Delivery) error { return errors.New("smtp: connection refused") })
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	for {
		n, err := ob.Count(ctx, db, outbox.Filter{States: []outbox.State{outbox.StateDead}})
		if err != nil {
			panic(err)
		}
		if n == 3 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
}

// List the dead messages a page at a time, look at one, and redrive those
// whose error says the mail server was down: each action changes only
// messages still in its source state, in batches, and logs one line.
func Example_inspect() {
	ctx := context.Background()
	sqlDB := openExampleDB(ctx)
	defer sqlDB.Close()
	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{})
	if err != nil {
		panic(err)
	}
	db := sqltx.FromDB(sqlDB)
	var commit func()
	deadLetters(ctx, ob, db, func() outbox.Tx {
		tx, err := sqlDB.BeginTx(ctx, nil)
		if err != nil {
			panic(err)
		}
		commit = func() {
			if err := tx.Commit(); err != nil {
				panic(err)
			}
		}
		return sqltx.From(tx)
	}, func() { commit() })

	f := outbox.Filter{States: []outbox.State{outbox.StateDead}, Topic: "mail"}
	for {
		page, err := ob.List(ctx, db, f, 2) // two per page
		if err != nil {
			panic(err)
		}
		for _, m := range page.Messages {
			fmt.Println(m.Key, m.State, m.LastError)
		}
		if page.Next.IsZero() {
			break
		}
		f.After = page.Next
	}

	first, err := ob.List(ctx, db, outbox.Filter{Key: "order-1"}, 1)
	if err != nil {
		panic(err)
	}
	m, err := ob.Get(ctx, db, first.Messages[0].ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(m.Payload), "attempt", m.Attempts-m.AttemptsBase)

	n, err := ob.Act(ctx, db, outbox.ActRedrive, outbox.Filter{ErrorContains: "connection refused"},
		&outbox.ActOptions{Actor: "alice", Logger: slog.New(slog.DiscardHandler)})
	fmt.Println("redriven:", n, err)

	_, err = ob.Act(ctx, db, outbox.ActDelete, outbox.Filter{}, nil)
	var fe *outbox.FilterError
	fmt.Println("delete everything:", errors.As(err, &fe), fe.Field)
	// Output:
	// order-1 dead smtp: connection refused
	// order-2 dead smtp: connection refused
	// order-3 dead smtp: connection refused
	// {"to":"a@example.com"} attempt 1
	// redriven: 3 <nil>
	// delete everything: true Filter
}

// Mount the dashboard behind the service's own authentication. Without
// Config.Actions it is read-only: no buttons, and every POST is refused.
func Example_dashboard() {
	ctx := context.Background()
	sqlDB := openExampleDB(ctx)
	defer sqlDB.Close()
	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{})
	if err != nil {
		panic(err)
	}
	dash, err := dashboard.New(dashboard.Config{Outbox: ob, DB: sqltx.FromDB(sqlDB)})
	if err != nil {
		panic(err)
	}
	requireAdmin := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if user, pass, ok := r.BasicAuth(); !ok || user != "admin" || pass != "secret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="outbox"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/", requireAdmin(http.StripPrefix("/outbox", dash)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	get := func(user string) {
		req, _ := http.NewRequest("GET", srv.URL+"/outbox/", nil)
		req.SetBasicAuth(user, "secret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(user, resp.StatusCode, strings.Contains(string(body), "read-only"))
	}
	get("admin")
	get("mallory")
	resp, err := http.Post(srv.URL+"/outbox/act", "application/x-www-form-urlencoded", strings.NewReader("action=delete&state=dead"))
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println("post without credentials:", resp.StatusCode)
	// Output:
	// admin 200 true
	// mallory 401 false
	// post without credentials: 401
}
