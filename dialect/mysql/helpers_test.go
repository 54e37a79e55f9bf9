package mysql_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/mysql/internal/mysqltest"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/outbox"
)

// env is a fresh database with the outbox table and an orders table.
type env struct {
	db     string // the database
	table  string // db.outbox
	orders string // db.orders
	pool   *sql.DB
	ob     *outbox.Outbox
}

func newEnv(t testing.TB, d outbox.Dialect, cfg outbox.Config) *env {
	t.Helper()
	name := mysqltest.Database(t)
	e := &env{db: name, table: name + ".outbox", orders: name + ".orders", pool: mysqltest.Open(t, nil)}
	admin := mysqltest.Admin(t)
	if err := mysql.Migrate(context.Background(), admin, e.table); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := admin.Exec(`CREATE TABLE ` + e.orders + ` (id VARCHAR(64) PRIMARY KEY) ENGINE = InnoDB`); err != nil {
		t.Fatal(err)
	}
	if d == nil {
		d = mysql.Dialect()
	}
	cfg.Table = e.table
	ob, err := outbox.New(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.ob = ob
	return e
}

// count returns the number of rows in table matching the optional where.
func count(t testing.TB, table, where string, args ...any) int {
	t.Helper()
	q := `SELECT count(*) FROM ` + table
	if where != "" {
		q += ` WHERE ` + where
	}
	var n int
	if err := mysqltest.Admin(t).QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// begin opens a business transaction on the env's pool, rolled back when
// t ends if still open.
func (e *env) begin(t testing.TB) *sql.Tx {
	t.Helper()
	tx, err := e.pool.Begin()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// publish publishes msgs in a transaction of their own and returns the ids.
func (e *env) publish(t testing.TB, msgs ...outbox.Message) []outbox.ID {
	t.Helper()
	return dialecttest.PublishCommit(t, e.begin(t), e.ob, msgs...)
}

var sqlTxReadOnly = sql.TxOptions{ReadOnly: true}
