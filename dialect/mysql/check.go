package mysql

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"
	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outbox"
)

var _ outbox.RelayDialect = (*dialect)(nil)

// errBadField is ER_BAD_FIELD_ERROR, an unknown column.
const errBadField = 1054

// Check reads no row of every column of t: error 1146 (no such table)
// becomes [outbox.ErrTableMissing], 1054 (unknown column)
// [outbox.ErrSchemaMismatch].
func (d *dialect) Check(ctx context.Context, db outbox.DB, t outbox.Table) error {
	rows, err := db.QueryDB(ctx, sqlbuild.CheckSQL(QuoteTable(t)))
	if err == nil {
		err = sqlbuild.Drain(rows)
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == errBadField {
		return fmt.Errorf("%w: %w", outbox.ErrSchemaMismatch, err)
	}
	return d.Classify(err)
}
