package sqlite

import (
	"context"
	"strconv"

	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// inspectSQL builds the inspection statements with bind parameters ?1...
// Times are integer milliseconds in the table.
var inspectSQL = &sqlbuild.Inspect{
	Now: now,
	Bind: func(args *[]any, v any) string {
		*args = append(*args, v)
		return "?" + strconv.Itoa(len(*args))
	},
	Topic:    func(col, p string) string { return col + " = " + p },
	Contains: func(col, p string) string { return "instr(" + col + ", " + p + ") > 0" },
	Time:     func(p string) string { return "(" + p + " / 1000)" },
	Micros:   func(col string) string { return col + " * 1000" },
	Text:     func(col string) string { return col },
}

// List reads through the primary key's order (id is the text primary key)
// or the dead index (migration 0005) when f selects dead messages only.
func (d *dialect) List(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, f outboxdriver.Filter, limit int, withPayload bool) ([]outboxdriver.MessageInfo, error) {
	q, args := inspectSQL.List(quoteTable(t), f, limit, withPayload)
	rows, err := relayDB(db).QueryDB(ctx, q, args...)
	if err != nil {
		return nil, d.Classify(err)
	}
	ms, err := sqlbuild.ScanMessages(rows)
	return ms, d.Classify(err)
}

func (d *dialect) Count(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, f outboxdriver.Filter) (int64, error) {
	q, args := inspectSQL.Count(quoteTable(t), f)
	n, err := sqlbuild.CountRows(ctx, relayDB(db), q, args...)
	return n, d.Classify(err)
}

// actSQL returns one batch of action a on the rows of table t matching f:
// at most sqlbuild.InspectBatch rows still in a's source state, changed in
// one statement (SQLite has one writer: the batch holds the write lock only
// for its own rows, and publishers take their turn between batches), one
// row returned per row changed.
//
// Ordered messages (key_seq set) that still hold their place in their key
// are left alone: a redrive changes unordered dead messages only (the
// ordered ones re-enter their keys through a batch of redriveOrdered), and
// a delete never deletes a pending, blocked or halted ordered message (its
// key would wait for ever for it), only delivered ones and dead ones that
// no longer halt their key (settled: dead under ContinueKey, or skipped).
func actSQL(t outboxdriver.Table, a outboxdriver.Action, f outboxdriver.Filter) (string, []any) {
	tbl := quoteTable(t)
	var args []any
	where := inspectSQL.Where(&args, f, "", false)
	act := inspectSQL.ActWhere(a, "")
	switch a {
	case outboxdriver.ActRedrive:
		act += " AND key_seq IS NULL"
	case outboxdriver.ActDelete:
		act += " AND (key_seq IS NULL OR settled_at IS NOT NULL)"
	}
	pick := `rowid IN (SELECT rowid FROM ` + tbl + ` WHERE ` + where + ` AND ` + act +
		` ORDER BY id LIMIT ` + strconv.Itoa(sqlbuild.InspectBatch) + `) AND ` + act
	if a == outboxdriver.ActDelete {
		return `DELETE FROM ` + tbl + ` WHERE ` + pick + ` RETURNING 1`, args
	}
	return `UPDATE ` + tbl + ` SET ` + inspectSQL.ActSet(a, "") + ` WHERE ` + pick + ` RETURNING 1`, args
}

func (d *dialect) Act(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, a outboxdriver.Action, f outboxdriver.Filter) (int64, error) {
	q, args := actSQL(t, a, f)
	rdb := relayDB(db)
	n, err := sqlbuild.Batches(ctx, sqlbuild.InspectBatch, func() (int64, error) {
		return count(ctx, rdb, q, args...)
	})
	if err != nil || a != outboxdriver.ActRedrive {
		return n, d.Classify(err)
	}
	// The dead ordered messages matching f, a batch per transaction, each
	// re-entering its key at its place. A read first: without one, no
	// transaction (and no write lock) at all.
	var oargs []any
	dead := ` FROM ` + quoteTable(t) + ` WHERE ` + inspectSQL.Where(&oargs, f, "", false) + ` AND state = 'dead' AND key_seq IS NOT NULL`
	oq := redriveOrderedSQL(t, `rowid IN (SELECT rowid`+dead+` ORDER BY id LIMIT `+strconv.Itoa(sqlbuild.InspectBatch)+`)`)
	found, err := count(ctx, rdb, `SELECT 1`+dead+` LIMIT 1`, oargs...)
	if err != nil || found == 0 {
		return n, d.Classify(err)
	}
	m, err := sqlbuild.Batches(ctx, sqlbuild.InspectBatch, func() (m int64, err error) {
		err = inTx(ctx, db, func(tx outboxdriver.DB) error {
			m, err = redriveOrdered(ctx, tx, t, oq, oargs...)
			return err
		})
		return m, err
	})
	return n + m, d.Classify(err)
}
