package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxtest"
)

func mustNew(t *testing.T, cfg outbox.Config) *outbox.Outbox {
	t.Helper()
	ob, err := outbox.New(postgres.Dialect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

// TestPublishNeverOwnsTheTransaction: with sqlmock, the only statement
// Publish sends is its INSERT; Begin, Commit and Rollback are the caller's.
func TestPublishNeverOwnsTheTransaction(t *testing.T) {
	ob := mustNew(t, outbox.Config{})
	msg := outbox.Message{Topic: "order.placed", Key: "1", Payload: []byte(`{"id":1}`), DedupKey: "order.placed/1"}
	for _, commit := range []bool{true, false} {
		db, mock, err := sqlmock.New()
		if err != nil {
			t.Fatal(err)
		}
		mock.ExpectBegin()
		mock.ExpectExec(`INSERT INTO orders`).WillReturnResult(sqlmock.NewResult(0, 1))
		outboxtest.ExpectPublish(mock, ob, msg)
		outboxtest.ExpectPublish(mock, ob, msg, msg)
		outboxtest.ExpectPublishDuplicate(mock, ob, msg)
		if commit {
			mock.ExpectCommit()
		} else {
			mock.ExpectRollback()
		}

		ctx := context.Background()
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(`INSERT INTO orders (id) VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		res, err := ob.Publish(ctx, sqltx.From(tx), msg)
		if err != nil || res.Duplicate || res.ID.IsZero() {
			t.Fatalf("publish: %+v %v", res, err)
		}
		batch, err := ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{msg, msg})
		if err != nil || len(batch) != 2 || batch[0].Duplicate || batch[1].Duplicate {
			t.Fatalf("batch: %+v %v", batch, err)
		}
		dup, err := ob.Publish(ctx, sqltx.From(tx), msg)
		if err != nil || !dup.Duplicate || !dup.ID.IsZero() {
			t.Fatalf("duplicate: %+v %v", dup, err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Fatal(err)
		}
		db.Close()
	}
}

// TestPublishSQLPinned pins the exact statements.
func TestPublishSQLPinned(t *testing.T) {
	const conflict = ` ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING`
	off := outbox.Config{Notify: outbox.NotifyOff}
	app := outbox.Config{Table: "app.outbox"}
	nb := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		cfg  outbox.Config
		msgs []outbox.Message
		want string
		args []any // after the ids
	}{
		{off, []outbox.Message{{Topic: "t"}},
			`INSERT INTO "outbox" (id, topic) VALUES ($1, $2)`, []any{"t"}},
		{off, []outbox.Message{{Topic: "t", DedupKey: "d"}},
			`INSERT INTO "outbox" (id, topic, dedup_key) VALUES ($1, $2, $3)` + conflict + ` RETURNING id::text`, []any{"t", "d"}},
		{app, []outbox.Message{{Topic: "t", Key: "k", Payload: []byte(`{}`)}},
			`WITH ins AS (INSERT INTO "app"."outbox" (id, topic, message_key, payload) VALUES ($1, $2, $3, $4)) SELECT FROM pg_notify('app.outbox', '2000')`, []any{"t", "k", "{}"}},
		{app, []outbox.Message{{Topic: "t", DedupKey: "d", Headers: map[string]string{"h": "v"}}},
			`WITH ins AS (INSERT INTO "app"."outbox" (id, topic, headers, dedup_key) VALUES ($1, $2, $3, $4)` + conflict + ` RETURNING id::text) SELECT ins.id FROM pg_notify('app.outbox', '2000'), ins`, []any{"t", `{"h":"v"}`, "d"}},
		{off, []outbox.Message{{Topic: "a", Delay: 1500 * time.Millisecond}, {Topic: "b", Key: "k"}, {Topic: "c", NotBefore: nb}},
			`INSERT INTO "outbox" (id, topic, message_key, available_at) VALUES ($1, $2, $3, now() + make_interval(secs => $4)), ($5, $6, $7, now()), ($8, $9, $10, greatest(now(), $11::timestamptz))`,
			[]any{"a", nil, 1.5, "b", "k", "c", nil, nb}},
	} {
		st, err := mustNew(t, tc.cfg).PublishSQL(tc.msgs...)
		if err != nil {
			t.Fatal(err)
		}
		if st.Query != tc.want {
			t.Errorf("statement\n got %s\nwant %s", st.Query, tc.want)
		}
		var got []any
		ids := map[string]bool{}
		for _, id := range st.IDs {
			ids[id.String()] = true
		}
		for _, a := range st.Args {
			if s, ok := a.(string); ok && ids[s] {
				continue
			}
			got = append(got, a)
		}
		if len(st.Args)-len(got) != len(tc.msgs) || !reflect.DeepEqual(got, tc.args) {
			t.Errorf("args %#v, want ids and %#v", st.Args, tc.args)
		}
	}
}

// TestTxRefusesPools pins at compile-time level that no pool or bare
// connection type is an outbox.Tx, and that the adapters take only
// transaction types.
func TestTxRefusesPools(t *testing.T) {
	txType := reflect.TypeFor[outbox.Tx]()
	for _, typ := range []reflect.Type{
		reflect.TypeFor[*sql.DB](), reflect.TypeFor[*sql.Conn](), reflect.TypeFor[*sql.Tx](),
		reflect.TypeFor[*pgxpool.Pool](), reflect.TypeFor[*pgxpool.Conn](), reflect.TypeFor[*pgx.Conn](),
		reflect.TypeFor[pgx.Tx](),
	} {
		if typ.Implements(txType) {
			t.Errorf("%v implements outbox.Tx", typ)
		}
	}
	if p := reflect.TypeOf(sqltx.From).In(0); p != reflect.TypeFor[*sql.Tx]() {
		t.Errorf("sqltx.From takes %v", p)
	}
	pgxTx := reflect.TypeOf(pgxtx.From).In(0)
	for _, typ := range []reflect.Type{reflect.TypeFor[*pgxpool.Pool](), reflect.TypeFor[*pgx.Conn](), reflect.TypeFor[*pgxpool.Conn]()} {
		if typ.AssignableTo(pgxTx) {
			t.Errorf("pgxtx.From accepts %v", typ)
		}
	}
	if !reflect.TypeFor[*pgxpool.Tx]().AssignableTo(pgxTx) {
		t.Error("pgxtx.From refuses *pgxpool.Tx")
	}
}

// badMessages lists every bad input Publish refuses before sending SQL.
var badMessages = []struct {
	name  string
	msg   outbox.Message
	field string
}{
	{"empty topic", outbox.Message{}, "Topic"},
	{"blank topic", outbox.Message{Topic: " \t"}, "Topic"},
	{"long topic", outbox.Message{Topic: strings.Repeat("t", outbox.MaxTopicBytes+1)}, "Topic"},
	{"topic invalid utf8", outbox.Message{Topic: "a\xffb"}, "Topic"},
	{"topic NUL", outbox.Message{Topic: "a\x00b"}, "Topic"},
	{"key NUL", outbox.Message{Topic: "t", Key: "\x00"}, "Key"},
	{"long key", outbox.Message{Topic: "t", Key: strings.Repeat("k", outbox.MaxKeyBytes+1)}, "Key"},
	{"invalid json", outbox.Message{Topic: "t", Payload: []byte(`{"a":`)}, "Payload"},
	{"NaN", outbox.Message{Topic: "t", Payload: []byte(`NaN`)}, "Payload"},
	{"u0000", outbox.Message{Topic: "t", Payload: []byte(`{"a":"x\u0000y"}`)}, "Payload"},
	{"invalid utf8 in string", outbox.Message{Topic: "t", Payload: []byte("{\"a\":\"\xff\"}")}, "Payload"},
	{"deep nesting", outbox.Message{Topic: "t", Payload: []byte(strings.Repeat("[", outbox.MaxPayloadDepth+1) + strings.Repeat("]", outbox.MaxPayloadDepth+1))}, "Payload"},
	{"lone surrogate", outbox.Message{Topic: "t", Payload: []byte(`{"a":"\udc00\ud800"}`)}, "Payload"},
	{"number beyond numeric", outbox.Message{Topic: "t", Payload: []byte(`[1e131072]`)}, "Payload"},
	{"payload too large", outbox.Message{Topic: "t", Payload: []byte(`"` + strings.Repeat("x", outbox.DefaultMaxPayloadBytes) + `"`)}, "Payload"},
	{"header NUL", outbox.Message{Topic: "t", Headers: map[string]string{"a": "\x00"}}, "Headers"},
	{"header key invalid utf8", outbox.Message{Topic: "t", Headers: map[string]string{"\xff": "v"}}, "Headers"},
	{"header empty key", outbox.Message{Topic: "t", Headers: map[string]string{"": "v"}}, "Headers"},
	{"headers too large", outbox.Message{Topic: "t", Headers: map[string]string{"a": strings.Repeat("v", outbox.MaxHeadersBytes)}}, "Headers"},
	{"dedup NUL", outbox.Message{Topic: "t", DedupKey: "\x00"}, "DedupKey"},
	{"dedup blank", outbox.Message{Topic: "t", DedupKey: "  "}, "DedupKey"},
	{"long dedup", outbox.Message{Topic: "t", DedupKey: strings.Repeat("d", outbox.MaxDedupKeyBytes+1)}, "DedupKey"},
	{"negative delay", outbox.Message{Topic: "t", Delay: -time.Second}, "Delay"},
	{"delay and not before", outbox.Message{Topic: "t", Delay: time.Second, NotBefore: time.Now()}, "NotBefore"},
	{"far future", outbox.Message{Topic: "t", NotBefore: time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC)}, "NotBefore"},
	{"far past", outbox.Message{Topic: "t", NotBefore: time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC)}, "NotBefore"},
}

// TestBadInputSendsNothing: with sqlmock, a bad message sends no SQL at all
// (sqlmock fails any statement not expected), and the caller commits.
func TestBadInputSendsNothing(t *testing.T) {
	ob := mustNew(t, outbox.Config{})
	for _, tc := range badMessages {
		t.Run(tc.name, func(t *testing.T) {
			db, mock, err := sqlmock.New()
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			mock.ExpectBegin()
			mock.ExpectCommit()
			tx, _ := db.Begin()
			_, err = ob.Publish(context.Background(), sqltx.From(tx), tc.msg)
			checkBad(t, err, tc.field)
			_, err = ob.PublishBatch(context.Background(), sqltx.From(tx), []outbox.Message{{Topic: "ok"}, tc.msg})
			checkBad(t, err, tc.field)
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func checkBad(t *testing.T, err error, field string) {
	t.Helper()
	var me *outbox.MessageError
	if !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) || me.Field != field {
		t.Fatalf("error %v, want a MessageError on %s", err, field)
	}
}

// TestBadInputKeepsTransaction: on the real server, on every driver, each
// bad message (and a cancelled context, and an oversized batch) is refused
// and the caller's transaction still commits its business row.
func TestBadInputKeepsTransaction(t *testing.T) {
	for _, d := range drivers() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{MaxBatch: 3})
			tx := d.begin(t)
			ctx := context.Background()
			for _, tc := range badMessages {
				_, err := e.ob.Publish(ctx, tx.tx, tc.msg)
				checkBadNamed(t, tc.name, err, tc.field)
			}
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			if _, err := e.ob.Publish(cancelled, tx.tx, outbox.Message{Topic: "t"}); !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled context: %v", err)
			}
			if _, err := e.ob.PublishBatch(ctx, tx.tx, make([]outbox.Message, 4)); !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Errorf("oversized batch: %v", err)
			}
			if err := tx.exec(`INSERT INTO ` + e.orders + ` (id) VALUES ('survivor')`); err != nil {
				t.Fatalf("transaction unusable after refused input: %v", err)
			}
			ok, err := e.ob.Publish(ctx, tx.tx, outbox.Message{Topic: "ok", Payload: []byte(`null`)})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.commit(); err != nil {
				t.Fatal(err)
			}
			if n := count(t, e.orders, `id = 'survivor'`); n != 1 {
				t.Errorf("business row missing after commit")
			}
			if n := count(t, e.table, ""); n != 1 {
				t.Errorf("%d messages, want only the valid one", n)
			}
			if n := count(t, e.table, `id = $1 AND payload = 'null'::jsonb`, ok.ID.String()); n != 1 {
				t.Errorf("JSON null payload not stored as JSON null")
			}
		})
	}
}

func checkBadNamed(t *testing.T, name string, err error, field string) {
	t.Helper()
	var me *outbox.MessageError
	if !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) || me.Field != field {
		t.Errorf("%s: error %v, want a MessageError on %s", name, err, field)
	}
}
