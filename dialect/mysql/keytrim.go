package mysql

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/oncommit/oncommit/outboxdriver"
)

var _ outboxdriver.KeyTrimmer = (*dialect)(nil)

// trimCandidatesSQL returns the key trim's first read, outside its
// transaction: a plain read (no locks, so no gap locks for publishers of
// new keys to wait on) of at most limit keys of t's keys table with
// live = 0, no halted head and no live message (so that keys kept by a
// dead message do not fill every batch and starve the keys behind them).
func trimCandidatesSQL(t outboxdriver.Table, limit int) string {
	return "SELECT ks.message_key FROM " + keysTable(t) + " AS ks WHERE ks.live = 0 AND ks.halted_seq IS NULL AND NOT EXISTS (SELECT 1 FROM " +
		quoteTable(t) + " AS o" + keyIndex(t) + " WHERE o.message_key = ks.message_key AND o.key_seq > 0" +
		" AND o.state IN ('pending', 'processing', 'blocked', 'dead')) LIMIT " + strconv.Itoa(limit)
}

// trimLockSQL returns the key trim's first statement in its transaction:
// it locks the key rows of keys by primary key, skipping those an open
// transaction holds (a publisher's upsert, a settle, a redrive), and
// returns the ones still with live = 0 and no halted head (a locking read
// sees the newest committed row).
func trimLockSQL(t outboxdriver.Table, keys []string) string {
	return keysIn("SELECT message_key FROM "+keysTable(t), keys, " AND live = 0 AND halted_seq IS NULL FOR UPDATE SKIP LOCKED")
}

// trimLiveSQL returns the keys among keys that still have a message in t in
// a live state (pending, processing, blocked, dead), one probe of the key
// index each. It is the transaction's first consistent read, so its
// snapshot is taken after trimLockSQL holds the key rows: every change of
// a key's messages that matters (a publish, a settle that dead-letters, a
// redrive) updates the key row too, so it committed before the lock, and
// this read sees it, or it waits for the trim to commit.
func trimLiveSQL(t outboxdriver.Table, keys []string) string {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString("\nUNION ALL ")
		}
		b.WriteString("(SELECT o.message_key FROM " + quoteTable(t) + " AS o" + keyIndex(t) + " WHERE o.message_key = ")
		text(&b, k)
		b.WriteString(" AND o.key_seq > 0 AND o.state IN ('pending', 'processing', 'blocked', 'dead') LIMIT 1)")
	}
	return b.String()
}

// trimDeleteSQL returns the deletion of the locked key rows of keys.
func trimDeleteSQL(t outboxdriver.Table, keys []string) string {
	return keysIn("DELETE FROM "+keysTable(t), keys, "")
}

// keysIn returns head, a WHERE message_key IN keys, then tail.
func keysIn(head string, keys []string, tail string) string {
	var b strings.Builder
	b.WriteString(head + " WHERE message_key IN (")
	keyList(&b, keys)
	b.WriteString(")" + tail)
	return b.String()
}

// TrimKeys implements outboxdriver.KeyTrimmer: trimCandidatesSQL, then in
// one transaction trimLockSQL, trimLiveSQL and trimDeleteSQL of the locked
// keys without a live message.
func (d *dialect) TrimKeys(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table, limit int) (int64, error) {
	if limit <= 0 {
		return 0, &outboxdriver.ConfigError{Field: "limit", Reason: fmt.Sprintf("key trim limit %d, want > 0", limit)}
	}
	var cands []string
	if err := scanStrings(ctx, db, trimCandidatesSQL(t, limit), func(s ...string) { cands = append(cands, s[0]) }, 1); err != nil || len(cands) == 0 {
		return 0, err
	}
	var n int64
	err := d.inTx(ctx, db, "trim keys", func(tx outboxdriver.DB) error {
		n = 0
		var locked []string
		if err := scanStrings(ctx, tx, trimLockSQL(t, cands), func(s ...string) { locked = append(locked, s[0]) }, 1); err != nil || len(locked) == 0 {
			return err
		}
		live := map[string]bool{}
		if err := scanStrings(ctx, tx, trimLiveSQL(t, locked), func(s ...string) { live[normKey(s[0])] = true }, 1); err != nil {
			return err
		}
		var gone []string
		for _, k := range locked {
			if !live[normKey(k)] {
				gone = append(gone, k)
			}
		}
		if len(gone) == 0 {
			return nil
		}
		if err := exec(ctx, tx, trimDeleteSQL(t, gone)); err != nil {
			return err
		}
		n = int64(len(gone))
		return nil
	})
	return n, err
}
