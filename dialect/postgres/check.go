package postgres

import (
	"context"

	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outbox"
)

var _ outbox.RelayDialect = (*dialect)(nil)

// Check reads no row of every column of t: SQLSTATE 42P01 (undefined
// table) becomes [outbox.ErrTableMissing], 42703 (undefined column)
// [outbox.ErrSchemaMismatch].
func (d *dialect) Check(ctx context.Context, db outbox.DB, t outbox.Table) error {
	rows, err := db.QueryDB(ctx, sqlbuild.CheckSQL(QuoteTable(t)))
	if err == nil {
		err = sqlbuild.Drain(rows)
	}
	return d.Classify(err)
}
