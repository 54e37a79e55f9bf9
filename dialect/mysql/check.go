package mysql

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"
	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

var _ outboxdriver.RelayDialect = (*dialect)(nil)

// errBadField is ER_BAD_FIELD_ERROR, an unknown column.
const errBadField = 1054

// Check reads no row of every column of t: error 1146 (no such table)
// becomes [outboxdriver.ErrTableMissing], 1054 (unknown column)
// [outboxdriver.ErrSchemaMismatch].
func (d *dialect) Check(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) error {
	rows, err := db.QueryDB(ctx, sqlbuild.CheckSQL(quoteTable(t)))
	if err == nil {
		err = sqlbuild.Drain(rows)
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == errBadField {
		return fmt.Errorf("%w: %w", outboxdriver.ErrSchemaMismatch, err)
	}
	return d.Classify(err)
}
