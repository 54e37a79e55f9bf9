package postgres_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/chaostest"
	"github.com/oncommit/oncommit/internal/pgtest"
)

// TestChaos runs the chaos test (internal/chaostest) on PostgreSQL: relays
// and publishers on native pgx (relays listen for notifications), and on
// lib/pq (relays poll).
func TestChaos(t *testing.T) {
	for _, driver := range []string{"pgx", "libpq"} {
		t.Run(driver, func(t *testing.T) {
			chaostest.Run(t, pgBackend(driver), chaostest.FromEnv())
		})
	}
}

// TestOrderedChaos runs the checker of ordered delivery
// (chaostest.RunOrdered) on PostgreSQL through native pgx; under
// OUTBOX_RELIABILITY=long the default run, then the long one (a relay
// SIGKILLed every 200-800 ms) through pgx and lib/pq.
func TestOrderedChaos(t *testing.T) {
	for _, o := range chaostest.OrderedRuns() {
		drivers := []string{"pgx"}
		if o.Kill {
			drivers = append(drivers, "libpq")
		}
		for _, driver := range drivers {
			t.Run(o.Mode+"/"+driver, func(t *testing.T) {
				chaostest.RunOrdered(t, pgBackend(driver), o)
			})
		}
	}
}

func pgBackend(driver string) chaostest.Backend {
	return chaostest.Backend{
		Dialect: postgres.Dialect(),
		Setup: func(t testing.TB) chaostest.Target {
			schema := pgtest.Schema(t)
			if err := postgres.Migrate(context.Background(), pgtest.Admin(t), schema+".outbox"); err != nil {
				t.Fatal(err)
			}
			return chaostest.Target{"url": pgtest.URL(t), "schema": schema}
		},
		Open: func(ctx context.Context, tg chaostest.Target) (*chaostest.Conn, error) {
			s := tg["schema"]
			c := &chaostest.Conn{Table: s + ".outbox", Business: s + ".chaos_orders", Ledger: s + ".chaos_ledger", Rebind: chaostest.Dollar}
			switch driver {
			case "pgx":
				cfg, err := pgxpool.ParseConfig(tg["url"])
				if err != nil {
					return nil, err
				}
				if n, err := strconv.Atoi(tg["pool"]); err == nil {
					cfg.MaxConns = int32(n) // the ordered checker's producers
				}
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				if err != nil {
					return nil, err
				}
				db, err := sql.Open("pgx", tg["url"])
				if err != nil {
					pool.Close()
					return nil, err
				}
				db.SetMaxOpenConns(12) // the ledger's pool, bounded (see lib/pq's)
				c.SQL, c.Relay = db, pgxtx.FromPool(pool)
				c.Close = func() { pool.Close(); db.Close() }
				c.Begin = func(ctx context.Context) (chaostest.Txn, error) {
					tx, err := pool.Begin(ctx)
					if err != nil {
						return chaostest.Txn{}, err
					}
					return chaostest.Txn{Tx: pgxtx.From(tx),
						Exec:     func(ctx context.Context, q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err },
						Commit:   func() error { return tx.Commit(context.Background()) },
						Rollback: func() error { return tx.Rollback(context.Background()) }}, nil
				}
			default:
				db, err := sql.Open("postgres", tg["url"])
				if err != nil {
					return nil, err
				}
				// The ledger on a pool of its own, bounded: unbounded, a
				// relay's hundred-odd handlers opened a connection each,
				// went past max_connections and retried, a storm of
				// backends that starved every process (a relay then took
				// over 20 s to stop in CI).
				ledger, err := sql.Open("postgres", tg["url"])
				if err != nil {
					db.Close()
					return nil, err
				}
				ledger.SetMaxOpenConns(12)
				c.SQL, c.LedgerSQL, c.Relay, c.Begin = db, ledger, sqltx.FromDB(db), chaostest.SQLBegin(db)
				c.Close = func() { db.Close(); ledger.Close() }
			}
			return c, nil
		},
	}
}
