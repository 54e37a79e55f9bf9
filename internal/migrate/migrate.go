// Package migrate applies the embedded migrations of one dialect and records
// them, inside a transaction or exclusive lock that the dialect's Migrate
// helper has already taken.
package migrate

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"strings"

	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outboxdriver"
)

// Prepare validates table ("" means outboxdriver.DefaultTable) and loads the
// migrations in fsys for it.
func Prepare(fsys fs.FS, table string) (outboxdriver.Table, []migrations.Migration, error) {
	if table == "" {
		table = outboxdriver.DefaultTable
	}
	t, err := outboxdriver.ParseTable(table)
	if err != nil {
		return outboxdriver.Table{}, nil, err
	}
	migs, err := migrations.Load(fsys, t.String())
	return t, migs, err
}

// PrepareInbox validates table ("" means outboxdriver.DefaultInboxTable)
// and loads the inbox migrations in fsys for it.
func PrepareInbox(fsys fs.FS, table string) (outboxdriver.Table, []migrations.Migration, error) {
	if table == "" {
		table = outboxdriver.DefaultInboxTable
	}
	t, err := outboxdriver.ParseTable(table)
	if err != nil {
		return outboxdriver.Table{}, nil, err
	}
	migs, err := migrations.LoadInbox(fsys, t.String())
	return t, migs, err
}

// Execer is a *sql.Tx, or a *sql.Conn inside a transaction or holding a
// lock.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Apply creates the tracking table track if needed, then applies the
// migrations not yet recorded there for tableName, in version order.
// params is "$1, $2, $3" or "?, ?, ?": the dialect's three placeholders.
func Apply(ctx context.Context, ex Execer, track, tableName string, migs []migrations.Migration, params string) error {
	return ApplyTracked(ctx, ex, `CREATE TABLE IF NOT EXISTS `+track+` (
    table_name text    NOT NULL,
    version    integer NOT NULL,
    name       text    NOT NULL,
    PRIMARY KEY (table_name, version))`, track, tableName, migs, params)
}

// ApplyTracked is Apply with the dialect's own statement creating the
// tracking table (MySQL cannot index a text column without a length).
func ApplyTracked(ctx context.Context, ex Execer, createTrack, track, tableName string, migs []migrations.Migration, params string) error {
	if _, err := ex.ExecContext(ctx, createTrack); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	first := strings.Split(params, ", ")[0]
	rows, err := ex.QueryContext(ctx, `SELECT version FROM `+track+` WHERE table_name = `+first, tableName)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	applied := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		applied[v] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	for _, m := range migs {
		if applied[m.Version] {
			continue
		}
		if _, err := ex.ExecContext(ctx, m.Up); err != nil {
			return fmt.Errorf("outbox: migrate %04d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := ex.ExecContext(ctx, `INSERT INTO `+track+` (table_name, version, name) VALUES (`+params+`)`, tableName, m.Version, m.Name); err != nil {
			return fmt.Errorf("outbox: migrate %04d_%s: %w", m.Version, m.Name, err)
		}
	}
	return nil
}
