package mysql_test

import (
	"context"
	"errors"
	"testing"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/mysql/internal/mysqltest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// TestCheckOrderedNeedsMigrations: CheckOrdered (a relay's start-up check
// with OrderByKey) passes on a migrated table and reports
// ErrSchemaMismatch without the keys table of 0006 or the column of 0005.
func TestCheckOrderedNeedsMigrations(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	od := mysql.Dialect().(outboxdriver.OrderedDialect)
	ctx := context.Background()
	tbl, err := outboxdriver.ParseTable(e.table)
	if err != nil {
		t.Fatal(err)
	}
	db := sqltx.FromDB(e.pool)
	if err := od.CheckOrdered(ctx, db, tbl); err != nil {
		t.Fatalf("migrated table: %v", err)
	}
	admin := mysqltest.Admin(t)
	if _, err := admin.Exec("DROP TABLE " + e.table + "_keys"); err != nil {
		t.Fatal(err)
	}
	if err := od.CheckOrdered(ctx, db, tbl); !errors.Is(err, outboxdriver.ErrSchemaMismatch) {
		t.Errorf("without the keys table: %v, want ErrSchemaMismatch", err)
	}
	if _, err := admin.Exec("ALTER TABLE " + e.table + " DROP KEY outbox_key_seq_idx, DROP COLUMN key_seq"); err != nil {
		t.Fatal(err)
	}
	if err := od.CheckOrdered(ctx, db, tbl); !errors.Is(err, outboxdriver.ErrSchemaMismatch) {
		t.Errorf("without key_seq: %v, want ErrSchemaMismatch", err)
	}
}
