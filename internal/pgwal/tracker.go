package pgwal

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// tracker holds the transactions read from the slot whose messages are not
// all settled yet, in commit order, and so the position the slot may be
// confirmed to: the end of the last transaction such that it and every
// transaction before it are settled.
type tracker struct {
	mu        sync.Mutex
	txs       []trackedTx // commit order; the front is the oldest unsettled
	confirmed pglogrepl.LSN
}

type trackedTx struct {
	end  pglogrepl.LSN
	left int
	at   time.Time // commit time
}

// add records a transaction ending at end, committed at at, with n
// messages to settle; one with none is settled at once.
func (t *tracker) add(end pglogrepl.LSN, at time.Time, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.txs = append(t.txs, trackedTx{end: end, left: n, at: at})
	t.advanceLocked()
}

// settled records that one message of the transaction ending at end is
// settled. It reports false for a transaction it does not hold. Ends grow
// in commit order, so the transaction is found by binary search.
func (t *tracker) settled(end pglogrepl.LSN) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := slices.BinarySearchFunc(t.txs, end, func(tx trackedTx, end pglogrepl.LSN) int { return cmp.Compare(tx.end, end) })
	if !ok || t.txs[i].left == 0 {
		return false
	}
	t.txs[i].left--
	if i == 0 {
		t.advanceLocked()
	}
	return true
}

// idle moves the position to lsn when nothing is outstanding: the server
// has sent every transaction committed below it.
func (t *tracker) idle(lsn pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.txs) == 0 && lsn > t.confirmed {
		t.confirmed = lsn
	}
}

func (t *tracker) advanceLocked() {
	i := 0
	for ; i < len(t.txs) && t.txs[i].left == 0; i++ {
		t.confirmed = max(t.confirmed, t.txs[i].end)
	}
	t.txs = t.txs[i:]
}

// oldest is the commit time of the oldest transaction not all settled;
// zero when none is outstanding.
func (t *tracker) oldest() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.txs) == 0 {
		return time.Time{}
	}
	return t.txs[0].at
}

// position is the position the slot may be confirmed to, and the number
// of transactions still outstanding.
func (t *tracker) position() (pglogrepl.LSN, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.confirmed, len(t.txs)
}
