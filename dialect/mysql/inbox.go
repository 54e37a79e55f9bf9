package mysql

import (
	"context"
	"database/sql"
	"time"

	"github.com/oncommit/oncommit/internal/migrate"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outboxdriver"
)

// MigrateInbox creates or upgrades the inbox table named table ("" means
// outboxdriver.DefaultInboxTable, "inbox"), as [Migrate] does for the
// outbox table.
func MigrateInbox(ctx context.Context, db *sql.DB, table string) error {
	t, migs, err := migrate.PrepareInbox(migrations.MySQLInbox(), table)
	if err != nil {
		return err
	}
	return migrateTable(ctx, db, t, migs)
}

// InboxRecordSQL is, for the default table:
//
//	INSERT IGNORE INTO `inbox` (consumer, message_id) VALUES (?, ?)
//
// IGNORE turns the duplicate key of a repeat into a warning: no row
// changes. It would also turn an over-long value into a truncating
// warning, which the outbox package's length checks rule out before the
// statement is sent. A pair another open transaction has inserted makes it
// wait for that one (a shared lock on the duplicate key), then insert or
// do nothing. (ON DUPLICATE KEY UPDATE would count an unchanged row as
// changed under the driver's clientFoundRows option.)
func (*dialect) InboxRecordSQL(t outboxdriver.Table) string {
	return `INSERT IGNORE INTO ` + quoteTable(t) + ` (consumer, message_id) VALUES (?, ?)`
}

// InboxPurgeSQL deletes the oldest expired rows in received_at order.
func (*dialect) InboxPurgeSQL(t outboxdriver.Table) string {
	return `DELETE FROM ` + quoteTable(t) + ` WHERE received_at < ` + now + ` - INTERVAL ? MICROSECOND ORDER BY received_at LIMIT ?`
}

// InboxPurgeArgs gives the age in microseconds.
func (*dialect) InboxPurgeArgs(age time.Duration, limit int) []any {
	return []any{age.Microseconds(), limit}
}

func (*dialect) InboxStatsSQL(t outboxdriver.Table) string {
	return `SELECT consumer, COUNT(*), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', MIN(received_at)) FROM ` + quoteTable(t) + ` GROUP BY consumer ORDER BY consumer`
}

var _ outboxdriver.InboxDialect = (*dialect)(nil)
