package postgres

import (
	"context"
	"fmt"

	"github.com/oncommit/oncommit/outboxdriver"
)

var _ outboxdriver.KeyTrimmer = (*dialect)(nil)

// trimKeysLockSQL returns the first statement of a key trim: it locks at
// most $1 rows of t's keys table with live = 0, no halted head and (in the
// statement's snapshot) no live message, skipping
// the rows an open transaction holds (a publisher's upsert, a settle, a
// redrive), and returns their keys.
func trimKeysLockSQL(t outboxdriver.Table) string {
	return `SELECT message_key FROM ` + keysTable(t) + ` AS ks WHERE live = 0 AND halted_seq IS NULL AND ` + noLiveMessage(t) + `
    LIMIT $1 FOR UPDATE OF ks SKIP LOCKED`
}

// noLiveMessage is the condition that key row ks has no message in t in a
// live state (pending, processing, blocked, dead). The lock statement
// filters with it too, so that keys kept by a dead message do not fill
// every batch's LIMIT and starve the keys behind them.
func noLiveMessage(t outboxdriver.Table) string {
	return `NOT EXISTS (SELECT 1 FROM ` + quoteTable(t) + ` o WHERE o.message_key = ks.message_key AND o.key_seq IS NOT NULL
        AND o.state IN ('pending', 'processing', 'blocked', 'dead'))`
}

// trimKeysDeleteSQL returns the second statement of a key trim: among the
// locked keys $1 (a text[]), it deletes the rows still with live = 0 and no
// halted head and without a message of the key in t in a live state
// (pending, processing, blocked, dead; the partial index on (message_key,
// key_seq) answers each probe).
//
// It runs after the lock, in the same transaction but (READ COMMITTED) on a
// snapshot taken after the locks are held: every change of a key's messages
// that matters (a publish, a settle that dead-letters, a redrive) also
// updates the key row, so it either committed before the lock, and this
// snapshot sees it, or waits for the trim to commit. One statement could
// not do this: its locking clause re-checks live on the newest row version,
// but its NOT EXISTS would read the statement's older snapshot, and a
// message published, then dead under Continue, between the two would be
// missed.
func trimKeysDeleteSQL(t outboxdriver.Table) string {
	return `DELETE FROM ` + keysTable(t) + ` AS ks WHERE ks.message_key = ANY($1::text[]) AND ks.live = 0 AND ks.halted_seq IS NULL
    AND ` + noLiveMessage(t)
}

// TrimKeys implements outboxdriver.KeyTrimmer: one transaction of the two
// statements above.
func (*dialect) TrimKeys(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, limit int) (int64, error) {
	if limit <= 0 {
		return 0, &outboxdriver.ConfigError{Field: "limit", Reason: fmt.Sprintf("key trim limit %d, want > 0", limit)}
	}
	var n int64
	err := inTx(ctx, db, func(tx outboxdriver.DB) error {
		rows, err := tx.QueryDB(ctx, trimKeysLockSQL(t), limit)
		if err != nil {
			return err
		}
		var keys []string
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return err
			}
			keys = append(keys, k)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(keys) == 0 {
			return err
		}
		rows, err = tx.QueryDB(ctx, trimKeysDeleteSQL(t)+` RETURNING 1`, textArray(keys))
		if err != nil {
			return err
		}
		for rows.Next() {
			n++
		}
		rows.Close()
		return rows.Err()
	})
	return n, err
}
