package mysql_test

import (
	"context"
	"testing"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/mysql/internal/mysqltest"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/outbox"
)

// TestConformance runs the conformance suite on MySQL/MariaDB through
// go-sql-driver/mysql, a database per test.
func TestConformance(t *testing.T) { dialecttest.Run(t, harness()) }

// FuzzPayload checks that every payload is refused before any SQL is sent
// or stored and read back JSON-equal (dialecttest.FuzzPayload):
//
//	go test ./dialect/mysql -run '^$' -fuzz FuzzPayload -fuzztime 60s
func FuzzPayload(f *testing.F) { dialecttest.FuzzPayload(f, harness()) }

func harness() dialecttest.Harness {
	return dialecttest.Harness{
		Dialect:  mysql.Dialect(),
		Parallel: true,
		New: func(t testing.TB) *dialecttest.Store {
			e := newEnv(t, nil, outbox.Config{})
			if err := mysql.MigrateInbox(context.Background(), mysqltest.Admin(t), e.db+".inbox"); err != nil {
				t.Fatal(err)
			}
			return &dialecttest.Store{
				Table: e.table,
				Inbox: e.db + ".inbox",
				DB:    sqltx.FromDB(e.pool),
				Begin: func(t *testing.T) dialecttest.Txn {
					tx := e.begin(t)
					return dialecttest.Txn{Tx: sqltx.From(tx), Commit: tx.Commit, Rollback: tx.Rollback}
				},
				Count: func(t *testing.T, where string) int { return count(t, e.table, where) },
			}
		},
	}
}
