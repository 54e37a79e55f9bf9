package sqlite

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
	t, migs, err := migrate.PrepareInbox(migrations.SQLiteInbox(), table)
	if err != nil {
		return err
	}
	return migrateTable(ctx, db, t, migs)
}

// InboxRecordSQL is, for the default table:
//
//	INSERT INTO "inbox" (consumer, message_id) VALUES (?, ?) ON CONFLICT DO NOTHING
//
// SQLite has one writer at a time: a second transaction that writes waits
// for the first to end (up to the busy timeout), so two transactions never
// hold the same new pair.
func (*dialect) InboxRecordSQL(t outboxdriver.Table) string {
	return `INSERT INTO ` + quoteTable(t) + ` (consumer, message_id) VALUES (?, ?) ON CONFLICT DO NOTHING`
}

// InboxPurgeSQL deletes the oldest expired rows by their key, found with
// the received_at index.
func (*dialect) InboxPurgeSQL(t outboxdriver.Table) string {
	tbl := quoteTable(t)
	return `DELETE FROM ` + tbl + ` WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM ` + tbl + ` WHERE received_at < ` + now + ` - ?
    ORDER BY received_at LIMIT ?)`
}

// InboxPurgeArgs gives the age in milliseconds.
func (*dialect) InboxPurgeArgs(age time.Duration, limit int) []any {
	return []any{age.Milliseconds(), limit}
}

func (*dialect) InboxStatsSQL(t outboxdriver.Table) string {
	return `SELECT consumer, count(*), min(received_at) * 1000 FROM ` + quoteTable(t) + ` GROUP BY consumer ORDER BY consumer`
}

var _ outboxdriver.InboxDialect = (*dialect)(nil)
