package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outbox"
)

// bouncerPath is one driver behind PgBouncer (transaction pooling),
// configured as docs/operations.md ("PgBouncer") says.
type bouncerPath struct {
	name string
	// open returns a business transaction and the relay's DB, both through
	// PgBouncer.
	open func(t *testing.T, url string) (begin func(ctx context.Context) (txn, error), db outbox.DB)
}

// The documented settings behind PgBouncer, added to the URL of
// pgtest.BouncerURL by withParam: pgx's stdlib driver sends each statement
// unprepared, in one round trip; lib/pq sends the parameters with the
// statement, in one round trip.
const (
	pgxStdlibParams = "default_query_exec_mode=exec"
	libpqParams     = "binary_parameters=yes"
)

// withParam adds the query parameter p (key=value) to url.
func withParam(url, p string) string {
	if strings.Contains(url, "?") {
		return url + "&" + p
	}
	return url + "?" + p
}

// bouncerPool is a pgxpool through PgBouncer with the documented setting:
// QueryExecModeExec.
func bouncerPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// openSQL opens driverName on url, closed when t ends.
func openSQL(t *testing.T, driverName, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// pgxBegin begins business transactions on p.
func pgxBegin(t *testing.T, p *pgxpool.Pool) func(context.Context) (txn, error) {
	return func(ctx context.Context) (txn, error) {
		tx, err := p.Begin(ctx)
		if err != nil {
			return txn{}, err
		}
		return pgxTxFrom(tx, t), nil
	}
}

func bouncerPaths() []bouncerPath {
	sqlPath := func(name, driverName, params string) bouncerPath {
		return bouncerPath{name, func(t *testing.T, url string) (func(context.Context) (txn, error), outbox.DB) {
			db := openSQL(t, driverName, withParam(url, params))
			return func(ctx context.Context) (txn, error) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return txn{}, err
				}
				return txn{
					tx:       sqltx.From(tx),
					exec:     func(q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err },
					commit:   tx.Commit,
					rollback: tx.Rollback,
				}, nil
			}, sqltx.FromDB(db)
		}}
	}
	return []bouncerPath{
		{"pgxpool", func(t *testing.T, url string) (func(context.Context) (txn, error), outbox.DB) {
			p := bouncerPool(t, url)
			return pgxBegin(t, p), pgxtx.FromPool(p)
		}},
		sqlPath("pgxstdlib", "pgx", pgxStdlibParams),
		sqlPath("libpq", "postgres", libpqParams),
	}
}

// Publishers and transactions each in TestPgBouncer.
const (
	bouncerPublishers = 8
	bouncerTxs        = 15
)

// TestPgBouncer: behind PgBouncer in transaction pooling mode, with the
// documented settings (Notify NotifyOff, the driver's exec mode), 8
// goroutines commit 15 business transactions each, each with an order row
// and a message, while two relays that poll deliver through the same
// PgBouncer; every transaction commits and every message is handled, none
// lost, and the relays log no error. A relay left at Listen ListenAuto
// still delivers everything by polling.
//
// Each setting is needed: with pgx's default QueryExecModeCacheStatement,
// a fifth to two thirds of the transactions failed (42P05 or 26000 on
// "stmtcache_..."); with QueryExecModeDescribeExec, or lib/pq without
// binary_parameters, publishing passes (a transaction keeps its server
// connection) but the relay's claims and settles, which run outside a
// transaction, fail: the statement is parsed in one round trip and bound
// in the next, by then on another server connection.
func TestPgBouncer(t *testing.T) {
	for _, p := range bouncerPaths() {
		for _, listen := range []outbox.ListenMode{outbox.ListenOff, outbox.ListenAuto} {
			name := p.name
			if listen == outbox.ListenAuto {
				name += "/listen-auto"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				url := pgtest.BouncerURL(t)
				e := newEnv(t, outbox.Config{Notify: outbox.NotifyOff}) // schema and table made on the server directly
				begin, db := p.open(t, url)
				rec := newRecorder()
				var logs logBuffer
				for range 2 {
					r, err := e.ob.Relay(db, fast(t, outbox.RelayConfig{Listen: listen, BatchSize: 10, Logger: logs.logger()}))
					if err != nil {
						t.Fatal(err)
					}
					if err := r.Handle("order.placed", func(ctx context.Context, d outbox.Delivery) error {
						rec.add(d)
						if want := `{"order": "` + strings.TrimPrefix(d.Key, "o-") + `"}`; string(d.Payload) != want {
							t.Errorf("message %s: payload %s, want %s", d.ID, d.Payload, want)
						}
						return nil
					}); err != nil {
						t.Fatal(err)
					}
					start(t, r)
				}
				ids, failed := publishThrough(t, e, begin)
				if len(failed) > 0 {
					t.Errorf("%d of %d transactions failed; first: %v", len(failed), bouncerPublishers*bouncerTxs, failed[0])
				}
				if n := count(t, e.orders, ""); n != len(ids) {
					t.Errorf("%d orders for %d committed transactions", n, len(ids))
				}
				eventually(t, 20*time.Second, "every message handled", func() bool { return rec.count() >= len(ids) })
				eventually(t, 5*time.Second, "empty table", func() bool { return count(t, e.table, "") == 0 })
				for _, id := range ids {
					if a := rec.attempts(id); len(a) != 1 || a[0] != 1 {
						t.Errorf("message %s delivered with attempts %v, want [1]", id, a)
					}
				}
				// A claim or settle that failed and was retried is not lost, but
				// it is the defect these settings avoid (with a driver's
				// defaults, or lib/pq without binary_parameters, claims fail with
				// 26000 or 08P01 here, and may bind another client's statement).
				if strings.Contains(logs.String(), "level=ERROR") {
					t.Errorf("the relays logged errors:\n%s", logs.String())
				}
			})
		}
	}
}

// publishThrough commits bouncerPublishers x bouncerTxs business
// transactions concurrently, each inserting an order and publishing its
// message; it returns the ids of the committed messages and the errors of
// the transactions that failed.
func publishThrough(t *testing.T, e *env, begin func(context.Context) (txn, error)) (ids []outbox.ID, failed []error) {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range bouncerPublishers {
		wg.Go(func() {
			for i := range bouncerTxs {
				order := fmt.Sprintf("o-%d-%d", g, i)
				id, err := publishOrder(ctx, e, begin, order)
				mu.Lock()
				if err != nil {
					failed = append(failed, fmt.Errorf("%s: %w", order, err))
				} else {
					ids = append(ids, id)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ids, failed
}

func publishOrder(ctx context.Context, e *env, begin func(context.Context) (txn, error), order string) (outbox.ID, error) {
	tx, err := begin(ctx)
	if err != nil {
		return outbox.ID{}, fmt.Errorf("begin: %w", err)
	}
	if err := tx.exec(`INSERT INTO `+e.orders+` (id) VALUES ($1)`, order); err != nil {
		_ = tx.rollback()
		return outbox.ID{}, fmt.Errorf("insert order: %w", err)
	}
	res, err := e.ob.Publish(ctx, tx.tx, outbox.Message{Topic: "order.placed", Key: order,
		Payload: []byte(`{"order": "` + strings.TrimPrefix(order, "o-") + `"}`)})
	if err != nil {
		_ = tx.rollback()
		return outbox.ID{}, fmt.Errorf("publish: %w", err)
	}
	if err := tx.commit(); err != nil {
		return outbox.ID{}, fmt.Errorf("commit: %w", err)
	}
	return res.ID, nil
}

// TestPgBouncerMigrate: postgres.Migrate works through PgBouncer in
// transaction pooling mode on every driver with the documented settings
// (one transaction, and a transaction-scoped advisory lock), also from two
// replicas at once.
func TestPgBouncerMigrate(t *testing.T) {
	for _, tc := range []struct {
		name string
		db   func(t *testing.T, url string) *sql.DB
	}{
		{"pgxpool", func(t *testing.T, url string) *sql.DB {
			db := stdlib.OpenDBFromPool(bouncerPool(t, url))
			t.Cleanup(func() { db.Close() })
			return db
		}},
		{"pgxstdlib", func(t *testing.T, url string) *sql.DB { return openSQL(t, "pgx", withParam(url, pgxStdlibParams)) }},
		{"libpq", func(t *testing.T, url string) *sql.DB { return openSQL(t, "postgres", withParam(url, libpqParams)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := tc.db(t, pgtest.BouncerURL(t))
			schema := pgtest.Schema(t)
			table := schema + ".outbox"
			errs := make(chan error, 2)
			for range 2 {
				go func() { errs <- postgres.Migrate(context.Background(), db, table) }()
			}
			for range 2 {
				if err := <-errs; err != nil {
					t.Errorf("migrate through PgBouncer: %v", err)
				}
			}
			migs, err := migrations.Load(migrations.Postgres(), table)
			if err != nil {
				t.Fatal(err)
			}
			if n := count(t, schema+".oncommit_migrations", ""); n != len(migs) {
				t.Errorf("%d migrations recorded, want %d, each once", n, len(migs))
			}
			if n := count(t, table, ""); n != 0 {
				t.Errorf("%d rows in a new table", n)
			}
		})
	}
}

// TestPgBouncerNotifyToDirectRelay: NOTIFY is transactional, so a publish
// through PgBouncer can still wake a relay that listens on a connection to
// the server itself (not through PgBouncer): with a one-minute poll, the
// messages are delivered within seconds.
func TestPgBouncerNotifyToDirectRelay(t *testing.T) {
	t.Parallel()
	url := pgtest.BouncerURL(t)
	e := newEnv(t, outbox.Config{})
	r, err := e.ob.Relay(pgxtx.FromPool(pgtest.Pool(t)), fast(t, outbox.RelayConfig{Listen: outbox.ListenOn, PollInterval: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	if err := r.Handle("order.placed", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil }); err != nil {
		t.Fatal(err)
	}
	start(t, r)
	time.Sleep(500 * time.Millisecond) // the first poll and the LISTEN
	begin := pgxBegin(t, bouncerPool(t, url))
	for i := range 3 {
		id, err := publishOrder(context.Background(), e, begin, fmt.Sprintf("o-n-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "woken delivery", func() bool { return len(rec.attempts(id)) == 1 })
	}
}
