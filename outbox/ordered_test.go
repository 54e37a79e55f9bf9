package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// plainDialect is PostgreSQL without ordered delivery: it hides the
// dialect's OrderedDialect methods.
type plainDialect struct{ outbox.Dialect }

// TestOrderByKeyConfig: OrderByKey is refused, before any SQL, by a dialect
// that cannot order and for a table name too long for the keys table
// beside it; bad dead-letter policies and SkipHead's bad input are typed
// errors.
func TestOrderByKeyConfig(t *testing.T) {
	if _, err := outbox.New(plainDialect{postgres.Dialect()}, outbox.Config{OrderByKey: true}); !errors.Is(err, outbox.ErrUnsupported) {
		t.Errorf("OrderByKey on a dialect that cannot order: %v", err)
	}
	if _, err := outbox.New(plainDialect{postgres.Dialect()}, outbox.Config{}); err != nil {
		t.Errorf("the same dialect without OrderByKey: %v", err)
	}
	long := strings.Repeat("t", outboxdriver.MaxOrderedTableName+1)
	var ce *outbox.ConfigError
	if _, err := outbox.New(postgres.Dialect(), outbox.Config{OrderByKey: true, Table: long}); !errors.As(err, &ce) || ce.Field != "Table" {
		t.Errorf("a %d-byte table with OrderByKey: %v", len(long), err)
	}
	if _, err := outbox.New(postgres.Dialect(), outbox.Config{OrderByKey: true, Table: "s." + long[1:]}); err != nil {
		t.Errorf("a %d-byte table with OrderByKey: %v", len(long)-1, err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []outbox.RelayConfig{{DeadKeys: 7}, {DeadKeysByTopic: map[string]outbox.DeadKeyPolicy{"t": -1}}} {
		if _, err := ob.Relay(sqltx.FromDB(nil), cfg); !errors.As(err, &ce) || !strings.HasPrefix(ce.Field, "DeadKeys") {
			t.Errorf("RelayConfig %+v: %v", cfg, err)
		}
	}
	// A DB that hides its adapter's InTx (a wrapper) cannot settle runs:
	// refused when the relay is built, not when its first settle fails.
	if _, err := ob.Relay(struct{ outbox.DB }{sqltx.FromDB(nil)}, outbox.RelayConfig{Listen: outbox.ListenOff}); !errors.Is(err, outbox.ErrUnsupported) {
		t.Errorf("a relay on a DB without InTx: %v, want ErrUnsupported", err)
	}
	if _, err := ob.Relay(sqltx.FromDB(nil), outbox.RelayConfig{Listen: outbox.ListenOff}); err != nil {
		t.Errorf("a relay on sqltx.FromDB: %v", err)
	}
	for _, key := range []string{"", strings.Repeat("k", outbox.MaxKeyBytes+1), "a\x00b"} {
		var me *outbox.MessageError
		if _, _, err := ob.SkipHead(context.Background(), nil, key); !errors.As(err, &me) {
			t.Errorf("SkipHead(%q): %v, want a *MessageError before any SQL", key, err)
		}
	}
	plain, _ := outbox.New(postgres.Dialect(), outbox.Config{})
	if _, _, err := plain.SkipHead(context.Background(), nil, "k"); !errors.Is(err, outbox.ErrUnsupported) {
		t.Errorf("SkipHead without OrderByKey: %v", err)
	}
}
