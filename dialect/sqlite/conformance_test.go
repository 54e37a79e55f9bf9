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
func TestConformance(t *testing.T) {
	dialecttest.Run(t, dialecttest.Harness{
		Dialect:  sqlite.Dialect(),
		Parallel: true,
		New: func(t *testing.T) *dialecttest.Store {
			db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "c.db")+dsnOpts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			if err := sqlite.Migrate(context.Background(), db, ""); err != nil {
				t.Fatal(err)
			}
			return &dialecttest.Store{
				Table: "outbox",
				DB:    sqltx.Pool(db),
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
	})
}
