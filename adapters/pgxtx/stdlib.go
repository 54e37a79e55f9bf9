package pgxtx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/internal/pglisten"
	"github.com/oncommit/oncommit/outboxdriver"
)

// StdlibDB is a *sql.DB opened with pgx's stdlib driver, as an
// [outboxdriver.DB] that can also LISTEN: everything sqltx.FromDB does, plus
// the relay's wake-up listener. Build it with [FromStdlib].
type StdlibDB struct {
	*sqltx.DB
	db *sql.DB
}

// FromStdlib returns db, opened with pgx's stdlib driver (sql.Open("pgx",
// url) or stdlib.OpenDB), as a DB for the relay and the operations whose
// relay listens for notifications, on a connection it takes from db for as
// long as the relay runs.
func FromStdlib(db *sql.DB) *StdlibDB { return &StdlibDB{DB: sqltx.FromDB(db), db: db} }

// CanListen reports whether the relay can listen through db: it needs pgx's
// stdlib driver, and a pool that allows at least two open connections,
// because the listener holds one for as long as the relay runs. It
// implements [outboxdriver.Listener].
func (d *StdlibDB) CanListen() error {
	if drv, ok := d.db.Driver().(*stdlib.Driver); !ok || drv == nil {
		return fmt.Errorf("%w: pgxtx.FromStdlib needs a *sql.DB opened with pgx's stdlib driver, not the driver %T (lib/pq cannot LISTEN through database/sql)", outboxdriver.ErrUnsupported, d.db.Driver())
	}
	if n := d.db.Stats().MaxOpenConnections; n == 1 {
		return &outboxdriver.ConfigError{Field: "DB", Reason: "the *sql.DB allows 1 open connection (SetMaxOpenConns) and the relay's listener holds one for as long as it runs, leaving none for claims: allow at least 2 (plus what the application needs), or set RelayConfig.Listen to ListenOff"}
	}
	return nil
}

// ListenDB listens for notifications on a connection taken from the pool,
// which it discards afterwards (the connection was listening: it never goes
// back to the pool).
func (d *StdlibDB) ListenDB(ctx context.Context, listenSQL string, wake func(payload string)) error {
	if err := d.CanListen(); err != nil {
		return err
	}
	conn, err := d.db.Conn(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("%w: LISTEN through database/sql needs pgx's stdlib driver, not %T", outboxdriver.ErrUnsupported, dc)
		}
		return errors.Join(pglisten.Run(ctx, sc.Conn(), listenSQL, wake), driver.ErrBadConn)
	})
	if errors.Is(err, outboxdriver.ErrUnsupported) {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}
