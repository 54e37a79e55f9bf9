// Package sqltx adapts database/sql to oncommit.
//
// [From] wraps the caller's *sql.Tx so that [outbox.Outbox.Publish] writes the
// message inside that transaction; the message commits or rolls back with the
// business rows. From takes only a *sql.Tx, so a *sql.DB or *sql.Conn (which
// would commit the message on its own) does not compile.
//
// It works with any database/sql driver of a supported dialect: lib/pq or
// pgx's stdlib driver for PostgreSQL.
package sqltx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/oncommit/oncommit/outbox"
)

// Tx is the [outbox.Tx] around a *sql.Tx. Build it with [From].
type Tx struct {
	tx *sql.Tx
}

// From returns tx as an [outbox.Tx]. It does nothing else: tx stays the
// caller's to commit or roll back.
func From(tx *sql.Tx) Tx { return Tx{tx: tx} }

// CheckTx returns [outbox.ErrNilTx] for a nil *sql.Tx. database/sql does not
// expose whether a transaction has finished; QueryTx reports that without
// sending anything.
func (t Tx) CheckTx() error {
	if t.tx == nil {
		return outbox.ErrNilTx
	}
	return nil
}

// QueryTx runs query on the transaction. A finished transaction gives an
// error wrapping both [outbox.ErrTxDone] and [sql.ErrTxDone].
func (t Tx) QueryTx(ctx context.Context, query string, args ...any) (outbox.Rows, error) {
	if t.tx == nil {
		return nil, outbox.ErrNilTx
	}
	rows, err := t.tx.QueryContext(ctx, query, args...)
	if err != nil {
		if errors.Is(err, sql.ErrTxDone) {
			return nil, fmt.Errorf("%w: %w", outbox.ErrTxDone, err)
		}
		return nil, err
	}
	return rows, nil
}
