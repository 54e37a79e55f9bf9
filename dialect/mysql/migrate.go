package mysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/oncommit/oncommit/internal/migrate"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outboxdriver"
)

// MigrateLockTimeout is how long Migrate waits for another process's
// migration of the same table to finish.
const MigrateLockTimeout = 60 * time.Second

// Migrate creates or upgrades the outbox table named table ("" means
// outbox.DefaultTable; "db.name" puts it in database db, which must exist)
// by applying the embedded migrations that have not run yet.
//
// MySQL commits each DDL statement on its own, so no transaction can hold a
// migration together: instead Migrate takes a named lock (GET_LOCK) keyed on
// the table, on one connection, for the whole run. Replicas that start
// together apply each migration exactly once: the others wait, then find
// nothing to do. Applied versions are recorded in the table
// oncommit_migrations of the same database. A migration that fails half way
// is not rolled back (MySQL cannot roll back DDL); its version is not
// recorded.
func Migrate(ctx context.Context, db *sql.DB, table string) error {
	t, migs, err := migrate.Prepare(migrations.MySQL(), table)
	if err != nil {
		return err
	}
	return migrateTable(ctx, db, t, migs)
}

// migrateTable applies migs to t on one connection holding a named lock
// keyed on the table (see Migrate).
func migrateTable(ctx context.Context, db *sql.DB, t outboxdriver.Table, migs []migrations.Migration) (err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	defer conn.Close()
	// GET_LOCK names are at most 64 characters: hash the table's name.
	sum := sha256.Sum256([]byte(t.String()))
	lock := "oncommit.migrate." + hex.EncodeToString(sum[:16])
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, ?)`, lock, int(MigrateLockTimeout.Seconds())).Scan(&got); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("outbox: migrate: another migration of %s held the lock for %v", t, MigrateLockTimeout)
	}
	defer func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(?)`, lock)
	}()
	track := "`oncommit_migrations`"
	if t.Schema != "" {
		track = "`" + t.Schema + "`." + track
	}
	return migrate.ApplyTracked(ctx, conn, `CREATE TABLE IF NOT EXISTS `+track+` (
    table_name VARCHAR(255) CHARACTER SET ascii NOT NULL,
    version    INT          NOT NULL,
    name       VARCHAR(255) NOT NULL,
    PRIMARY KEY (table_name, version)) ENGINE = InnoDB DEFAULT CHARACTER SET utf8mb4`, track, t.Name, migs, "?, ?, ?")
}
