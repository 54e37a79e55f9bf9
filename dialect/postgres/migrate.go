package postgres

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/oncommit/oncommit/internal/migrate"
	"github.com/oncommit/oncommit/migrations"
)

// Migrate creates or upgrades the outbox table named table ("" means
// outbox.DefaultTable; "schema.name" creates the schema too) by applying the
// embedded migrations that have not run yet.
//
// Everything happens in one transaction that first takes an advisory lock
// (pg_advisory_xact_lock) keyed on the table, so replicas that start together
// apply each migration exactly once: the others wait, then find nothing to do.
// Applied versions are recorded in the table oncommit_migrations, in the
// same schema. pgx users can pass stdlib.OpenDBFromPool(pool).
func Migrate(ctx context.Context, db *sql.DB, table string) (err error) {
	t, migs, err := migrate.Prepare(migrations.Postgres(), table)
	if err != nil {
		return err
	}
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
