package postgres

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/oncommit/oncommit/internal/migrate"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outboxdriver"
)

// Migrate creates or upgrades the outbox table named table ("" means
// outboxdriver.DefaultTable; "schema.name" creates the schema too) by applying the
// embedded migrations that have not run yet.
//
// Everything happens in one transaction that first takes an advisory lock
// (pg_advisory_xact_lock) keyed on the table, so replicas that start together
// apply each migration exactly once: the others wait, then find nothing to do.
// Applied versions are recorded in the table oncommit_migrations, in the
// same schema. pgx users can pass stdlib.OpenDBFromPool(pool).
func Migrate(ctx context.Context, db *sql.DB, table string) error {
	t, migs, err := migrate.Prepare(migrations.Postgres(), table)
	if err != nil {
		return err
	}
	return migrateTable(ctx, db, t, migs)
}

// migrateTable applies migs to t in one transaction under an advisory
// lock keyed on the table (see Migrate).
func migrateTable(ctx context.Context, db *sql.DB, t outboxdriver.Table, migs []migrations.Migration) (err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	track := `"oncommit_migrations"`
	if t.Schema != "" {
		track = `"` + t.Schema + `".` + track
	}
	if _, err = tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('oncommit.migrate'), hashtext(`+quoteLiteral(t.String())+`))`); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	if t.Schema != "" {
		if _, err = tx.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS "`+t.Schema+`"`); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
	}
	if err = migrate.Apply(ctx, tx, track, t.Name, migs, "$1, $2, $3"); err != nil {
		return err
	}
	if err = tx.Commit(); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	return nil
}

// TopicIndexSQL returns the statement that builds the topic claim index of
// table ("" for the default, as in Migrate) without blocking writes:
//
//	CREATE INDEX CONCURRENTLY IF NOT EXISTS "outbox_topic_claim_idx"
//	    ON "outbox" (topic, available_at, id) WHERE state IN ('pending', 'processing')
//
// Since migration 0004 this is the claim index: a claim reads only its
// relay's topics' due rows, never those of other topics ahead of them
// (docs/operations.md, "Topic skew"). Migrate creates it with a plain
// CREATE INDEX, inside its transaction, so publishes wait while it builds,
// and then drops the former claim index (available_at, id). On a table
// too large or busy for that, run this statement first: the migration then
// finds the index (IF NOT EXISTS) and only drops the former one. On a
// table already migrated it creates nothing.
//
// CONCURRENTLY cannot run inside a transaction: run the statement on its
// own (db.ExecContext). A concurrent build that fails or is cancelled
// leaves an invalid index, which IF NOT EXISTS (here and in the migration)
// then keeps: it costs every write and serves no claim. Check
// pg_index.indisvalid, and DROP INDEX CONCURRENTLY it before running the
// statement, or the migration, again.
//
// A bad or too long table name (the index's name must fit PostgreSQL's 63
// bytes) is a *outboxdriver.ConfigError.
func TopicIndexSQL(table string) (string, error) {
	if table == "" {
		table = outboxdriver.DefaultTable
	}
	t, err := outboxdriver.ParseTable(table)
	if err != nil {
		return "", err
	}
	const suffix = "_topic_claim_idx"
	if len(t.Name)+len(suffix) > 63 {
		// PostgreSQL would cut the index's name to 63 bytes, and at 63 the
		// cut name is the table's own: IF NOT EXISTS would create nothing.
		return "", &outboxdriver.ConfigError{Field: "Table", Reason: fmt.Sprintf("%q: the index name %q would pass PostgreSQL's 63 bytes", table, t.Name+suffix)}
	}
	// An index is created in its table's schema: its name is not qualified.
	return `CREATE INDEX CONCURRENTLY IF NOT EXISTS "` + t.Name + suffix + `" ON ` + quoteTable(t) +
		` (topic, available_at, id) WHERE state IN ('pending', 'processing')`, nil
}
