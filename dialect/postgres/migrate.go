package postgres

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outbox"
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
	if table == "" {
		table = outbox.DefaultTable
	}
	t, err := outbox.ParseTable(table)
	if err != nil {
		return err
	}
	migs, err := migrations.Load(migrations.Postgres(), t.String())
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
	stmts := []string{`SELECT pg_advisory_xact_lock(hashtext('oncommit.migrate'), hashtext(` + quoteLiteral(t.String()) + `))`}
	if t.Schema != "" {
		stmts = append(stmts, `CREATE SCHEMA IF NOT EXISTS "`+t.Schema+`"`)
	}
	stmts = append(stmts, `CREATE TABLE IF NOT EXISTS `+track+` (
    table_name text        NOT NULL,
    version    integer     NOT NULL,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, version))`)
	for _, s := range stmts {
		if _, err = tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
	}
	applied := map[int]bool{}
	rows, err := tx.QueryContext(ctx, `SELECT version FROM `+track+` WHERE table_name = $1`, t.Name)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	for rows.Next() {
		var v int
		if err = rows.Scan(&v); err != nil {
			rows.Close()
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		applied[v] = true
	}
	if err = rows.Err(); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	for _, m := range migs {
		if applied[m.Version] {
			continue
		}
		if _, err = tx.ExecContext(ctx, m.Up); err != nil {
			return fmt.Errorf("outbox: migrate %04d_%s: %w", m.Version, m.Name, err)
		}
		if _, err = tx.ExecContext(ctx, `INSERT INTO `+track+` (table_name, version, name) VALUES ($1, $2, $3)`, t.Name, m.Version, m.Name); err != nil {
			return fmt.Errorf("outbox: migrate %04d_%s: %w", m.Version, m.Name, err)
		}
	}
	if err = tx.Commit(); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	return nil
}
