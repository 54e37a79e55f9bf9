package sqlite

import (
	"context"
	"fmt"

	"github.com/oncommit/oncommit/outboxdriver"
)

var _ outboxdriver.KeyTrimmer = (*dialect)(nil)

// trimKeysSQL returns the key trim of t: it deletes at most ?1 rows of t's
// keys table with live = 0, no halted head and no message of the key in t
// in a live state (pending, processing, blocked, dead; each probe is one
// range of the (message_key, state, key_seq) index), and returns one row
// per key deleted. SQLite has one writer: the statement runs while no
// other transaction writes (an open publisher of a key makes it wait, and
// it then sees the publisher's rows), so the conditions it reads hold
// until it commits.
func trimKeysSQL(t outboxdriver.Table) string {
	keys := keysTable(t)
	return `DELETE FROM ` + keys + ` WHERE message_key IN (
    SELECT ks.message_key FROM ` + keys + ` ks WHERE ks.live = 0 AND ks.halted_seq IS NULL
    AND NOT EXISTS (SELECT 1 FROM ` + quoteTable(t) + ` o WHERE o.message_key = ks.message_key AND o.key_seq IS NOT NULL
        AND o.state IN ('pending', 'processing', 'blocked', 'dead'))
    LIMIT ?1) RETURNING 1`
}

// TrimKeys implements outboxdriver.KeyTrimmer with trimKeysSQL, in a
// transaction retried while SQLite is busy.
func (*dialect) TrimKeys(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, limit int) (int64, error) {
	if limit <= 0 {
		return 0, &outboxdriver.ConfigError{Field: "limit", Reason: fmt.Sprintf("key trim limit %d, want > 0", limit)}
	}
	var n int64
	err := inTx(ctx, db, func(tx outboxdriver.DB) error {
		n = 0
		return scanEach(ctx, tx, trimKeysSQL(t), []any{limit}, func(scanner) error { n++; return nil })
	})
	return n, err
}
