package mysql

import (
	"context"
	"strconv"
	"strings"

	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// inspectSQL builds the inspection statements with their values as
// literals, like the relay's (see the package documentation): text as
// hexadecimal literals, ids as ASCII literals (so the primary key serves
// them), integers in decimal; nothing is bound.
var inspectSQL = &sqlbuild.Inspect{
	Now: now,
	Bind: func(_ *[]any, v any) string {
		var b strings.Builder
		switch v := v.(type) {
		case string:
			text(&b, v)
		case int64:
			b.WriteString(strconv.FormatInt(v, 10))
		}
		return b.String()
	},
	BindID:   func(_ *[]any, id string) string { return "_ascii'" + id + "' COLLATE ascii_bin" },
	Topic:    func(col, p string) string { return "CAST(" + col + " AS BINARY) = CAST(" + p + " AS BINARY)" },
	Contains: func(col, p string) string { return "INSTR(CAST(" + col + " AS BINARY), CAST(" + p + " AS BINARY)) > 0" },
	Time:     func(p string) string { return "(TIMESTAMP'1970-01-01 00:00:00' + INTERVAL " + p + " MICROSECOND)" },
	Micros: func(col string) string {
		return "TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', " + col + ")"
	},
	Text: func(col string) string { return col },
}

// List reads in primary key order. MySQL and MariaDB have no partial
// index: a listing of dead messages reads the primary key in order up to
// the page's last dead row (docs/operations.md).
func (d *dialect) List(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, f outboxdriver.Filter, limit int, withPayload bool) ([]outboxdriver.MessageInfo, error) {
	q, _ := inspectSQL.List(quoteTable(t), f, limit, withPayload)
	rows, err := db.QueryDB(ctx, q)
	if err != nil {
		return nil, err
	}
	return sqlbuild.ScanMessages(rows)
}

func (d *dialect) Count(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, f outboxdriver.Filter) (int64, error) {
	q, _ := inspectSQL.Count(quoteTable(t), f)
	return sqlbuild.CountRows(ctx, db, q)
}

// actSQL returns action a on the rows of table t matching f, as Redrive
// and Purge run: find lists up to opBatch ids still in a's source state (a
// plain read, no locks), write changes those of ids that still match and
// are still in that state, by primary key (see [keys]), in a short
// transaction of its own.
//
// Ordered messages (key_seq set) that still hold their place in their key
// are left alone: a redrive changes unordered dead messages only (Act
// redrives the ordered ones through their keys, as RedriveOrdered does),
// and a delete never deletes a pending, blocked or halted ordered message
// (its key would wait forever for it), only delivered ones and dead ones
// that no longer halt their key (settled: dead under ContinueKey, or
// skipped).
func actSQL(t outboxdriver.Table, a outboxdriver.Action, f outboxdriver.Filter) (find string, write func(ids []outboxdriver.ID) string) {
	where := inspectSQL.Where(nil, f, "", false)
	guard := func(prefix string) string {
		switch a {
		case outboxdriver.ActRedrive:
			return " AND " + prefix + "key_seq IS NULL"
		case outboxdriver.ActDelete:
			return " AND (" + prefix + "key_seq IS NULL OR " + prefix + "settled_at IS NOT NULL)"
		}
		return ""
	}
	find = "SELECT id FROM " + quoteTable(t) + " WHERE " + where + " AND " + inspectSQL.ActWhere(a, "") + guard("") +
		" ORDER BY id LIMIT " + strconv.Itoa(opBatch)
	cond := inspectSQL.Where(nil, f, "o.", false) + " AND " + inspectSQL.ActWhere(a, "o.") + guard("o.")
	return find, func(ids []outboxdriver.ID) string {
		var b strings.Builder
		if a == outboxdriver.ActDelete {
			b.WriteString("DELETE o FROM ")
			keys(&b, t, ids)
		} else {
			b.WriteString("UPDATE ")
			keys(&b, t, ids)
			b.WriteString(" SET " + inspectSQL.ActSet(a, "o."))
		}
		b.WriteString(" WHERE " + cond)
		return b.String()
	}
}

func (d *dialect) Act(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, a outboxdriver.Action, f outboxdriver.Filter) (int64, error) {
	find, write := actSQL(t, a, f)
	n, err := d.batched(ctx, db, a.String(), find, write)
	if err != nil || a != outboxdriver.ActRedrive {
		return n, err
	}
	m, err := d.redriveOrderedBatches(ctx, db, t, deadOrderedSQL(t, inspectSQL.Where(nil, f, "", false)))
	return n + m, err
}
