package postgres

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/oncommit/oncommit/internal/migrate"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outboxdriver"
)

// MigrateInbox creates or upgrades the inbox table named table ("" means
// outboxdriver.DefaultInboxTable, "inbox"), as [Migrate] does for the
// outbox table: one transaction under an advisory lock, versions recorded
// in oncommit_migrations.
func MigrateInbox(ctx context.Context, db *sql.DB, table string) error {
	t, migs, err := migrate.PrepareInbox(migrations.PostgresInbox(), table)
	if err != nil {
		return err
	}
	return migrateTable(ctx, db, t, migs)
}

// InboxRecordSQL is, for the default table:
//
//	INSERT INTO "inbox" (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING
//
// Under READ COMMITTED a conflict with a pair another transaction has
// inserted and not yet ended waits for it, then inserts (it rolled back)
// or does nothing (it committed). Under REPEATABLE READ and SERIALIZABLE,
// a conflict with a pair committed after the transaction's snapshot is a
// serialization failure (40001, classified as outbox.ErrRetryTx).
func (*dialect) InboxRecordSQL(t outboxdriver.Table) string {
	return `INSERT INTO ` + quoteTable(t) + ` (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`
}

// InboxPurgeSQL deletes the oldest expired rows by their TIDs, found with
// the received_at index.
func (*dialect) InboxPurgeSQL(t outboxdriver.Table) string {
	tbl := quoteTable(t)
	return `DELETE FROM ` + tbl + ` WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM ` + tbl + ` WHERE received_at < now() - make_interval(secs => $1::float8)
    ORDER BY received_at LIMIT $2))`
}

// InboxPurgeArgs gives the age in seconds.
func (*dialect) InboxPurgeArgs(age time.Duration, limit int) []any {
	return []any{age.Seconds(), limit}
}

func (*dialect) InboxStatsSQL(t outboxdriver.Table) string {
	return `SELECT consumer, count(*), (extract(epoch FROM min(received_at)) * 1000000)::bigint
FROM ` + quoteTable(t) + ` GROUP BY consumer ORDER BY consumer`
}

var _ outboxdriver.InboxDialect = (*dialect)(nil)

// InboxRecordLiteral is InboxRecordSQL with literals (escape strings, E'...', which
// mean the same whatever standard_conforming_strings says) and no
// ON CONFLICT: a repeat is a unique violation (23505), which rolls the
// transaction back. Sent in the round trip of BEGIN (pgxtx.Beginner), it
// spares the record a round trip of its own. Under REPEATABLE READ a
// conflict with an id committed after the snapshot is also a unique
// violation (a repeat), not the serialization failure of ON CONFLICT.
func (*dialect) InboxRecordLiteral(t outboxdriver.Table, consumer, id string) string {
	return `INSERT INTO ` + quoteTable(t) + ` (consumer, message_id) VALUES (` + escapeLiteral(consumer) + `, ` + escapeLiteral(id) + `)`
}

// escapeLiteral quotes s as an escape string constant.
func escapeLiteral(s string) string {
	return `E'` + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + `'`
}

// IsInboxRepeat reports a unique violation.
func (*dialect) IsInboxRepeat(err error) bool {
	var se sqlStater
	return errors.As(err, &se) && se.SQLState() == "23505"
}

var _ outboxdriver.InboxBeginDialect = (*dialect)(nil)
