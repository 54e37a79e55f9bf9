package postgres

import (
	"context"

	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

var _ outboxdriver.RelayDialect = (*dialect)(nil)

// Check reads no row of every column of t: SQLSTATE 42P01 (undefined
// table) becomes [outboxdriver.ErrTableMissing], 42703 (undefined column)
// [outboxdriver.ErrSchemaMismatch].
func (d *dialect) Check(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) error {
	rows, err := db.QueryDB(ctx, sqlbuild.CheckSQL(quoteTable(t)))
	if err == nil {
		err = sqlbuild.Drain(rows)
	}
	return d.Classify(err)
}
