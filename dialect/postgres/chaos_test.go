package postgres_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/chaostest"
	"github.com/oncommit/oncommit/internal/pgtest"
)

// TestChaos runs the chaos test (internal/chaostest) on PostgreSQL: relays
// and publishers on native pgx (relays listen for notifications), on
// lib/pq (relays poll), and with the WAL transport on native pgx (the
// cluster with wal_level=logical: relays killed while one reads the slot,
// publishers killed mid-transaction).
func TestChaos(t *testing.T) {
	for _, driver := range []string{"pgx", "libpq", "wal"} {
		t.Run(driver, func(t *testing.T) {
			chaostest.Run(t, pgBackend(driver), chaostest.FromEnv())
		})
	}
}

// walChaos is the slot and publication of the WAL transport's chaos run,
// the same in the test process and its children (one chaos run at a time).
var walChaos = postgres.WALConfig{Slot: "chaos_wal", Publication: "chaos_wal"}

// TestOrderedChaos runs the checker of ordered delivery
// (chaostest.RunOrdered) on PostgreSQL through native pgx and with the
// WAL transport; under OUTBOX_RELIABILITY=long the default run, then the
// long one (a relay SIGKILLed every 200-800 ms) through pgx, the WAL
// transport and lib/pq.
func TestOrderedChaos(t *testing.T) {
	for _, o := range chaostest.OrderedRuns() {
		drivers := []string{"pgx", "wal"}
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
	if driver == "wal" {
		return walBackend()
	}
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

// walBackend is pgBackend("pgx") with the WAL transport, on the cluster
// with wal_level=logical: a fresh schema and a fresh slot per run.
func walBackend() chaostest.Backend {
	b := pgBackend("pgx")
	url := os.Getenv("OUTBOX_TEST_WAL_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5433/test?sslmode=disable"
	}
	cfg := walChaos
	cfg.ConnString = url
	d, err := postgres.WALDialect(cfg)
	if err != nil {
		panic(err)
	}
	b.Dialect = d
	b.Setup = func(t testing.TB) chaostest.Target {
		url := pgtest.WALURL(t)
		ctx := context.Background()
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		var r [5]byte
		_, _ = rand.Read(r[:])
		schema := "chaos_" + hex.EncodeToString(r[:])
		if _, err := db.Exec(`CREATE SCHEMA ` + schema); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`) })
		if err := postgres.Migrate(ctx, db, schema+".outbox"); err != nil {
			t.Fatal(err)
		}
		_ = postgres.DropWAL(ctx, cfg) // a run killed before its cleanup
		if err := postgres.SetupWAL(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for range 100 { // the server frees a killed reader's slot shortly after
				if postgres.DropWAL(ctx, cfg) == nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
		return chaostest.Target{"url": url, "schema": schema}
	}
	// Drained once the slot has confirmed the WAL position of the moment
	// the publishers stopped: every message committed before it is handled
	// or in the table.
	b.StreamDrained = func(ctx context.Context, c *chaostest.Conn) (func() (bool, error), error) {
		var upTo string
		if err := c.SQL.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&upTo); err != nil {
			return nil, err
		}
		return func() (bool, error) {
			var ok bool
			err := c.SQL.QueryRowContext(ctx, `SELECT coalesce(confirmed_flush_lsn >= $1::pg_lsn, false) FROM pg_replication_slots WHERE slot_name = $2`, upTo, cfg.Slot).Scan(&ok)
			return ok, err
		}, nil
	}
	return b
}
