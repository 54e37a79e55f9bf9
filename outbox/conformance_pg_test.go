package outbox_test

import (
	"context"
	"testing"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/internal/pgtest"
)

// pgDrivers are the drivers the PostgreSQL conformance suite runs through.
var pgDrivers = []string{"libpq", "pgxstdlib", "pgxpool"}

// TestConformance runs the conformance suite on PostgreSQL through lib/pq,
// pgx's stdlib driver and native pgx.
func TestConformance(t *testing.T) {
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			dialecttest.Run(t, pgHarness(driver))
		})
	}
}

// FuzzPayload checks, on PostgreSQL through lib/pq, pgx's stdlib driver and
// native pgx, that every payload is refused before any SQL is sent or
// stored and read back JSON-equal (dialecttest.FuzzPayload):
//
//	go test ./outbox -run '^$' -fuzz FuzzPayload -fuzztime 60s
func FuzzPayload(f *testing.F) {
	var hs []dialecttest.Harness
	for _, driver := range pgDrivers {
		hs = append(hs, pgHarness(driver))
	}
	dialecttest.FuzzPayload(f, hs...)
}

// pgHarness is PostgreSQL through driver: a schema per store.
func pgHarness(driver string) dialecttest.Harness {
	return dialecttest.Harness{
		Dialect:  postgres.Dialect(),
		Parallel: true,
		New: func(t testing.TB) *dialecttest.Store {
			schema := pgtest.Schema(t)
			table := schema + ".outbox"
			if err := postgres.Migrate(context.Background(), pgtest.Admin(t), table); err != nil {
				t.Fatal(err)
			}
			if err := postgres.MigrateInbox(context.Background(), pgtest.Admin(t), schema+".inbox"); err != nil {
				t.Fatal(err)
			}
			s := &dialecttest.Store{Table: table, Inbox: schema + ".inbox", Count: func(t *testing.T, where string) int { return count(t, table, where) }}
			switch driver {
			case "pgxpool":
				p := pgtest.Pool(t)
				s.DB = pgxtx.FromPool(p)
				s.Begin = func(t *testing.T) dialecttest.Txn {
					tx, err := p.Begin(context.Background())
					if err != nil {
						t.Fatal(err)
					}
					x := pgxTxFrom(tx, t)
					return dialecttest.Txn{Tx: x.tx, Commit: x.commit, Rollback: x.rollback}
				}
			default:
				name := map[string]string{"libpq": "postgres", "pgxstdlib": "pgx"}[driver]
				db := pgtest.Open(t, name)
				s.DB = sqltx.FromDB(db)
				if driver == "pgxstdlib" {
					s.DB = pgxtx.FromStdlib(db)
				}
				s.Begin = func(t *testing.T) dialecttest.Txn {
					tx, err := db.Begin()
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = tx.Rollback() })
					return dialecttest.Txn{Tx: sqltx.From(tx), Commit: tx.Commit, Rollback: tx.Rollback}
				}
			}
			return s
		},
	}
}
