package mysql_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/mysql/internal/mysqltest"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// countingTx counts the statements Publish sends through it.
type countingTx struct {
	outbox.Tx
	n atomic.Int32
}

func (c *countingTx) QueryTx(ctx context.Context, q string, args ...any) (outboxdriver.Rows, error) {
	c.n.Add(1)
	return c.Tx.QueryTx(ctx, q, args...)
}

func (c *countingTx) ExecTx(ctx context.Context, q string, args ...any) error {
	c.n.Add(1)
	return c.Tx.ExecTx(ctx, q, args...)
}

func jsonEqual(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

// TestPublishAtomicity: a committed business transaction leaves exactly its
// messages, with the ids Publish returned in the text form SQL shows; a
// rolled-back one leaves none; scheduling is on the database clock.
func TestPublishAtomicity(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	ctx := context.Background()
	tx := e.begin(t)
	if _, err := tx.Exec(`INSERT INTO ` + e.orders + ` (id) VALUES ('kept')`); err != nil {
		t.Fatal(err)
	}
	ctr := &countingTx{Tx: sqltx.From(tx)}
	one, err := e.ob.Publish(ctx, ctr, outbox.Message{Topic: "order.placed", Key: "kept", Payload: []byte(`{"n":1}`),
		Headers: map[string]string{"trace": "abc"}})
	if err != nil {
		t.Fatal(err)
	}
	if n := ctr.n.Load(); n != 1 {
		t.Errorf("Publish without a dedup key sent %d statements, want 1", n)
	}
	batch, err := e.ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{
		{Topic: "order.placed", Delay: time.Hour},
		{Topic: "order.now"},
		{Topic: "order.shipped", NotBefore: time.Now().Add(48 * time.Hour)},
		{Topic: "order.past", NotBefore: time.Date(1971, 1, 1, 0, 0, 0, 0, time.UTC)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []outbox.ID{one.ID, batch[0].ID, batch[1].ID, batch[2].ID} {
		// One text form: the id the caller holds is the one SQL prints.
		if n := count(t, e.table, `id = ? AND state = 'pending' AND attempts = 0`, id.String()); n != 1 {
			t.Errorf("id %s: %d rows, want 1", id, n)
		}
	}
	var payload, headers, key string
	if err := mysqltest.Admin(t).QueryRow(`SELECT payload, headers, message_key FROM `+e.table+` WHERE id = ?`, one.ID.String()).
		Scan(&payload, &headers, &key); err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(payload, `{"n":1}`) || !jsonEqual(headers, `{"trace":"abc"}`) || key != "kept" {
		t.Errorf("stored payload %q headers %q key %q", payload, headers, key)
	}
	if n := count(t, e.table, `id = ? AND TIMESTAMPDIFF(SECOND, created_at, available_at) BETWEEN 3599 AND 3601`, batch[0].ID.String()); n != 1 {
		t.Error("delayed message not scheduled one hour after the database's now")
	}
	if n := count(t, e.table, `id = ? AND available_at = created_at`, batch[1].ID.String()); n != 1 {
		t.Error("immediate message in a scheduled batch not due at once")
	}
	if n := count(t, e.table, `id = ? AND available_at > UTC_TIMESTAMP(6) + INTERVAL 47 HOUR`, batch[2].ID.String()); n != 1 {
		t.Error("NotBefore message not scheduled at its time")
	}
	if n := count(t, e.table, `id = ? AND available_at = created_at`, batch[3].ID.String()); n != 1 {
		t.Error("NotBefore in the past not raised to the database's now")
	}
	// Sub-second precision from the server clock.
	if n := count(t, e.table, `MICROSECOND(created_at) <> 0`); n == 0 {
		t.Error("created_at has no sub-second part")
	}

	tx = e.begin(t)
	if _, err := tx.Exec(`INSERT INTO ` + e.orders + ` (id) VALUES ('dropped')`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "order.placed", Key: "dropped"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, e.table, `message_key = 'dropped'`); n != 0 {
		t.Errorf("%d messages after rollback, want 0", n)
	}
	if n := count(t, e.orders, ""); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
	if _, err := e.ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "t"}); !errors.Is(err, outbox.ErrTxDone) {
		t.Errorf("finished transaction: %v", err)
	}
}

// TestPublishErrorsClassified: a read-only transaction and a missing table
// give the outbox sentinels, with the driver's error still reachable, and
// the caller's transaction stays usable (MySQL fails only the statement).
func TestPublishErrorsClassified(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	ctx := context.Background()
	ro, err := e.pool.BeginTx(ctx, &sqlTxReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Rollback()
	_, err = e.ob.Publish(ctx, sqltx.From(ro), outbox.Message{Topic: "t"})
	if !errors.Is(err, outbox.ErrReadOnlyTx) || errors.Is(err, outbox.ErrTxAborted) {
		t.Errorf("read-only transaction: %v", err)
	}
	var n int
	if err := ro.QueryRow(`SELECT count(*) FROM ` + e.table).Scan(&n); err != nil || n != 0 {
		t.Errorf("read-only transaction unusable afterwards: %d %v", n, err)
	}

	missing, err := outbox.New(mysql.Dialect(), outbox.Config{Table: e.db + ".nope"})
	if err != nil {
		t.Fatal(err)
	}
	tx := e.begin(t)
	for _, m := range []outbox.Message{{Topic: "t"}, {Topic: "t", DedupKey: "k"}} {
		if _, err := missing.Publish(ctx, sqltx.From(tx), m); !errors.Is(err, outbox.ErrTableMissing) {
			t.Errorf("missing table (dedup %q): %v", m.DedupKey, err)
		}
	}
	if _, err := tx.Exec(`INSERT INTO ` + e.orders + ` (id) VALUES ('after-error')`); err != nil {
		t.Fatalf("transaction unusable after a missing table: %v", err)
	}
	if _, err := e.ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if count(t, e.orders, `id = 'after-error'`) != 1 || count(t, e.table, "") != 1 {
		t.Error("business row or message missing after commit")
	}
	if _, err := e.ob.Publish(ctx, sqltx.From(nil), outbox.Message{Topic: "t"}); !errors.Is(err, outbox.ErrNilTx) {
		t.Errorf("nil transaction: %v", err)
	}
}

// TestDedup: one dedup key published twice (same transaction, same batch,
// and eight concurrent transactions) stores one row, reports the duplicate
// and leaves every transaction usable: each business row commits.
func TestDedup(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	ctx := context.Background()
	msg := outbox.Message{Topic: "order.placed", DedupKey: "order.placed/1"}

	tx := e.begin(t)
	ctr := &countingTx{Tx: sqltx.From(tx)}
	first, err := e.ob.Publish(ctx, ctr, msg)
	if err != nil || first.Duplicate || first.ID.IsZero() {
		t.Fatalf("first publish: %+v, %v", first, err)
	}
	if n := ctr.n.Load(); n != 2 {
		t.Errorf("Publish with a dedup key sent %d statements, want 2 (INSERT, then the stored ids)", n)
	}
	second, err := e.ob.Publish(ctx, sqltx.From(tx), msg)
	if err != nil || !second.Duplicate || !second.ID.IsZero() {
		t.Fatalf("second publish: %+v, %v; want a duplicate", second, err)
	}
	res, err := e.ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{
		{Topic: "a", DedupKey: "k2"}, {Topic: "b", DedupKey: "k2"}, {Topic: "c"}, msg, {Topic: "d", DedupKey: "K2"}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Duplicate || !res[1].Duplicate || res[2].Duplicate || !res[3].Duplicate || res[4].Duplicate {
		t.Errorf("batch results %+v, want stored, duplicate, stored, duplicate, stored (keys are case-sensitive)", res)
	}
	if _, err := tx.Exec(`INSERT INTO ` + e.orders + ` (id) VALUES ('after-duplicate')`); err != nil {
		t.Fatalf("transaction unusable after a duplicate: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, e.table, ""); n != 4 {
		t.Errorf("%d rows, want 4", n)
	}
	if n := count(t, e.table, `id = ? AND topic = 'order.placed'`, first.ID.String()); n != 1 {
		t.Error("the first message was changed by a duplicate")
	}

	// Eight concurrent transactions with one key: one stores it, every
	// business transaction commits.
	const workers = 8
	dialecttest.DedupRace(t, e.ob, workers, "concurrent", func(i int) (outbox.Tx, func() error, error) {
		tx := e.begin(t)
		_, err := tx.Exec(`INSERT INTO `+e.orders+` (id) VALUES (?)`, fmt.Sprint("c", i))
		return sqltx.From(tx), tx.Commit, err
	})
	if n := count(t, e.table, `dedup_key = 'concurrent'`); n != 1 {
		t.Errorf("%d rows for the key, want 1", n)
	}
	if n := count(t, e.orders, `id LIKE 'c%'`); n != workers {
		t.Errorf("%d business rows committed, want %d", n, workers)
	}
}

// TestBadInputKeepsTransaction: each bad message (and a cancelled context,
// and an oversized batch) is refused before any statement is sent, and the
// caller's transaction still commits its business row.
func TestBadInputKeepsTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{MaxBatch: 3})
	tx := e.begin(t)
	ctr := &countingTx{Tx: sqltx.From(tx)}
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		msg   outbox.Message
		field string
	}{
		{"empty topic", outbox.Message{}, "Topic"},
		{"blank topic", outbox.Message{Topic: " \t"}, "Topic"},
		{"long topic", outbox.Message{Topic: strings.Repeat("t", outbox.MaxTopicBytes+1)}, "Topic"},
		{"bad utf8 topic", outbox.Message{Topic: "t\xff"}, "Topic"},
		{"nul topic", outbox.Message{Topic: "t\x00"}, "Topic"},
		{"invalid json", outbox.Message{Topic: "t", Payload: []byte("{")}, "Payload"},
		{"nan", outbox.Message{Topic: "t", Payload: []byte("NaN")}, "Payload"},
		{"nul escape", outbox.Message{Topic: "t", Payload: []byte(`"\u0000"`)}, "Payload"},
		{"too deep", outbox.Message{Topic: "t", Payload: []byte(strings.Repeat("[", mysql.MaxJSONDepth+1) + strings.Repeat("]", mysql.MaxJSONDepth+1))}, "Payload"},
		{"lone surrogate", outbox.Message{Topic: "t", Payload: []byte(`"\ud800"`)}, "Payload"},
		{"too big", outbox.Message{Topic: "t", Payload: []byte(`"` + strings.Repeat("x", outbox.DefaultMaxPayloadBytes) + `"`)}, "Payload"},
		{"long dedup", outbox.Message{Topic: "t", DedupKey: strings.Repeat("d", outbox.MaxDedupKeyBytes+1)}, "DedupKey"},
		{"bad header", outbox.Message{Topic: "t", Headers: map[string]string{"k": "\xff"}}, "Headers"},
		{"negative delay", outbox.Message{Topic: "t", Delay: -time.Second}, "Delay"},
		{"far future", outbox.Message{Topic: "t", NotBefore: time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC)}, "NotBefore"},
	} {
		_, err := e.ob.Publish(ctx, ctr, tc.msg)
		var me *outbox.MessageError
		if !errors.As(err, &me) || me.Field != tc.field {
			t.Errorf("%s: %v, want a MessageError on %s", tc.name, err, tc.field)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.ob.Publish(cancelled, ctr, outbox.Message{Topic: "t"}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
	if _, err := e.ob.PublishBatch(ctx, ctr, make([]outbox.Message, 4)); !errors.Is(err, outbox.ErrInvalidMessage) {
		t.Errorf("oversized batch: %v", err)
	}
	if n := ctr.n.Load(); n != 0 {
		t.Errorf("%d statements sent for refused input, want 0", n)
	}
	if _, err := tx.Exec(`INSERT INTO ` + e.orders + ` (id) VALUES ('survivor')`); err != nil {
		t.Fatalf("transaction unusable after refused input: %v", err)
	}
	ok, err := e.ob.Publish(ctx, ctr, outbox.Message{Topic: `o'rder"; DROP TABLE x; --`, Key: "ключ", Payload: []byte(`null`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, e.orders, `id = 'survivor'`); n != 1 {
		t.Error("business row missing after commit")
	}
	if n := count(t, e.table, ""); n != 1 {
		t.Errorf("%d messages, want only the valid one", n)
	}
	if n := count(t, e.table, `id = ? AND payload = 'null' AND topic = ? AND message_key = 'ключ'`, ok.ID.String(), `o'rder"; DROP TABLE x; --`); n != 1 {
		t.Error("JSON null payload, topic or key not stored as given")
	}
}

// TestMigrateConcurrent: replicas starting together apply each migration
// once, under the named lock.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	db := mysqltest.Database(t)
	table := db + ".orders_outbox"
	pool := mysqltest.Open(t, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- mysql.Migrate(context.Background(), pool, table)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	migs, err := migrations.Load(migrations.MySQL(), table)
	if err != nil {
		t.Fatal(err)
	}
	// One record per migration: each was applied once.
	if n := count(t, db+".oncommit_migrations", `table_name = 'orders_outbox'`); n != len(migs) {
		t.Errorf("%d migration records, want %d", n, len(migs))
	}
	rows, err := mysqltest.Admin(t).Query(`SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema = ? AND table_name = 'orders_outbox' ORDER BY 1`, db)
	if err != nil {
		t.Fatal(err)
	}
	var idx []string
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		idx = append(idx, s)
	}
	rows.Close()
	sort.Strings(idx)
	if got := strings.Join(idx, ","); got != "PRIMARY,orders_outbox_claim_idx,orders_outbox_dedup_idx,orders_outbox_key_seq_idx,orders_outbox_settled_idx" {
		t.Errorf("indexes %s", got)
	}
	// The keys table of ordered delivery (0006) is named after the table.
	if n := count(t, "information_schema.tables", "table_schema = ? AND table_name = 'orders_outbox_keys'", db); n != 1 {
		t.Error("no table orders_outbox_keys")
	}
	if err := mysql.Migrate(context.Background(), pool, "Bad-Name"); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("bad table name: %v", err)
	}
}
