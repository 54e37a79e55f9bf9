package mysql_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/mysql/internal/mysqltest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// latestDeadlock returns the LATEST DETECTED DEADLOCK section of SHOW
// ENGINE INNODB STATUS (server-wide: it may be another test's).
func latestDeadlock(t *testing.T) string {
	t.Helper()
	var typ, name, status string
	if err := mysqltest.Admin(t).QueryRow(`SHOW ENGINE INNODB STATUS`).Scan(&typ, &name, &status); err != nil {
		t.Fatal(err)
	}
	const head = "LATEST DETECTED DEADLOCK"
	i := strings.Index(status, head)
	if i < 0 {
		return ""
	}
	s := status[i:]
	if j := strings.Index(s, "\nTRANSACTIONS\n"); j >= 0 {
		s = s[:j]
	}
	return s
}

// TestPublishersNotDeadlockVictims: four claim loops (each settling what it
// claimed in its next claim, as a relay does) and eight publishers on a
// nearly empty table for a few seconds: no publishing transaction loses a
// deadlock (1213) to a claim.
func TestPublishersNotDeadlockVictims(t *testing.T) {
	t.Parallel()
	retries, d, e := newRetryEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var claimed, published, deadlocks, otherErrs atomic.Int64
	for range 4 {
		db := sqltx.FromDB(mysqltest.Open(t, nil))
		wg.Go(func() {
			var done []outboxdriver.Fence
			for ctx.Err() == nil {
				cs, _, err := d.Claim(ctx, db, e.ob.Table(), outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5, Done: done})
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("claim: %v", err)
					}
					return
				}
				done = done[:0]
				for _, c := range cs {
					done = append(done, outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts})
				}
				claimed.Add(int64(len(cs)))
				if len(cs) == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	pool := mysqltest.Open(t, nil)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				err := func() error {
					tx, err := pool.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					if _, err := tx.ExecContext(ctx, `INSERT INTO `+e.orders+` (id) VALUES (?)`, fmt.Sprint(w, "-", i)); err != nil {
						return err
					}
					if _, err := e.ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "t", Payload: []byte(`{}`)}); err != nil {
						return err
					}
					return tx.Commit()
				}()
				var me *driver.MySQLError
				switch {
				case err == nil:
					published.Add(1)
				case errors.As(err, &me) && me.Number == 1213:
					deadlocks.Add(1)
				case ctx.Err() != nil:
				default:
					otherErrs.Add(1)
					t.Logf("publish: %v", err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d published, %d claimed, %d publishers lost a deadlock, %d other errors; claim reruns %v by error %v",
		published.Load(), claimed.Load(), deadlocks.Load(), otherErrs.Load(), retries.byOp, retries.codes)
	if deadlocks.Load() > 0 {
		t.Errorf("%d publishing transactions were deadlock victims; the latest deadlock:\n%s", deadlocks.Load(), latestDeadlock(t))
	}
	if published.Load() == 0 || claimed.Load() == 0 {
		t.Error("nothing published or claimed")
	}
}

// openClaim is a pool whose transactions stay open after their work: InTx
// runs f, reports the rows the transaction has locked on locked, and
// commits only when release is closed.
type openClaim struct {
	outboxdriver.TxDB
	locked  chan int
	release chan struct{}
}

func (o openClaim) InTx(ctx context.Context, f func(tx outbox.DB) error) error {
	return o.TxDB.InTx(ctx, func(tx outbox.DB) error {
		if err := f(tx); err != nil {
			return err
		}
		// innodb_trx is refreshed only when it was not read for 100ms.
		time.Sleep(150 * time.Millisecond)
		rows, err := tx.QueryDB(ctx, `SELECT trx_rows_locked FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = CONNECTION_ID()`)
		if err != nil {
			return err
		}
		n := -1
		for rows.Next() {
			if err := rows.Scan(&n); err != nil {
				rows.Close()
				return err
			}
		}
		rows.Close()
		o.locked <- n
		<-o.release
		return nil
	})
}

// TestClaimLocksOnlyItsRows: with 20,000 due messages of topic a between
// a few of topics b and c (5 of each before, 5 after), a claim of one
// topic whose transaction is still open locks only the rows it took, so a
// claim of another topic, meanwhile, gets that topic's due rows at once. A
// claim used to lock every row its index scan walked past: a claim of b
// locked all of a's backlog (a claim of a then got nothing), and a claim of
// a locked the rows of c before its own (a claim of c then missed them).
func TestClaimLocksOnlyItsRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	d := e.ob.Dialect().(outboxdriver.RelayDialect)
	publishMany(t, e, 5, "b")
	publishMany(t, e, 5, "c")
	publishMany(t, e, 20000, "a")
	publishMany(t, e, 5, "b")
	publishMany(t, e, 5, "c")
	ctx := context.Background()
	for _, tc := range []struct {
		open, other           string
		openLimit, otherLimit int
		want                  int // rows of other the second claim takes
	}{
		{open: "b", openLimit: 10, other: "a", otherLimit: 100, want: 100},
		{open: "a", openLimit: 100, other: "c", otherLimit: 10, want: 10},
	} {
		held := openClaim{TxDB: sqltx.FromDB(mysqltest.Open(t, nil)), locked: make(chan int, 1), release: make(chan struct{})}
		type result struct {
			cs  []outboxdriver.Claimed
			err error
		}
		first := make(chan result, 1)
		go func() {
			cs, _, err := d.Claim(ctx, held, e.ob.Table(), outboxdriver.ClaimParams{Topics: []string{tc.open}, Limit: tc.openLimit, Lease: time.Minute, MaxAttempts: 5})
			first <- result{cs, err}
		}()
		var locked int
		select {
		case locked = <-held.locked:
		case r := <-first:
			t.Fatalf("claim of %s: %v", tc.open, r.err)
		}
		short, cancel := context.WithTimeout(ctx, 10*time.Second)
		cs, _, err := d.Claim(short, sqltx.FromDB(e.pool), e.ob.Table(), outboxdriver.ClaimParams{Topics: []string{tc.other}, Limit: tc.otherLimit, Lease: time.Minute, MaxAttempts: 5})
		cancel()
		close(held.release)
		r := <-first
		if r.err != nil || len(r.cs) != tc.openLimit {
			t.Fatalf("claim of %s: %d rows, %v; want %d", tc.open, len(r.cs), r.err, tc.openLimit)
		}
		if err != nil || len(cs) != tc.want {
			t.Errorf("claim of %s while a claim of %s is open: %d rows, %v; want %d", tc.other, tc.open, len(cs), err, tc.want)
		}
		// The rows it took, and a few it may have found taken meanwhile.
		if locked > 2*tc.openLimit {
			t.Errorf("the open claim of %d rows of %s holds %d row locks", tc.openLimit, tc.open, locked)
		}
		t.Logf("an open claim of %d rows of %s held %d row locks; a claim of %s meanwhile took %d rows", tc.openLimit, tc.open, locked, tc.other, len(cs))
	}
}

// TestSettleNotBlockedByOtherRows: a publisher's transaction that holds
// locks (a duplicate of a stored dedup key locks the stored copy until it
// ends) does not hold up the settles, renewals and claims of other rows,
// on a table of 21 rows where a plain WHERE id IN (...) of 20 of them is
// planned as a scan that locks, and waits for, every row. The relay's pool
// waits at most one second for a lock and never reruns, so any wait fails
// the test.
func TestSettleNotBlockedByOtherRows(t *testing.T) {
	t.Parallel()
	d := mysql.New(mysql.Config{LockRetries: -1}).(outboxdriver.RelayDialect)
	e := newEnv(t, d, outbox.Config{})
	ctx := context.Background()
	first := e.publish(t, outbox.Message{Topic: "x", DedupKey: "k"})[0]
	var msgs []outbox.Message
	for range 20 {
		msgs = append(msgs, outbox.Message{Topic: "t"})
	}
	e.publish(t, msgs...)
	if _, err := mysqltest.Admin(t).Exec(`ANALYZE TABLE ` + e.table); err != nil {
		t.Fatal(err)
	}
	db := sqltx.FromDB(mysqltest.Open(t, func(c *driver.Config) {
		c.Params = map[string]string{"innodb_lock_wait_timeout": "1"}
	}))
	tb := e.ob.Table()
	p := outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 20, Lease: time.Minute, MaxAttempts: 5}
	cs, _, err := d.Claim(ctx, db, tb, p)
	if err != nil || len(cs) != 20 {
		t.Fatalf("claim: %d rows, %v", len(cs), err)
	}
	fences := make([]outboxdriver.Fence, len(cs))
	for i, c := range cs {
		fences[i] = outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}
	}

	dup := e.begin(t)
	if r, err := e.ob.Publish(ctx, sqltx.From(dup), outbox.Message{Topic: "x", DedupKey: "k"}); err != nil || !r.Duplicate {
		t.Fatalf("duplicate publish: %+v %v", r, err)
	}
	defer dup.Rollback()

	if kept, err := d.Renew(ctx, db, tb, time.Minute, fences); err != nil || len(kept) != 20 {
		t.Errorf("renew of 20 other rows while a publisher holds %s: %d kept, %v", first, len(kept), err)
	}
	// Ten successes carried by a claim; a settle of five retries, four
	// dead letters and one stale fence (which takes the exact path: lock
	// the rows, then write); then the rest.
	p.Done = fences[:10]
	if _, done, err := d.Claim(ctx, db, tb, p); err != nil || len(done) != 10 {
		t.Errorf("claim carrying 10 successes: %d applied, %v", len(done), err)
	}
	var s []outboxdriver.Settlement
	for i, f := range fences[10:] {
		kind := outboxdriver.SettleRetry
		if i >= 5 {
			kind = outboxdriver.SettleDead
		}
		s = append(s, outboxdriver.Settlement{Fence: f, Kind: kind, Delay: time.Hour, Error: "later"})
	}
	s[9].Attempts = 7
	if applied, err := d.Settle(ctx, db, tb, outboxdriver.SettleParams{}, s); err != nil || len(applied) != 9 {
		t.Errorf("settle of 10 other rows, one stale: %d applied, %v; want 9", len(applied), err)
	}
	if n, err := d.Redrive(ctx, db, tb, "t"); err != nil || n != 4 {
		t.Errorf("redrive: %d, %v; want 4", n, err)
	}
	for _, f := range fences[10:] { // one row per statement: a scan would wait
		if _, err := mysqltest.Admin(t).Exec(`UPDATE `+e.table+` SET state = 'dead', settled_at = UTC_TIMESTAMP(6) - INTERVAL 1 DAY WHERE id = ?`, f.ID.String()); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := d.Purge(ctx, db, tb, []outbox.State{outbox.StateDead}, time.Hour); err != nil || n != 10 {
		t.Errorf("purge: %d, %v; want 10", n, err)
	}
	if err := dup.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, e.table, ""); n != 1 {
		t.Errorf("%d rows left, want the first copy alone", n)
	}
}
