package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/oncommit/oncommit/internal/migrate"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outbox"
)

// Migrate creates or upgrades the outbox table named table ("" means
// outbox.DefaultTable) by applying the embedded migrations that have not
// run yet, inside one BEGIN IMMEDIATE transaction: the write lock makes
// processes that start together apply each migration once. Applied versions
// are recorded in the table oncommit_migrations.
func Migrate(ctx context.Context, db *sql.DB, table string) (err error) {
	t, migs, err := migrate.Prepare(migrations.SQLite(), table)
	if err != nil {
		return err
	}
	if t.Schema != "" {
		return &outbox.ConfigError{Field: "Table", Reason: "SQLite tables cannot be schema-qualified"}
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	defer conn.Close()
	if _, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	defer func() {
		if err != nil {
			_, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	if err = migrate.Apply(ctx, conn, `"oncommit_migrations"`, t.Name, migs, "?, ?, ?"); err != nil {
		return err
	}
	if _, err = conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	return nil
}
