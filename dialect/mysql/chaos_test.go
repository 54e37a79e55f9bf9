package mysql_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/mysql/internal/mysqltest"
	"github.com/oncommit/oncommit/internal/chaostest"
)

// TestChaos runs the chaos test (internal/chaostest) on MySQL/MariaDB
// through go-sql-driver/mysql, in a database of its own.
func TestChaos(t *testing.T) { chaostest.Run(t, chaosBackend(), chaostest.FromEnv()) }

// TestOrderedChaos runs the checker of ordered delivery
// (chaostest.RunOrdered) on MySQL/MariaDB: 4 relay processes and 8
// producers whose same-key transactions overlap, in a database of its own;
// under OUTBOX_RELIABILITY=long a relay is SIGKILLed every 200-800 ms.
func TestOrderedChaos(t *testing.T) {
	for _, o := range chaostest.OrderedRuns() { // the default run; under OUTBOX_RELIABILITY=long the long one too
		t.Run(o.Mode, func(t *testing.T) { chaostest.RunOrdered(t, chaosBackend(), o) })
	}
}

// chaosBackend is a database per test, migrated, shared by every process.
func chaosBackend() chaostest.Backend {
	return chaostest.Backend{
		Dialect: mysql.Dialect(),
		Setup: func(t testing.TB) chaostest.Target {
			name := mysqltest.Database(t)
			if err := mysql.Migrate(context.Background(), mysqltest.Admin(t), name+".outbox"); err != nil {
				t.Fatal(err)
			}
			return chaostest.Target{"dsn": mysqltest.DSN(t), "db": name}
		},
		Open: func(ctx context.Context, tg chaostest.Target) (*chaostest.Conn, error) {
			db, err := sql.Open("mysql", tg["dsn"])
			if err != nil {
				return nil, err
			}
			// The ledger on a pool of its own, bounded (as on PostgreSQL:
			// a relay's hundred-odd handlers must not each open a
			// connection and crowd out the relays' own).
			ledger, err := sql.Open("mysql", tg["dsn"])
			if err != nil {
				db.Close()
				return nil, err
			}
			ledger.SetMaxOpenConns(12)
			n := tg["db"]
			return &chaostest.Conn{Table: n + ".outbox", Business: n + ".chaos_orders", Ledger: n + ".chaos_ledger",
				Relay: sqltx.FromDB(db), Begin: chaostest.SQLBegin(db), SQL: db, LedgerSQL: ledger,
				Close: func() { db.Close(); ledger.Close() }}, nil
		},
	}
}
