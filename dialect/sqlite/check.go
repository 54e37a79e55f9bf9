package sqlite

import (
	"context"
	"fmt"

	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

var _ outboxdriver.RelayDialect = (*dialect)(nil)

// Check looks t up in the schema's sqlite_master ([outboxdriver.ErrTableMissing]
// when it is not there), then reads no row of every column of it
// ([outboxdriver.ErrSchemaMismatch] when that fails). SQLite reports both
// conditions with the same generic error code, so the lookup, not the
// error, tells them apart.
func (d *dialect) Check(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) error {
	master := "sqlite_master"
	if t.Schema != "" {
		master = `"` + t.Schema + `".sqlite_master`
	}
	n, err := count(ctx, db, `SELECT 1 FROM `+master+` WHERE type = 'table' AND name = ?`, t.Name)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: no table %s", outboxdriver.ErrTableMissing, t)
	}
	rows, err := db.QueryDB(ctx, sqlbuild.CheckSQL(quoteTable(t)))
	if err == nil {
		err = sqlbuild.Drain(rows)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", outboxdriver.ErrSchemaMismatch, err)
	}
	return nil
}
