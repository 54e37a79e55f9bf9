// Package pgwal is the PostgreSQL WAL transport's wire: the statement that
// emits messages as transactional logical decoding messages
// (pg_logical_emit_message) in the publisher's transaction, the slot and
// publication they are read through, and a reader of the slot that
// confirms a position only when every message at or below it is settled.
// The envelope itself is package walenv's.
package pgwal

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5/pgconn"
)

// EmitSQL is the one statement that emits a publish's messages as one
// transactional logical decoding message in the caller's transaction: $1
// is the prefix, $2 the messages' envelopes back to back (package
// walenv). One WAL record per publish, whatever its number of messages.
const EmitSQL = `SELECT pg_logical_emit_message(true, $1::text, $2::bytea)`

var name = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ErrName reports a slot, publication or prefix name that is not a lower-case
// SQL identifier of at most 63 bytes.
var ErrName = errors.New("pgwal: invalid name")

// CheckNames checks a slot's and a publication's names.
func CheckNames(slot, publication string) error {
	if err := checkName("slot", slot); err != nil {
		return err
	}
	return checkName("publication", publication)
}

func checkName(what, s string) error {
	if !name.MatchString(s) {
		return fmt.Errorf("%w: %s %q (want [a-z_][a-z0-9_]*, at most 63 bytes)", ErrName, what, s)
	}
	return nil
}

// Setup creates, on an ordinary connection outside any transaction, the
// publication (with no tables: the slot carries only messages) and the
// logical replication slot (pgoutput) when they are missing. It reports
// whether it created the slot. It fails with ErrWALLevel when the server
// cannot decode logically.
func Setup(ctx context.Context, conn *pgconn.PgConn, slot, publication string) (created bool, err error) {
	if err := checkName("slot", slot); err != nil {
		return false, err
	}
	if err := checkName("publication", publication); err != nil {
		return false, err
	}
	if err := checkLevel(ctx, conn); err != nil {
		return false, err
	}
	rows, err := query(ctx, conn, "SELECT 1 FROM pg_publication WHERE pubname = '"+publication+"'")
	if err != nil {
		return false, err
	}
	if len(rows) == 0 {
		if _, err := query(ctx, conn, "CREATE PUBLICATION "+publication); err != nil {
			return false, err
		}
	}
	rows, err = query(ctx, conn, "SELECT plugin FROM pg_replication_slots WHERE slot_name = '"+slot+"'")
	if err != nil {
		return false, err
	}
	if len(rows) > 0 {
		if p := rows[0][0]; p != "pgoutput" {
			return false, fmt.Errorf("pgwal: slot %q decodes with %q, want pgoutput", slot, p)
		}
		return false, nil
	}
	_, err = query(ctx, conn, "SELECT pg_create_logical_replication_slot('"+slot+"', 'pgoutput')")
	return err == nil, err
}

// Drop removes the slot and the publication when they exist; the slot
// must not be in use.
func Drop(ctx context.Context, conn *pgconn.PgConn, slot, publication string) error {
	if err := checkName("slot", slot); err != nil {
		return err
	}
	if err := checkName("publication", publication); err != nil {
		return err
	}
	if _, err := query(ctx, conn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '"+slot+"'"); err != nil {
		return err
	}
	_, err := query(ctx, conn, "DROP PUBLICATION IF EXISTS "+publication)
	return err
}

func checkLevel(ctx context.Context, conn *pgconn.PgConn) error {
	rows, err := query(ctx, conn, "SHOW wal_level")
	if err != nil {
		return err
	}
	if len(rows) != 1 || rows[0][0] != "logical" {
		level := "?"
		if len(rows) == 1 {
			level = rows[0][0]
		}
		return fmt.Errorf("%w: the server's wal_level is %s (set wal_level = logical and restart it)", ErrWALLevel, level)
	}
	return nil
}

// query runs one statement with the simple protocol (which replication
// connections require) and returns its rows as text; NULL is "".
func query(ctx context.Context, conn *pgconn.PgConn, sql string) ([][]string, error) {
	res, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	var rows [][]string
	for _, r := range res {
		for _, row := range r.Rows {
			s := make([]string, len(row))
			for i, v := range row {
				s[i] = string(v)
			}
			rows = append(rows, s)
		}
	}
	return rows, nil
}
