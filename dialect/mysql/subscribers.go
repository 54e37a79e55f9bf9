package mysql

import (
	"context"
	"fmt"

	"github.com/oncommit/oncommit/outboxdriver"
)

var _ outboxdriver.SubscriberChecker = (*dialect)(nil)

// subscriberKeyWidth is the message_key width (characters) that
// migrations 0007 and 0008 give the outbox and keys tables: a subscriber
// (64 bytes), the separator and a key (255).
const subscriberKeyWidth = 320

// CheckSubscribers returns an error wrapping
// [outboxdriver.ErrSchemaMismatch] when t's message_key column, or its
// keys table's, is narrower than a subscriber's copy needs (migrations
// 0007 and 0008 not applied): a long key would fail the publish, or be
// cut short in a server without a strict sql_mode.
func (d *dialect) CheckSubscribers(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) error {
	schema, args := "DATABASE()", []any{}
	if t.Schema != "" {
		schema, args = "?", append(args, t.Schema)
	}
	args = append(args, t.Name, outboxdriver.KeysTable(t).Name)
	rows, err := db.QueryDB(ctx, "SELECT TABLE_NAME, CHARACTER_MAXIMUM_LENGTH FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "+schema+
		" AND TABLE_NAME IN (?, ?) AND COLUMN_NAME = 'message_key'", args...)
	if err != nil {
		return d.Classify(err)
	}
	defer rows.Close()
	for rows.Next() {
		var table string
		var width int64
		if err := rows.Scan(&table, &width); err != nil {
			return d.Classify(err)
		}
		if width < subscriberKeyWidth {
			return fmt.Errorf("%w: %s.message_key holds %d characters, and a subscriber's copy needs %d: apply migrations 0007 and 0008 (Config.Subscribers)",
				outboxdriver.ErrSchemaMismatch, table, width, subscriberKeyWidth)
		}
	}
	return d.Classify(rows.Err())
}
