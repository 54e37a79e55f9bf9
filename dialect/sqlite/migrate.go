package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/oncommit/oncommit/internal/backoff"
	"github.com/oncommit/oncommit/internal/migrate"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outboxdriver"
)

// Migrate creates or upgrades the outbox table named table ("" means
// outboxdriver.DefaultTable) by applying the embedded migrations that have not
// run yet, inside one BEGIN IMMEDIATE transaction: the write lock makes
// processes that start together apply each migration once. Applied versions
// are recorded in the table oncommit_migrations.
//
// SQLite may answer SQLITE_BUSY at once, without waiting out the busy
// timeout, where waiting could deadlock: connections that open a new file
// together and all switch it to WAL, for one. Migrate then starts over,
// after a short pause, for up to a minute (or until ctx ends).
func Migrate(ctx context.Context, db *sql.DB, table string) error {
	t, migs, err := migrate.Prepare(migrations.SQLite(), table)
	if err != nil {
		return err
	}
	return migrateTable(ctx, db, t, migs)
}

// migrateTable applies migs to t under BEGIN IMMEDIATE, starting over
// while SQLite answers busy (see Migrate).
func migrateTable(ctx context.Context, db *sql.DB, t outboxdriver.Table, migs []migrations.Migration) (err error) {
	if t.Schema != "" {
		return &outboxdriver.ConfigError{Field: "Table", Reason: "SQLite tables cannot be schema-qualified"}
	}
	deadline := time.Now().Add(time.Minute)
	for attempt := 1; ; attempt++ {
		err = migrateOnce(ctx, db, t, migs)
		if err == nil || !busy(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff.Policy{Base: 5 * time.Millisecond, Cap: 200 * time.Millisecond, Jitter: 1}.Delay(attempt)):
		}
	}
}

func migrateOnce(ctx context.Context, db *sql.DB, t outboxdriver.Table, migs []migrations.Migration) (err error) {
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
