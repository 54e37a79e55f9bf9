package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/mysql/internal/mysqltest"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// lockRetries counts the dialect's reruns of relay transactions.
type lockRetries struct {
	mu    sync.Mutex
	byOp  map[string]int
	codes map[uint16]int
}

func (l *lockRetries) dialect() outbox.Dialect {
	l.byOp, l.codes = map[string]int{}, map[uint16]int{}
	return mysql.New(mysql.Config{LockRetries: 20, OnLockRetry: func(op string, _ int, err error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.byOp[op]++
		var me *driver.MySQLError
		if errors.As(err, &me) {
			l.codes[me.Number]++
		}
	}})
}

// newRetryEnv returns a fresh env whose dialect counts its reruns.
func newRetryEnv(t *testing.T) (*lockRetries, outboxdriver.RelayDialect, *env) {
	t.Helper()
	retries := &lockRetries{}
	d := retries.dialect().(outboxdriver.RelayDialect)
	return retries, d, newEnv(t, d, outbox.Config{})
}

// publishMany publishes n messages of topic in batches of 1000.
func publishMany(t *testing.T, e *env, n int, topic string) {
	t.Helper()
	for n > 0 {
		k := min(n, 1000)
		msgs := make([]outbox.Message, k)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: topic, Payload: []byte(`{"k":1}`)}
		}
		e.publish(t, msgs...)
		n -= k
	}
}

// TestFourRelays: four relays (separate pools, as separate replicas) on
// 20,000 messages never hold the same (id, attempts) twice and deliver every
// message; lock conflicts between their transactions, if any, are retried
// by the dialect and counted, and none reaches a claim, a settle or a
// handler.
func TestFourRelays(t *testing.T) {
	t.Parallel()
	var retries lockRetries
	d := retries.dialect()
	e := newEnv(t, d, outbox.Config{})
	const n = 20000
	publishMany(t, e, n, "t")
	tr := dialecttest.NewTrace()
	var mu sync.Mutex
	delivered := map[outbox.ID]int{}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 4 {
		r, err := e.ob.Relay(sqltx.FromDB(mysqltest.Open(t, nil)), outbox.RelayConfig{
			Tracer: tr, Concurrency: 64, PollInterval: 20 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatal(err)
		}
		r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
			mu.Lock()
			delivered[d.ID]++
			mu.Unlock()
			return nil
		})
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(ctx) }()
	}
	begin := time.Now()
	dialecttest.Eventually(t, 180*time.Second, "all delivered and settled", func() bool { return count(t, e.table, "") == 0 })
	took := time.Since(begin)
	cancel()
	wg.Wait()
	if len(delivered) != n {
		t.Errorf("%d messages delivered, want %d", len(delivered), n)
	}
	// No lock conflict or other error reached the relay (a claim cut
	// short by the shutdown is fine).
	tr.CheckClaimedOnce(t, n, func(err error) bool { return errors.Is(err, context.Canceled) })
	t.Logf("20,000 messages, 4 relays: %v; lock conflicts retried by the dialect: %v (by error number %v)", took.Round(time.Millisecond), retries.byOp, retries.codes)
}

// TestClaimNeverExceedsLimit: eight claimers at once, limits 1 to 17, over
// rows of two topics: every claim takes at most its limit and only its
// topic, the claims are disjoint, and the rows marked processing are the
// rows returned.
func TestClaimNeverExceedsLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	publishMany(t, e, 1000, "t")
	publishMany(t, e, 1000, "other")
	d := mysql.Dialect().(outboxdriver.RelayDialect)
	db := sqltx.FromDB(e.pool)
	total := dialecttest.ClaimConcurrently(t, d, db, e.ob.Table(), "t", 8, 12)
	if total == 0 {
		t.Fatal("nothing claimed")
	}
	if n := count(t, e.table, `state = 'processing'`); n != total {
		t.Errorf("%d rows processing, claims returned %d", n, total)
	}
	if n := count(t, e.table, `state = 'processing' AND topic <> 't'`); n != 0 {
		t.Errorf("%d rows of another topic claimed", n)
	}
}

// TestPlansUseIndexes: at 200,000 rows the claim walks the claim index in
// order (a range scan, no filesort, no full scan), the fenced settles find
// rows by primary key, and redrive and purge use the settled_at index.
func TestPlansUseIndexes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	admin := mysqltest.Admin(t)
	conn, err := admin.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{
		`SET SESSION max_recursive_iterations = 300000`,
		`INSERT INTO ` + e.table + ` (id, topic, state, available_at, settled_at)
		WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 200000)
		SELECT LOWER(CONCAT_WS('-', LPAD(HEX(n), 8, '0'), '0000', '7000', '8000', '000000000000')), CONCAT('t', n % 10),
		       ELT(1 + n % 4, 'pending', 'processing', 'delivered', 'dead'), UTC_TIMESTAMP(6) - INTERVAL n SECOND,
		       CASE WHEN n % 4 >= 2 THEN UTC_TIMESTAMP(6) - INTERVAL n SECOND END
		FROM g`,
		`ANALYZE TABLE ` + e.table,
	} {
		if _, err := conn.ExecContext(context.Background(), q); err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
	}
	if n := count(t, e.table, ""); n != 200000 {
		t.Fatalf("%d rows, want 200000", n)
	}
	tb := e.ob.Table()
	var ids []outbox.ID
	for _, n := range []int{5, 6} {
		id, err := outbox.ParseID(fmt.Sprintf("%08x-0000-7000-8000-000000000000", n))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, tc := range relayStatements(tb, ids) {
		checkPlan(t, admin, tc.name, tc.q, tc.key)
	}
	// The claim really takes its rows from the index, in order, with a
	// 200,000-row table: 100 rows of t1, due, oldest first.
	d := mysql.Dialect().(outboxdriver.RelayDialect)
	cs, _, err := d.Claim(context.Background(), sqltx.FromDB(e.pool), tb, outboxdriver.ClaimParams{Topics: []string{"t1"}, Limit: 100, Lease: time.Minute, MaxAttempts: 10})
	if err != nil || len(cs) != 100 {
		t.Fatalf("claim at 200k rows: %d rows, %v", len(cs), err)
	}
	// Redrive and purge work through many batches.
	dead := count(t, e.table, `state = 'dead' AND topic = 't3'`)
	if n, err := e.ob.Redrive(context.Background(), sqltx.FromDB(e.pool), "t3"); err != nil || n != int64(dead) || dead < 2*1000 {
		t.Errorf("redrive of %d dead rows: %d, %v", dead, n, err)
	}
	delivered := count(t, e.table, `state = 'delivered'`)
	if n, err := e.ob.Purge(context.Background(), sqltx.FromDB(e.pool), outbox.PurgeOptions{States: []outbox.State{outbox.StateDelivered}}); err != nil || n != int64(delivered) {
		t.Errorf("purge of %d delivered rows: %d, %v", delivered, n, err)
	}
	if n := count(t, e.table, `state IN ('delivered') OR (state = 'dead' AND topic = 't3')`); n != 0 {
		t.Errorf("%d rows left that redrive or purge should have changed", n)
	}
}

// plan is one row of EXPLAIN.
type plan struct{ table, typ, key, extra string }

// explain returns the plan of q.
func explain(t *testing.T, db *sql.DB, q string) []plan {
	t.Helper()
	rows, err := db.Query(`EXPLAIN ` + q)
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, q)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out []plan
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var p plan
		for i, c := range cols {
			switch c {
			case "table":
				p.table = vals[i].String
			case "type":
				p.typ = vals[i].String
			case "key":
				p.key = vals[i].String
			case "Extra":
				p.extra = vals[i].String
			}
		}
		out = append(out, p)
	}
	return out
}

// relayStatement is a relay statement and the index it must reach the
// table's rows through.
type relayStatement struct{ name, q, key string }

// relayStatements returns every relay statement on tb that reads or
// changes rows: the claim's candidate read through the claim index, the
// others by primary key. ids are two rows of the table (with ids of no row
// the optimizer sees an impossible WHERE and shows no plan).
func relayStatements(tb outbox.Table, ids []outbox.ID) []relayStatement {
	two := func(kind outboxdriver.SettleKind, attempts ...int) []outboxdriver.Settlement {
		return []outboxdriver.Settlement{{Fence: outboxdriver.Fence{ID: ids[0], Attempts: attempts[0]}, Kind: kind, Delay: time.Second, Error: "boom"},
			{Fence: outboxdriver.Fence{ID: ids[1], Attempts: attempts[1]}, Kind: kind, Delay: time.Second, Error: "boom"}}
	}
	// Groups of two rows: with one row the derived table of ids is a
	// constant, and the optimizer reads the row to plan.
	settles := mysql.SettleSQL(tb, outboxdriver.SettleParams{}, two(outboxdriver.SettleDone, 1, 1), two(outboxdriver.SettleRetry, 1, 2), two(outboxdriver.SettleDead, 3, 3))
	kept := mysql.SettleSQL(tb, outboxdriver.SettleParams{KeepDelivered: true, DiscardDead: true}, two(outboxdriver.SettleDone, 1, 1), nil, two(outboxdriver.SettleDead, 1, 1))
	_, revive := mysql.RedriveSQL(tb, "t1")
	purgeFind, remove := mysql.PurgeSQL(tb, []outbox.State{outbox.StateDead}, 55*time.Hour)
	updates := mysql.ClaimUpdateSQL(tb, ids, ids, time.Minute)
	return []relayStatement{
		{"claim candidates", mysql.CandidatesSQL(tb, []string{"t1"}, mysql.Cursor{}, 100), "outbox_claim_idx"},
		{"claim candidates after a cursor", mysql.CandidatesSQL(tb, []string{"t1"}, mysql.Cursor{At: 1, ID: ids[0]}, 100), "outbox_claim_idx"},
		{"claim candidates of two topics", mysql.CandidatesSQL(tb, []string{"t1", "t2"}, mysql.Cursor{}, 100), "outbox_claim_idx"},
		{"claim lock", mysql.ClaimSQL(tb, []string{"t1", "t2"}, ids, 2), "PRIMARY"},
		// A claim of every topic (a catch-all handler): the topics by a
		// loose scan of the claim index, then each topic's range.
		{"claim topics of every topic", mysql.TopicsSQL(tb), "outbox_claim_idx"},
		{"claim candidates of every topic", mysql.CandidatesAllSQL(tb, []string{"t1", "t2", "t3"}, mysql.Cursor{}, 100), "outbox_claim_idx"},
		{"claim lock of every topic", mysql.ClaimSQL(tb, nil, ids, 2), "PRIMARY"},
		{"claim update", updates[0], "PRIMARY"},
		{"claim dead-letter", updates[1], "PRIMARY"},
		{"fence lock", mysql.LockSQL(tb, ids), "PRIMARY"},
		{"delete done", settles[0], "PRIMARY"},
		{"retry, two attempts", settles[1], "PRIMARY"},
		{"dead", settles[2], "PRIMARY"},
		{"delivered", kept[0], "PRIMARY"},
		{"discard dead", kept[1], "PRIMARY"},
		{"renew", mysql.RenewSQL(tb, ids, time.Minute), "PRIMARY"},
		{"redrive write", revive(ids), "PRIMARY"},
		{"purge write", remove(ids), "PRIMARY"},
		// Finding the few oldest rows to purge; finding most of the table
		// may rightly scan it: these reads take no locks.
		{"purge find", purgeFind, "outbox_settled_idx"},
	}
}

// checkPlan fails t unless every access to the outbox table in q's plan is
// a lookup or range on key, without sorting those rows (a derived table of
// ids, or the merge of a few rows per topic, may be sorted).
func checkPlan(t *testing.T, db *sql.DB, name, q, key string) {
	t.Helper()
	ps := explain(t, db, q)
	n := 0
	for _, p := range ps {
		if p.table != "outbox" && p.table != "o" {
			continue
		}
		n++
		if p.key != key || p.typ == "ALL" || p.typ == "index" {
			t.Errorf("%s: %+v, want a lookup or range on %s; plan %+v", name, p, key, ps)
		}
		if strings.Contains(p.extra, "filesort") {
			t.Errorf("%s sorts: %+v", name, p)
		}
	}
	if n == 0 {
		t.Errorf("%s: no access to the table in plan %+v", name, ps)
	}
}

// holdLocks opens a transaction on its own connection that locks the rows
// ids FOR UPDATE after first writing rows elsewhere (so InnoDB sees it as
// the heavier transaction and picks the other one as a deadlock victim).
func holdLocks(t *testing.T, e *env, ids ...outbox.ID) *sql.Tx {
	t.Helper()
	tx := e.begin(t)
	for i := range 50 {
		if _, err := tx.Exec(`INSERT INTO `+e.orders+` (id) VALUES (?)`, fmt.Sprint("weight-", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		var a int
		if err := tx.QueryRow(`SELECT attempts FROM `+e.table+` WHERE id = ? FOR UPDATE`, id.String()).Scan(&a); err != nil {
			t.Fatal(err)
		}
	}
	return tx
}

// TestLockConflictsRetried: a settle that loses a deadlock (1213) and a
// renewal that times out waiting for a lock (1205) are run again by the
// dialect, counted, and succeed once the lock is gone; the caller sees no
// error.
func TestLockConflictsRetried(t *testing.T) {
	t.Parallel()
	retries, d, e := newRetryEnv(t)
	ids := e.publish(t, outbox.Message{Topic: "t"}, outbox.Message{Topic: "t"}, outbox.Message{Topic: "t"})
	ctx := context.Background()
	db := sqltx.FromDB(e.pool)
	cs, _, err := d.Claim(ctx, db, e.ob.Table(), outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 3, Lease: time.Minute, MaxAttempts: 5})
	if err != nil || len(cs) != 3 {
		t.Fatalf("claim: %v %v", cs, err)
	}

	// Deadlock: the settle locks ids[0], then waits for ids[1], which the
	// other transaction holds; that one then asks for ids[0].
	other := holdLocks(t, e, ids[1])
	type result struct {
		applied []outboxdriver.Fence
		err     error
	}
	done := make(chan result, 1)
	go func() {
		s := []outboxdriver.Settlement{
			{Fence: outboxdriver.Fence{ID: ids[0], Attempts: 1}, Kind: outboxdriver.SettleDone},
			{Fence: outboxdriver.Fence{ID: ids[1], Attempts: 1}, Kind: outboxdriver.SettleDone},
		}
		applied, err := d.Settle(ctx, db, e.ob.Table(), outboxdriver.SettleParams{}, s)
		done <- result{applied, err}
	}()
	for i := 0; lockWaits(t, e.db) == 0; i++ {
		if i == 50 {
			t.Fatal("the settle never waited for the lock")
		}
		// InnoDB refreshes innodb_trx only when it was not read for 100ms.
		time.Sleep(200 * time.Millisecond)
	}
	var a int
	if err := other.QueryRow(`SELECT attempts FROM `+e.table+` WHERE id = ? FOR UPDATE`, ids[0].String()).Scan(&a); err != nil {
		t.Fatalf("the heavier transaction lost the deadlock: %v", err)
	}
	if err := other.Rollback(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.applied) != 2 {
		t.Fatalf("settle after a deadlock: applied %v, %v", r.applied, r.err)
	}
	if retries.byOp["settle"] != 1 || retries.codes[1213] != 1 {
		t.Errorf("the settle lost a deadlock: reruns %v by error %v, want one settle rerun after 1213", retries.byOp, retries.codes)
	}
	if n := count(t, e.table, ""); n != 1 {
		t.Errorf("%d rows left after settling two of three, want 1", n)
	}

	// Lock wait timeout: a pool whose sessions wait one second for a lock.
	short := mysqltest.Open(t, func(c *driver.Config) {
		c.Params = map[string]string{"innodb_lock_wait_timeout": "1"}
	})
	other = holdLocks(t, e, ids[2])
	release := time.AfterFunc(1500*time.Millisecond, func() { _ = other.Rollback() })
	defer release.Stop()
	kept, err := d.Renew(ctx, sqltx.FromDB(short), e.ob.Table(), time.Minute, []outboxdriver.Fence{{ID: ids[2], Attempts: 1}})
	if err != nil || len(kept) != 1 {
		t.Fatalf("renew after a lock wait timeout: %v %v", kept, err)
	}
	if retries.byOp["renew"] == 0 || retries.codes[1205] == 0 {
		t.Errorf("lock wait timeout not retried and counted: %v %v", retries.byOp, retries.codes)
	}
	t.Logf("reruns: %v by error number %v", retries.byOp, retries.codes)
}

// TestRetriesBounded: with LockRetries 1 a conflict that outlasts the rerun
// is returned (wrapping the driver's error), after exactly one rerun.
func TestRetriesBounded(t *testing.T) {
	t.Parallel()
	var reruns atomic.Int32
	d := mysql.New(mysql.Config{LockRetries: 1, OnLockRetry: func(string, int, error) { reruns.Add(1) }}).(outboxdriver.RelayDialect)
	e := newEnv(t, d, outbox.Config{})
	ids := e.publish(t, outbox.Message{Topic: "t"})
	ctx := context.Background()
	if _, _, err := d.Claim(ctx, sqltx.FromDB(e.pool), e.ob.Table(), outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 1, Lease: time.Minute, MaxAttempts: 5}); err != nil {
		t.Fatal(err)
	}
	short := mysqltest.Open(t, func(c *driver.Config) {
		c.Params = map[string]string{"innodb_lock_wait_timeout": "1"}
	})
	other := holdLocks(t, e, ids[0])
	defer other.Rollback()
	_, err := d.Settle(ctx, sqltx.FromDB(short), e.ob.Table(), outboxdriver.SettleParams{}, []outboxdriver.Settlement{{Fence: outboxdriver.Fence{ID: ids[0], Attempts: 1}, Kind: outboxdriver.SettleDone}})
	var me *driver.MySQLError
	if !errors.As(err, &me) || me.Number != 1205 {
		t.Errorf("settle against a held lock: %v, want error 1205", err)
	}
	if n := reruns.Load(); n != 1 {
		t.Errorf("%d reruns, want 1", n)
	}
}

// lockWaits counts the transactions waiting for a lock on a table of db.
func lockWaits(t *testing.T, db string) int {
	t.Helper()
	rows, err := mysqltest.Admin(t).Query(`SELECT trx_state FROM information_schema.innodb_trx WHERE trx_query LIKE ?`, "%"+db+"%")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		if s == "LOCK WAIT" {
			n++
		}
	}
	return n
}

// TestMixedFences: a settle batch and a claim's carried successes that mix
// holding and stale fences apply exactly the holding ones (the counted fast
// path falls back to locking the rows and checking each fence).
func TestMixedFences(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		e := newEnv(t, nil, outbox.Config{})
		d := mysql.Dialect().(outboxdriver.RelayDialect)
		db := sqltx.FromDB(e.pool)
		ctx := context.Background()
		ids := e.publish(t, outbox.Message{Topic: "t"}, outbox.Message{Topic: "t"}, outbox.Message{Topic: "t"}, outbox.Message{Topic: "t"})
		p := outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 3, Lease: time.Minute, MaxAttempts: 5}
		if cs, _, err := d.Claim(ctx, db, e.ob.Table(), p); err != nil || len(cs) != 3 {
			t.Fatalf("claim: %v %v", cs, err)
		}
		applied, err := d.Settle(ctx, db, e.ob.Table(), outboxdriver.SettleParams{KeepDelivered: keep}, []outboxdriver.Settlement{
			{Fence: outboxdriver.Fence{ID: ids[0], Attempts: 1}, Kind: outboxdriver.SettleDone},
			{Fence: outboxdriver.Fence{ID: ids[1], Attempts: 7}, Kind: outboxdriver.SettleDone},
			{Fence: outboxdriver.Fence{ID: ids[1], Attempts: 1}, Kind: outboxdriver.SettleRetry, Delay: time.Hour, Error: "later"},
		})
		if err != nil || len(applied) != 2 || applied[0] != (outboxdriver.Fence{ID: ids[0], Attempts: 1}) || applied[1] != (outboxdriver.Fence{ID: ids[1], Attempts: 1}) {
			t.Errorf("keep %v: settle applied %v, %v; want the first success and the retry", keep, applied, err)
		}
		if n := count(t, e.table, `id = ? AND state = 'pending' AND last_error = 'later' AND available_at > UTC_TIMESTAMP(6) + INTERVAL 59 MINUTE`, ids[1].String()); n != 1 {
			t.Error("retry not written")
		}
		p.Done = []outboxdriver.Fence{{ID: ids[2], Attempts: 1}, {ID: ids[0], Attempts: 1}} // the second is settled already
		p.KeepDelivered = keep
		cs, done, err := d.Claim(ctx, db, e.ob.Table(), p)
		if err != nil || len(done) != 1 || done[0] != p.Done[0] {
			t.Errorf("keep %v: carried successes applied %v, %v; want only %v", keep, done, err, p.Done[0])
		}
		if len(cs) != 1 || cs[0].ID != ids[3] {
			t.Errorf("claimed %v, want only the fourth message", cs)
		}
		want := 0
		if keep {
			want = 2
		}
		if n := count(t, e.table, `state = 'delivered'`); n != want {
			t.Errorf("keep %v: %d delivered rows, want %d", keep, n, want)
		}
	}
}
