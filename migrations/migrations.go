// Package migrations holds the schema of the outbox table as numbered,
// embedded SQL files, one folder per dialect (postgres/0001_init.up.sql,
// postgres/0001_init.down.sql, ...).
//
// The files name the table "outbox" and its indexes "outbox_*". They are
// plain SQL in golang-migrate's layout (NNNN_name.up.sql and
// NNNN_name.down.sql), which golang-migrate applies as they are from a copy
// of the folder. goose wants one file per version with "-- +goose Up" and
// "-- +goose Down" annotations and refuses these (duplicate version 1);
// docs/operations.md shows how to join each pair into a goose file. To
// apply them from Go, under a lock and with a custom table name, use the
// dialect's Migrate helper (postgres.Migrate, sqlite.Migrate,
// mysql.Migrate), which reads them through [Load].
package migrations

import (
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

//go:embed postgres/*.sql sqlite/*.sql mysql/*.sql postgres_inbox/*.sql sqlite_inbox/*.sql mysql_inbox/*.sql
var files embed.FS

// Postgres returns the PostgreSQL migrations: a flat fs.FS of
// NNNN_name.up.sql and NNNN_name.down.sql files.
func Postgres() fs.FS { return sub("postgres") }

// SQLite returns the SQLite migrations, laid out like [Postgres].
func SQLite() fs.FS { return sub("sqlite") }

// MySQL returns the MySQL and MariaDB migrations, laid out like
// [Postgres]. Each file is one statement (MySQL drivers run one statement
// per call unless told otherwise).
func MySQL() fs.FS { return sub("mysql") }

// PostgresInbox returns the migrations of the inbox table (the ids a
// consumer has applied, see the outbox package's Inbox) on PostgreSQL,
// laid out like [Postgres]. The files name the table "inbox" and its
// indexes "inbox_*"; read them with [LoadInbox].
func PostgresInbox() fs.FS { return sub("postgres_inbox") }

// SQLiteInbox returns the inbox migrations for SQLite, as [PostgresInbox].
func SQLiteInbox() fs.FS { return sub("sqlite_inbox") }

// MySQLInbox returns the inbox migrations for MySQL and MariaDB, as
// [PostgresInbox], one statement per file.
func MySQLInbox() fs.FS { return sub("mysql_inbox") }

func sub(dir string) fs.FS {
	f, err := fs.Sub(files, dir)
	if err != nil {
		panic(err) // dir is a constant that exists in the embedded files
	}
	return f
}

// Migration is one numbered schema change.
type Migration struct {
	Version int    // from the file name: 1 for 0001_init.up.sql
	Name    string // "init"
	Up      string // SQL
	Down    string // SQL; empty when there is no down file
}

var fileRE = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.(up|down)\.sql$`)

// identRE finds the identifiers the files use for the table and its
// indexes: outbox, outbox_claim_idx, ...; inboxRE those of the inbox files.
var (
	identRE = regexp.MustCompile(`\boutbox(_[a-z0-9_]+)?\b`)
	inboxRE = regexp.MustCompile(`\binbox(_[a-z0-9_]+)?\b`)
)

// Load reads the migrations in fsys in version order. When table is not
// "outbox", every occurrence of the table's name is replaced by table (which
// the caller has validated as lower-case identifiers, "name" or
// "schema.name"), the table of keys outbox_keys becomes table_keys (in
// table's schema), and index and constraint names outbox_x become name_x.
func Load(fsys fs.FS, table string) ([]Migration, error) {
	return load(fsys, identRE, "outbox", table)
}

// LoadInbox reads the inbox migrations in fsys ([PostgresInbox], ...) in
// version order, as [Load] does: when table is not "inbox", the table's
// name is replaced by table and index names inbox_x become name_x.
func LoadInbox(fsys fs.FS, table string) ([]Migration, error) {
	return load(fsys, inboxRE, "inbox", table)
}

func load(fsys fs.FS, re *regexp.Regexp, base, table string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("outbox: read migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	name := table[strings.LastIndexByte(table, '.')+1:]
	for _, e := range entries {
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, _ := strconv.Atoi(m[1])
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("outbox: read migration %s: %w", e.Name(), err)
		}
		text := re.ReplaceAllStringFunc(string(b), func(id string) string {
			switch id {
			case base:
				return table
			case "outbox_keys": // a table: in the outbox table's schema
				return table + "_keys"
			}
			return name + id[len(base):]
		})
		mig := byVersion[v]
		if mig == nil {
			mig = &Migration{Version: v, Name: m[2]}
			byVersion[v] = mig
		}
		if m[3] == "up" {
			mig.Up = text
		} else {
			mig.Down = text
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" {
			return nil, fmt.Errorf("outbox: migration %04d_%s has no up file", m.Version, m.Name)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}
