package mysql_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/outbox"
)

// TestCheckSubscribers: an Outbox with subscribers refuses a table whose
// key columns migrations 0007 and 0008 did not widen; one without
// subscribers does not mind.
func TestCheckSubscribers(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil, outbox.Config{})
	subs, err := outbox.New(mysql.Dialect(), outbox.Config{Table: e.table, Subscribers: map[string][]string{"t": {"a", "b"}}})
	if err != nil {
		t.Fatal(err)
	}
	db := sqltx.FromDB(e.pool)
	if err := subs.Check(ctx, db); err != nil {
		t.Fatalf("migrated table: %v", err)
	}
	for _, alter := range []string{
		"ALTER TABLE " + e.table + "_keys MODIFY message_key VARCHAR(255) NOT NULL",
		"ALTER TABLE " + e.table + " MODIFY message_key VARCHAR(255)",
	} {
		if _, err := e.pool.Exec(alter); err != nil {
			t.Fatal(err)
		}
		err := subs.Check(ctx, db)
		if !errors.Is(err, outbox.ErrSchemaMismatch) || !strings.Contains(err.Error(), "0007 and 0008") {
			t.Fatalf("after %s: %v, want ErrSchemaMismatch naming the migrations", alter, err)
		}
		r, err := subs.Relay(db, outbox.RelayConfig{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"a", "b"} {
			if err := r.Subscribe("t", s, func(context.Context, outbox.Delivery) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Run(ctx); !errors.Is(err, outbox.ErrSchemaMismatch) {
			t.Fatalf("Run after %s: %v, want ErrSchemaMismatch", alter, err)
		}
	}
	if err := e.ob.Check(ctx, db); err != nil {
		t.Fatalf("an Outbox without subscribers on the narrow table: %v", err)
	}
}
