package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	_ "github.com/go-sql-driver/mysql" // the mysql driver
	_ "github.com/jackc/pgx/v5/stdlib" // the pgx driver
	_ "modernc.org/sqlite"             // the sqlite driver

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outbox"
)

// target is the database and table a command works on.
type target struct {
	kind    string // postgres, sqlite, mysql
	db      *sql.DB
	ob      *outbox.Outbox
	odb     outbox.DB
	table   outbox.Table
	dialect outbox.Dialect
}

// kindOf infers the database from the DSN: postgres:// or postgresql://
// URLs and key=value strings with host= or dbname= are PostgreSQL;
// file: URIs, sqlite: prefixes and names ending in .db, .sqlite or
// .sqlite3 are SQLite; mysql:// URLs and go-sql-driver DSNs
// (user:pass@tcp(host)/db) are MySQL/MariaDB. It returns the DSN the
// driver takes (without a sqlite: or mysql:// prefix).
func kindOf(dsn, driver string) (kind, driverDSN string, err error) {
	switch driver {
	case "postgres", "sqlite", "mysql":
		return driver, strings.TrimPrefix(strings.TrimPrefix(dsn, "mysql://"), "sqlite:"), nil
	case "":
	default:
		return "", "", usageErr("--driver %q: want postgres, sqlite or mysql", driver)
	}
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"),
		strings.Contains(dsn, "host=") || strings.Contains(dsn, "dbname="):
		return "postgres", dsn, nil
	case strings.HasPrefix(dsn, "file:"):
		return "sqlite", dsn, nil
	case strings.HasPrefix(dsn, "sqlite:"):
		return "sqlite", strings.TrimPrefix(dsn, "sqlite:"), nil
	case strings.HasPrefix(dsn, "mysql://"):
		return "mysql", strings.TrimPrefix(dsn, "mysql://"), nil
	case strings.Contains(dsn, "@tcp(") || strings.Contains(dsn, "@unix(") || strings.HasSuffix(strings.SplitN(dsn, "?", 2)[0], ")/") || strings.Contains(dsn, "@/"):
		return "mysql", dsn, nil
	}
	for _, ext := range []string{".db", ".sqlite", ".sqlite3"} {
		if strings.HasSuffix(strings.SplitN(dsn, "?", 2)[0], ext) {
			return "sqlite", dsn, nil
		}
	}
	return "", "", usageErr("cannot tell the database from the DSN (want postgres://..., file:...db, or user@tcp(host)/db); set --driver")
}

func open(ctx context.Context, g *globals) (*target, error) {
	if g.dsn == "" {
		return nil, usageErr("no DSN: pass --dsn or set OUTBOX_DSN or DATABASE_URL")
	}
	kind, dsn, err := kindOf(g.dsn, g.driver)
	if err != nil {
		return nil, err
	}
	table := g.table
	if table == "" {
		table = "outbox"
	}
	t := &target{kind: kind}
	if t.table, err = outbox.ParseTable(table); err != nil {
		return nil, usageErr("--table: %v", err)
	}
	driver := map[string]string{"postgres": "pgx", "sqlite": "sqlite", "mysql": "mysql"}[kind]
	switch kind {
	case "postgres":
		t.dialect = postgres.Dialect()
	case "sqlite":
		t.dialect = sqlite.Dialect()
		if !strings.Contains(dsn, "busy_timeout") {
			dsn += sep(dsn) + "_pragma=busy_timeout(5000)"
		}
		if !strings.Contains(dsn, "_txlock") {
			dsn += sep(dsn) + "_txlock=immediate"
		}
	case "mysql":
		t.dialect = mysql.Dialect()
	}
	if t.db, err = sql.Open(driver, dsn); err != nil {
		return nil, err
	}
	if err := t.db.PingContext(ctx); err != nil {
		t.db.Close()
		return nil, fmt.Errorf("connect to %s: %w", kind, err)
	}
	// Where the dialect orders (Capabilities().Ordered), the tool reads and
	// acts on the table as an ordered Outbox: its stats count blocked
	// messages and keys, and skip works. Such a dialect's migrations create
	// the keys table; an ordered Outbox that never publishes sends the
	// same listings and actions as a plain one.
	cfg := outbox.Config{Table: table, OrderByKey: t.dialect.Capabilities().Ordered}
	if t.ob, err = outbox.New(t.dialect, cfg); err != nil && cfg.OrderByKey {
		cfg.OrderByKey = false // a table name too long for its keys table: no skip
		t.ob, err = outbox.New(t.dialect, cfg)
	}
	if err != nil {
		t.db.Close()
		return nil, err
	}
	t.odb = sqltx.FromDB(t.db)
	return t, nil
}

func sep(dsn string) string {
	if strings.Contains(dsn, "?") {
		return "&"
	}
	return "?"
}

func (t *target) Close() error { return t.db.Close() }

// migrate applies the migrations not yet applied.
func (t *target) migrateUp(ctx context.Context) error {
	switch t.kind {
	case "postgres":
		return postgres.Migrate(ctx, t.db, t.table.String())
	case "sqlite":
		return sqlite.Migrate(ctx, t.db, t.table.String())
	default:
		return mysql.Migrate(ctx, t.db, t.table.String())
	}
}

// migrationSet returns the dialect's migrations for the table, and the
// tracking table's name and placeholder.
func (t *target) migrationSet() ([]migrations.Migration, string, string, error) {
	fsys, q, ph := migrations.Postgres(), `"`, "$1"
	switch t.kind {
	case "sqlite":
		fsys, ph = migrations.SQLite(), "?"
	case "mysql":
		fsys, q, ph = migrations.MySQL(), "`", "?"
	}
	migs, err := migrations.Load(fsys, t.table.String())
	track := q + "oncommit_migrations" + q
	if t.table.Schema != "" {
		track = q + t.table.Schema + q + "." + track
	}
	return migs, track, ph, err
}

// applied returns the versions recorded for the table (none when the
// tracking table does not exist yet).
func (t *target) applied(ctx context.Context) (map[int]bool, error) {
	_, track, ph, err := t.migrationSet()
	if err != nil {
		return nil, err
	}
	rows, err := t.db.QueryContext(ctx, "SELECT version FROM "+track+" WHERE table_name = "+ph, t.table.Name)
	if err != nil {
		if ok, _ := t.trackExists(ctx); !ok {
			return map[int]bool{}, nil
		}
		return nil, err
	}
	defer rows.Close()
	out := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out[v] = true
	}
	return out, rows.Err()
}

func (t *target) trackExists(ctx context.Context) (bool, error) {
	var q string
	switch t.kind {
	case "postgres":
		s := t.table.Schema
		if s == "" {
			s = "public"
		}
		q = "SELECT count(*) FROM information_schema.tables WHERE table_schema = '" + s + "' AND table_name = 'oncommit_migrations'"
	case "sqlite":
		q = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'oncommit_migrations'"
	default:
		q = "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'oncommit_migrations'"
	}
	var n int
	err := t.db.QueryRowContext(ctx, q).Scan(&n)
	return n > 0, err
}

// latestApplied returns the latest applied migration, and whether it is
// the first one, the one that creates the table (its down file drops the
// table); errNothing when none is applied.
func (t *target) latestApplied(ctx context.Context) (migrations.Migration, bool, error) {
	migs, _, _, err := t.migrationSet()
	if err != nil {
		return migrations.Migration{}, false, err
	}
	done, err := t.applied(ctx)
	if err != nil {
		return migrations.Migration{}, false, err
	}
	for i := len(migs) - 1; i >= 0; i-- {
		if done[migs[i].Version] {
			return migs[i], i == 0, nil
		}
	}
	return migrations.Migration{}, false, errNothing
}

// migrateDown reverts m, the latest applied migration.
func (t *target) migrateDown(ctx context.Context, m migrations.Migration) error {
	_, track, ph, err := t.migrationSet()
	if err != nil {
		return err
	}
	if m.Down == "" {
		return fmt.Errorf("migration %04d_%s has no down file", m.Version, m.Name)
	}
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, m.Down); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("migration %04d_%s down: %w", m.Version, m.Name, err)
	}
	del := "DELETE FROM " + track + " WHERE table_name = " + ph + " AND version = " + strings.Replace(ph, "1", "2", 1)
	if _, err := tx.ExecContext(ctx, del, t.table.Name, m.Version); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// undelivered counts the messages of the table not delivered yet:
// pending, blocked, processing and dead.
func (t *target) undelivered(ctx context.Context) (int64, error) {
	all, err := t.ob.Count(ctx, t.odb, outbox.Filter{})
	if err != nil {
		return 0, err
	}
	delivered, err := t.ob.Count(ctx, t.odb, outbox.Filter{States: []outbox.State{outbox.StateDelivered}})
	return all - delivered, err
}
