package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/internal/dialecttest"
)

// TestConformance runs the conformance suite on SQLite (modernc.org/sqlite,
// a WAL file per test).
func TestConformance(t *testing.T) { dialecttest.Run(t, harness()) }

// FuzzPayload checks that every payload is refused before any SQL is sent
// or stored and read back JSON-equal (dialecttest.FuzzPayload):
//
//	go test ./dialect/sqlite -run '^$' -fuzz FuzzPayload -fuzztime 60s
func FuzzPayload(f *testing.F) { dialecttest.FuzzPayload(f, harness()) }

func harness() dialecttest.Harness {
	return dialecttest.Harness{
		Dialect:  sqlite.Dialect(),
		Parallel: true,
		New: func(t testing.TB) *dialecttest.Store {
			db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "c.db")+dsnOpts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			if err := sqlite.Migrate(context.Background(), db, ""); err != nil {
				t.Fatal(err)
			}
			if err := sqlite.MigrateInbox(context.Background(), db, ""); err != nil {
				t.Fatal(err)
			}
			return &dialecttest.Store{
				Table: "outbox",
				Inbox: "inbox",
				DB:    sqltx.FromDB(db),
				Begin: func(t *testing.T) dialecttest.Txn {
					tx, err := db.Begin()
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = tx.Rollback() })
					return dialecttest.Txn{Tx: sqltx.From(tx), Commit: tx.Commit, Rollback: tx.Rollback}
				},
				Count: func(t *testing.T, where string) int {
					q := `SELECT count(*) FROM outbox`
					if where != "" {
						q += ` WHERE ` + where
					}
					var n int
					if err := db.QueryRow(q).Scan(&n); err != nil {
						t.Fatal(err)
					}
					return n
				},
			}
		},
	}
}
