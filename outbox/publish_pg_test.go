package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outbox"
)

// TestPublishAtomicity: a committed business transaction leaves exactly its
// messages, with the ids Publish returned; a rolled-back one leaves none.
func TestPublishAtomicity(t *testing.T) {
	for _, d := range drivers() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{})
			ctx := context.Background()

			tx := d.begin(t)
			if err := tx.exec(`INSERT INTO ` + e.orders + ` (id) VALUES ('kept')`); err != nil {
				t.Fatal(err)
			}
			one, err := e.ob.Publish(ctx, tx.tx, outbox.Message{Topic: "order.placed", Key: "kept", Payload: []byte(`{"n":1}`),
				Headers: map[string]string{"trace": "abc"}})
			if err != nil {
				t.Fatal(err)
			}
			batch, err := e.ob.PublishBatch(ctx, tx.tx, []outbox.Message{
				{Topic: "order.placed", Delay: time.Hour},
				{Topic: "order.shipped", NotBefore: time.Now().Add(48 * time.Hour)},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.commit(); err != nil {
				t.Fatal(err)
			}
			want := []outbox.ID{one.ID, batch[0].ID, batch[1].ID}
			for _, id := range want {
				if id.IsZero() {
					t.Fatal("zero id for a stored message")
				}
				// One text form: the id the caller holds is the one SQL prints.
				if n := count(t, e.table, `id::text = $1 AND state = 'pending' AND attempts = 0`, id.String()); n != 1 {
					t.Errorf("id %s: %d rows, want 1", id, n)
				}
			}
			if n := count(t, e.table, ""); n != 3 {
				t.Errorf("%d messages after commit, want 3", n)
			}
			var payload, headers, key string
			err = pgtest.Admin(t).QueryRow(`SELECT payload::text, headers::text, message_key FROM `+e.table+` WHERE id = $1`, one.ID.String()).
				Scan(&payload, &headers, &key)
			if err != nil || payload != `{"n": 1}` || headers != `{"trace": "abc"}` || key != "kept" {
				t.Errorf("stored payload %q headers %q key %q err %v", payload, headers, key, err)
			}
			// Scheduling is on the database clock: the delayed row is due
			// about an hour after the transaction's now().
			if n := count(t, e.table, `id = $1 AND available_at - created_at BETWEEN interval '59 minutes' AND interval '61 minutes'`, batch[0].ID.String()); n != 1 {
				t.Error("delayed message not scheduled one hour after now()")
			}
			if n := count(t, e.table, `id = $1 AND available_at > now() + interval '47 hours'`, batch[1].ID.String()); n != 1 {
				t.Error("NotBefore message not scheduled at its time")
			}

			tx = d.begin(t)
			if err := tx.exec(`INSERT INTO ` + e.orders + ` (id) VALUES ('dropped')`); err != nil {
				t.Fatal(err)
			}
			if _, err := e.ob.Publish(ctx, tx.tx, outbox.Message{Topic: "order.placed", Key: "dropped"}); err != nil {
				t.Fatal(err)
			}
			if err := tx.rollback(); err != nil {
				t.Fatal(err)
			}
			if n := count(t, e.table, `message_key = 'dropped'`); n != 0 {
				t.Errorf("%d messages after rollback, want 0", n)
			}
			if n := count(t, e.orders, ""); n != 1 {
				t.Errorf("%d orders, want 1", n)
			}
		})
	}
}

// TestPublishTxState: a finished transaction and an aborted one give
// distinct, documented errors on every driver; a pgx connection in
// autocommit gives ErrNotInTransaction.
func TestPublishTxState(t *testing.T) {
	sentinels := []error{outbox.ErrTxDone, outbox.ErrTxAborted, outbox.ErrNotInTransaction, outbox.ErrNilTx}
	only := func(t *testing.T, err, want error) {
		t.Helper()
		for _, s := range sentinels {
			if errors.Is(err, s) != (s == want) {
				t.Errorf("error %v: errors.Is(%v) = %v", err, s, !(s == want))
			}
		}
	}
	msg := outbox.Message{Topic: "t"}
	for _, d := range drivers() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{})
			ctx := context.Background()

			tx := d.begin(t)
			if err := tx.commit(); err != nil {
				t.Fatal(err)
			}
			_, err := e.ob.Publish(ctx, tx.tx, msg)
			if d.name == "pgxconn" {
				// A bare connection after COMMIT is in autocommit.
				only(t, err, outbox.ErrNotInTransaction)
			} else {
				only(t, err, outbox.ErrTxDone)
			}

			tx = d.begin(t)
			if err := tx.exec(`SELECT 1/0`); err == nil {
				t.Fatal("division by zero succeeded")
			}
			_, err = e.ob.Publish(ctx, tx.tx, msg)
			only(t, err, outbox.ErrTxAborted)
			if err := tx.rollback(); err != nil {
				t.Fatal(err)
			}
			if n := count(t, e.table, ""); n != 0 {
				t.Errorf("%d messages, want 0", n)
			}
		})
	}
	t.Run("pgxconn-autocommit", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, outbox.Config{})
		ctx := context.Background()
		var tr countTracer
		cc, err := pgx.ParseConfig(pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		cc.Tracer = &tr
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil || tr.n != 1 {
			t.Fatalf("tracer does not count: %d, %v", tr.n, err)
		}
		tr.n = 0
		_, err = e.ob.Publish(ctx, pgxtx.FromConn(conn), msg)
		only(t, err, outbox.ErrNotInTransaction)
		if tr.n != 0 {
			t.Errorf("%d statements sent for a connection in autocommit, want 0", tr.n)
		}
		if n := count(t, e.table, ""); n != 0 {
			t.Errorf("%d messages, want 0", n)
		}
	})
	t.Run("nil", func(t *testing.T) {
		ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tx := range []outbox.Tx{nil, sqltx.From(nil), pgxtx.From(nil), pgxtx.FromConn(nil)} {
			_, err := ob.Publish(context.Background(), tx, msg)
			only(t, err, outbox.ErrNilTx)
		}
	})
}

// countTracer counts the queries a pgx connection sends.
type countTracer struct {
	mu sync.Mutex
	n  int
	q  []string
}

func (c *countTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	c.n++
	c.q = append(c.q, d.SQL)
	c.mu.Unlock()
	return ctx
}

func (c *countTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestDedup: one dedup key published twice (same transaction, same batch,
// and eight concurrent transactions) stores one row, reports the duplicate
// and leaves every transaction usable.
func TestDedup(t *testing.T) {
	for _, d := range drivers() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{})
			ctx := context.Background()
			msg := outbox.Message{Topic: "order.placed", DedupKey: "order.placed/1"}

			tx := d.begin(t)
			first, err := e.ob.Publish(ctx, tx.tx, msg)
			if err != nil || first.Duplicate || first.ID.IsZero() {
				t.Fatalf("first publish: %+v, %v", first, err)
			}
			second, err := e.ob.Publish(ctx, tx.tx, msg)
			if err != nil || !second.Duplicate || !second.ID.IsZero() {
				t.Fatalf("second publish: %+v, %v; want a duplicate", second, err)
			}
			res, err := e.ob.PublishBatch(ctx, tx.tx, []outbox.Message{
				{Topic: "a", DedupKey: "k2"}, {Topic: "b", DedupKey: "k2"}, {Topic: "c"}, msg})
			if err != nil {
				t.Fatal(err)
			}
			if res[0].Duplicate || !res[1].Duplicate || res[2].Duplicate || !res[3].Duplicate {
				t.Errorf("batch results %+v, want stored, duplicate, stored, duplicate", res)
			}
			if err := tx.exec(`INSERT INTO ` + e.orders + ` (id) VALUES ('after-duplicate')`); err != nil {
				t.Fatalf("transaction unusable after a duplicate: %v", err)
			}
			if err := tx.commit(); err != nil {
				t.Fatal(err)
			}
			if n := count(t, e.table, ""); n != 3 {
				t.Errorf("%d rows, want 3", n)
			}

			// Eight concurrent transactions with one key: one stores it.
			const workers = 8
			dialecttest.DedupRace(t, e.ob, workers, "concurrent", func(i int) (outbox.Tx, func() error, error) {
				tx := d.begin(t)
				return tx.tx, tx.commit, tx.exec(`INSERT INTO `+e.orders+` (id) VALUES ($1)`, fmt.Sprint("c", i))
			})
			if n := count(t, e.table, `dedup_key = 'concurrent'`); n != 1 {
				t.Errorf("%d rows for the key, want 1", n)
			}
			if n := count(t, e.orders, `id LIKE 'c%'`); n != workers {
				t.Errorf("%d business rows committed, want %d", n, workers)
			}
		})
	}
}

// TestNotify: the wake-up is delivered on commit and never on rollback; with
// NotifyOff none is sent; Publish sends one statement either way. Every
// publish notifies here (NotifyEvery): TestNotifyIntervalCoalesces covers
// the default, coalesced notifications.
func TestNotify(t *testing.T) {
	for _, mode := range []outbox.NotifyMode{outbox.NotifyAuto, outbox.NotifyOff} {
		t.Run(fmt.Sprint("mode", mode), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{Notify: mode, NotifyInterval: outbox.NotifyEvery})
			ctx := context.Background()
			listener, channel := listenTo(t, e)
			var tr countTracer
			pcfg, err := pgxpool.ParseConfig(pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			pcfg.ConnConfig.Tracer = &tr
			pool, err := pgxpool.NewWithConfig(ctx, pcfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			marker := func(s string) {
				if _, err := pool.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, s); err != nil {
					t.Fatal(err)
				}
			}
			next := func() string {
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				n, err := listener.WaitForNotification(wctx)
				if err != nil {
					t.Fatal(err)
				}
				return n.Payload
			}
			publish := func(commit bool) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				tr.mu.Lock()
				tr.n, tr.q = 0, nil
				tr.mu.Unlock()
				_, err = e.ob.PublishBatch(ctx, pgxtx.From(tx), []outbox.Message{{Topic: "a"}, {Topic: "b"}})
				if err != nil {
					t.Fatal(err)
				}
				tr.mu.Lock()
				if tr.n != 1 {
					t.Errorf("Publish sent %d statements, want 1: %q", tr.n, tr.q)
				}
				tr.mu.Unlock()
				if commit {
					err = tx.Commit(ctx)
				} else {
					err = tx.Rollback(ctx)
				}
				if err != nil {
					t.Fatal(err)
				}
			}

			publish(false)
			marker("after-rollback")
			if got := next(); got != "after-rollback" {
				t.Fatalf("first notification %q: a rolled-back publish notified", got)
			}
			publish(true)
			marker("after-commit")
			got := next()
			if mode == outbox.NotifyOff {
				if got != "after-commit" {
					t.Fatalf("notification %q with NotifyOff", got)
				}
				return
			}
			if got != "" {
				t.Fatalf("first notification after commit %q, want the publish's empty payload", got)
			}
			if got := next(); got != "after-commit" {
				t.Fatalf("then %q, want the marker: more than one notification per transaction", got)
			}
		})
	}
}

// TestMigrateConcurrent: replicas starting together apply each migration once.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	table := schema + ".orders_outbox"
	db := pgtest.Open(t, "pgx")
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- postgres.Migrate(context.Background(), db, table)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	migs, err := migrations.Load(migrations.Postgres(), "outbox")
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, schema+".oncommit_migrations", `table_name = 'orders_outbox'`); n != len(migs) {
		t.Errorf("%d migration records, want %d (one per migration)", n, len(migs))
	}
	var idx []string
	rows, err := pgtest.Admin(t).Query(`SELECT indexname FROM pg_indexes WHERE schemaname = $1 ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		idx = append(idx, s)
	}
	if got := strings.Join(idx, ","); got != "oncommit_migrations_pkey,orders_outbox_dead_idx,orders_outbox_dedup_idx,orders_outbox_key_seq_idx,orders_outbox_keys_pkey,orders_outbox_pkey,orders_outbox_settled_idx,orders_outbox_topic_claim_idx" {
		t.Errorf("indexes %s", got) // orders_outbox_keys_pkey: the keys table is in the outbox table's schema
	}
	if err := postgres.Migrate(context.Background(), db, "Bad-Name"); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("bad table name: %v", err)
	}
}

// TestAcceptedEdges: inputs at the limits that Publish accepts are stored
// as given; the database accepts everything the validation lets through.
func TestAcceptedEdges(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	d := drivers()[2] // pgxpool
	tx := d.begin(t)
	ctx := context.Background()
	deep := strings.Repeat("[", outbox.MaxPayloadDepth) + strings.Repeat("]", outbox.MaxPayloadDepth)
	zone := time.FixedZone("UTC+5", 5*3600)
	msgs := []outbox.Message{
		{Topic: `o'rder"; DROP TABLE x; --`, Key: "ключ", DedupKey: strings.Repeat("d", outbox.MaxDedupKeyBytes)},
		{Topic: strings.Repeat("é", outbox.MaxTopicBytes/2), Payload: []byte(deep)},
		{Topic: "escaped", Payload: []byte(`{"a":"\\u0000 stays text","b":"\u00e9🙂"}`)},
		{Topic: "zoned", NotBefore: time.Date(2100, 1, 1, 5, 0, 0, 0, zone)},
		{Topic: "past", NotBefore: time.Date(1971, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Topic: "big", Payload: []byte(`"` + strings.Repeat("x", outbox.DefaultMaxPayloadBytes-2) + `"`)},
	}
	res, err := e.ob.PublishBatch(ctx, tx.tx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.commit(); err != nil {
		t.Fatal(err)
	}
	var topic, key string
	if err := pgtest.Admin(t).QueryRow(`SELECT topic, message_key FROM `+e.table+` WHERE id = $1`, res[0].ID.String()).Scan(&topic, &key); err != nil {
		t.Fatal(err)
	}
	if topic != msgs[0].Topic || key != msgs[0].Key {
		t.Errorf("stored %q %q", topic, key)
	}
	if n := count(t, e.table, `id = $1 AND available_at = '2100-01-01 00:00:00+00'`, res[3].ID.String()); n != 1 {
		t.Error("NotBefore in another zone not stored as the same instant")
	}
	if n := count(t, e.table, `id = $1 AND available_at = created_at`, res[4].ID.String()); n != 1 {
		t.Error("NotBefore in the past not raised to now()")
	}
}

// TestPublishLockTimeoutIsRetryTx: a Publish that cannot get a lock in
// time (its dedup key held by another open transaction, lock_timeout
// 100ms: SQLSTATE 55P03) returns an error wrapping ErrRetryTx, on every
// driver.
func TestPublishLockTimeoutIsRetryTx(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	ctx := context.Background()
	holder, err := pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := e.ob.Publish(ctx, pgxtx.From(holder), outbox.Message{Topic: "t", DedupKey: "k"}); err != nil {
		t.Fatal(err)
	}
	for _, d := range drivers() {
		t.Run(d.name, func(t *testing.T) {
			x := d.begin(t)
			if err := x.exec(`SET LOCAL lock_timeout = '100ms'`); err != nil {
				t.Fatal(err)
			}
			_, err := e.ob.Publish(ctx, x.tx, outbox.Message{Topic: "t", DedupKey: "k"})
			if !errors.Is(err, outbox.ErrRetryTx) {
				t.Errorf("Publish waiting on a held dedup key past lock_timeout: %v, want ErrRetryTx", err)
			}
		})
	}
}
