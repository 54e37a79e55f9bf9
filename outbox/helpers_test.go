package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// txn is one open business transaction on some driver.
type txn struct {
	tx       outbox.Tx
	exec     func(q string, args ...any) error
	commit   func() error
	rollback func() error
}

// driver opens transactions through one PostgreSQL driver path.
type driver struct {
	name  string
	begin func(t *testing.T) txn
}

// env is a fresh schema with the outbox table and an orders table.
type env struct {
	schema string
	table  string // schema.outbox
	orders string // schema.orders
	ob     *outbox.Outbox
}

func newEnv(t testing.TB, cfg outbox.Config) *env {
	t.Helper()
	schema := pgtest.Schema(t)
	e := &env{schema: schema, table: schema + ".outbox", orders: schema + ".orders"}
	ctx := context.Background()
	if err := postgres.Migrate(ctx, pgtest.Admin(t), e.table); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := pgtest.Admin(t).Exec(`CREATE TABLE ` + e.orders + ` (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	cfg.Table = e.table
	ob, err := outbox.New(postgres.Dialect(), cfg)
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
	if err := pgtest.Admin(t).QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func sqlDriver(name, driverName string) driver {
	return driver{name: name, begin: func(t *testing.T) txn {
		db := pgtest.Open(t, driverName)
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		return txn{
			tx:       sqltx.From(tx),
			exec:     func(q string, args ...any) error { _, err := tx.Exec(q, args...); return err },
			commit:   tx.Commit,
			rollback: tx.Rollback,
		}
	}}
}

func pgxTxFrom(tx pgx.Tx, t *testing.T) txn {
	ctx := context.Background()
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	return txn{
		tx:       pgxtx.From(tx),
		exec:     func(q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err },
		commit:   func() error { return tx.Commit(ctx) },
		rollback: func() error { return tx.Rollback(ctx) },
	}
}

// drivers lists every driver path: lib/pq, pgx stdlib, pgx pool and a
// *pgx.Conn in a transaction opened with SQL.
func drivers() []driver {
	return []driver{
		sqlDriver("libpq", "postgres"),
		sqlDriver("pgxstdlib", "pgx"),
		{name: "pgxpool", begin: func(t *testing.T) txn {
			tx, err := pgtest.Pool(t).Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return pgxTxFrom(tx, t)
		}},
		{name: "pgxconn", begin: func(t *testing.T) txn {
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close(ctx) })
			if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			return txn{
				tx:       pgxtx.FromConn(conn),
				exec:     func(q string, args ...any) error { _, err := conn.Exec(ctx, q, args...); return err },
				commit:   func() error { _, err := conn.Exec(ctx, "COMMIT"); return err },
				rollback: func() error { _, err := conn.Exec(ctx, "ROLLBACK"); return err },
			}
		}},
	}
}
