package postgres

import (
	"context"
	"slices"
	"strconv"

	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// inspectSQL builds the inspection statements with bind parameters $1...
var inspectSQL = &sqlbuild.Inspect{
	Now: "now()",
	Bind: func(args *[]any, v any) string {
		*args = append(*args, v)
		return "$" + strconv.Itoa(len(*args))
	},
	Topic:    func(col, p string) string { return col + " = " + p },
	Contains: func(col, p string) string { return "strpos(" + col + ", " + p + "::text) > 0" },
	Time:     func(p string) string { return "to_timestamp(" + p + "::bigint / 1000000.0)" },
	Micros:   func(col string) string { return "(extract(epoch FROM " + col + ") * 1000000)::bigint" },
	Text:     func(col string) string { return col + "::text" },
}

// listSQL returns the listing of at most limit messages of table t
// matching f, in id order, and its arguments: the statement behind
// outbox.List and outbox.Get. States are literals, so that a listing of
// dead messages matches the dead index's predicate.
func listSQL(t outboxdriver.Table, f outboxdriver.Filter, limit int, withPayload bool) (string, []any) {
	return inspectSQL.List(quoteTable(t), f, limit, withPayload)
}

// countSQL returns the count of the messages of table t matching f.
func countSQL(t outboxdriver.Table, f outboxdriver.Filter) (string, []any) {
	return inspectSQL.Count(quoteTable(t), f)
}

// List reads through the primary key in id order, or through the dead
// index (migration 0006, id WHERE state = 'dead') when f selects dead
// messages only: a page of dead messages costs a page of index entries
// whatever the number of live or delivered rows.
func (*dialect) List(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, f outboxdriver.Filter, limit int, withPayload bool) ([]outboxdriver.MessageInfo, error) {
	q, args := listSQL(t, f, limit, withPayload)
	rows, err := db.QueryDB(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return sqlbuild.ScanMessages(rows)
}

func (*dialect) Count(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, f outboxdriver.Filter) (int64, error) {
	q, args := countSQL(t, f)
	return sqlbuild.CountRows(ctx, db, q, args...)
}

// actSQL returns one batch of action a on the rows of table t matching f:
// it locks at most sqlbuild.InspectBatch of them still in a's source state
// (FOR UPDATE SKIP LOCKED: a row a relay or another operator holds is left
// for a later batch), changes those, re-checking the source state, and
// returns how many it changed. The array of ids is built once, so a batch
// never exceeds its limit whatever the plan.
//
// Ordered messages (key_seq set) that still hold their place in their
// key are left alone: a redrive changes unordered dead messages only (the
// ordered ones re-enter their keys through redriveOrderedIDsSQL), and a
// delete never deletes a pending, blocked or halted ordered message (its
// key would wait forever for it), only delivered ones and dead ones that
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
	pick := `id = ANY (ARRAY(SELECT id FROM ` + tbl + ` WHERE ` + where + ` AND ` + act +
		` ORDER BY id LIMIT ` + strconv.Itoa(sqlbuild.InspectBatch) + ` FOR UPDATE SKIP LOCKED)) AND ` + act
	if a == outboxdriver.ActDelete {
		return `WITH a AS (DELETE FROM ` + tbl + ` WHERE ` + pick + ` RETURNING 1) SELECT count(*) FROM a`, args
	}
	return `WITH a AS (UPDATE ` + tbl + ` SET ` + inspectSQL.ActSet(a, "") + ` WHERE ` + pick + ` RETURNING 1) SELECT count(*) FROM a`, args
}

func (*dialect) Act(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, a outboxdriver.Action, f outboxdriver.Filter) (int64, error) {
	q, args := actSQL(t, a, f)
	n, err := sqlbuild.Batches(ctx, sqlbuild.InspectBatch, func() (int64, error) {
		return sqlbuild.CountRows(ctx, db, q, args...)
	})
	if err != nil || a != outboxdriver.ActRedrive {
		return n, err
	}
	m, err := sqlbuild.Batches(ctx, sqlbuild.InspectBatch, func() (int64, error) {
		return redriveOrderedBatch(ctx, db, t, f)
	})
	return n + m, err
}

// deadOrderedSQL returns the first statement of a redrive batch of Act:
// the ids and keys of up to sqlbuild.InspectBatch dead ordered messages
// of table t matching f, in id order (through an index: the dead index,
// or the key index when few messages are ordered).
func deadOrderedSQL(t outboxdriver.Table, f outboxdriver.Filter) (string, []any) {
	var args []any
	tbl := quoteTable(t)
	where := inspectSQL.Where(&args, f, "", false)
	// ORDER BY the table's id, not the select list's (text: a sort).
	return `SELECT id::text, message_key FROM ` + tbl + ` WHERE ` + where +
		` AND state = 'dead' AND key_seq IS NOT NULL ORDER BY ` + tbl + `.id LIMIT ` + strconv.Itoa(sqlbuild.InspectBatch), args
}

// redriveOrderedBatch redrives up to sqlbuild.InspectBatch dead ordered
// messages matching f, in id order, as RedriveOrdered does for a topic:
// in one transaction that locks their keys (waiting for open publishes of
// those keys) and re-checks that each is still dead. It sends one SELECT
// and no transaction when no dead ordered message matches.
func redriveOrderedBatch(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, f outboxdriver.Filter) (int64, error) {
	q, args := deadOrderedSQL(t, f)
	rows, err := db.QueryDB(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	var ids, keys []string
	for rows.Next() {
		var id, key string
		if err := rows.Scan(&id, &key); err != nil {
			rows.Close()
			return 0, err
		}
		ids, keys = append(ids, id), append(keys, key)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return 0, err
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var n int64
	err = inTx(ctx, db, func(tx outboxdriver.DB) error {
		if err := exec(ctx, tx, lockKeys(t), textArray(keys)); err != nil {
			return err
		}
		n, err = sqlbuild.CountRows(ctx, tx, redriveOrderedIDsSQL(t), textArray(ids))
		return err
	})
	return n, err
}
