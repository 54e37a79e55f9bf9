package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/internal/chaostest"
)

// chaosDSN is the DSN options the dialect recommends.
const chaosDSN = "?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"

// TestChaos runs the chaos test (internal/chaostest) on one SQLite file in
// WAL mode shared by every process; the ledger has a file of its own.
func TestChaos(t *testing.T) {
	chaostest.Run(t, chaostest.Backend{
		Dialect: sqlite.Dialect(),
		Setup: func(t testing.TB) chaostest.Target {
			dir := t.TempDir()
			db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "chaos.db")+chaosDSN)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := sqlite.Migrate(context.Background(), db, ""); err != nil {
				t.Fatal(err)
			}
			return chaostest.Target{"dir": dir}
		},
		Open: func(ctx context.Context, tg chaostest.Target) (*chaostest.Conn, error) {
			db, err := sql.Open("sqlite", "file:"+filepath.Join(tg["dir"], "chaos.db")+chaosDSN)
			if err != nil {
				return nil, err
			}
			ledger, err := sql.Open("sqlite", "file:"+filepath.Join(tg["dir"], "ledger.db")+chaosDSN)
			if err != nil {
				db.Close()
				return nil, err
			}
			return &chaostest.Conn{Table: "outbox", Business: "chaos_orders", Ledger: "chaos_ledger",
				Relay: sqltx.FromDB(db), Begin: chaostest.SQLBegin(db), SQL: db, LedgerSQL: ledger,
				Close: func() { db.Close(); ledger.Close() }}, nil
		},
	}, chaostest.FromEnv())
}
