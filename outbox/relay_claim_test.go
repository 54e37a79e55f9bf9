package outbox_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// TestFencing: a handler outliving its lease (renewal off) is delivered
// again once, and the stale relay's settle changes no row; with renewal on,
// it is delivered once.
func TestFencing(t *testing.T) {
	for _, renew := range []bool{false, true} {
		t.Run(fmt.Sprint("renew=", renew), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{})
			tr := dialecttest.NewTrace()
			r := newRelay(t, e, outbox.RelayConfig{Lease: time.Second, DisableLeaseRenewal: !renew, Concurrency: 4, Tracer: tr})
			rec := newRecorder()
			r.Handle("slow", func(ctx context.Context, d outbox.Delivery) error {
				rec.add(d)
				if d.Attempt == 1 {
					time.Sleep(2500 * time.Millisecond) // 2.5 leases
				}
				return nil
			})
			ids := publishN(t, e, pool(t), 1, outbox.Message{Topic: "slow"})
			first := outboxdriver.Fence{ID: ids[0], Attempts: 1}
			start(t, r)
			eventually(t, 15*time.Second, "first attempt settled", func() bool { w, _ := tr.SettleOf(first); return w })
			eventually(t, 10*time.Second, "row gone", func() bool { return count(t, e.table, "") == 0 })
			_, applied := tr.SettleOf(first)
			a := rec.attempts(ids[0])
			if renew {
				if len(a) != 1 || !applied {
					t.Errorf("with renewal: attempts %v, first settle applied %v; want one delivery that settles", a, applied)
				}
				return
			}
			if len(a) != 2 || a[1] != 2 {
				t.Errorf("without renewal: attempts %v, want [1 2]", a)
			}
			if applied {
				t.Error("the stale relay's settle applied; it must change 0 rows")
			}
			if _, ok := tr.SettleOf(outboxdriver.Fence{ID: ids[0], Attempts: 2}); !ok {
				t.Error("the reclaiming delivery's settle did not apply")
			}
		})
	}
}

// staleStats empties the statistics: ANALYZE on an empty table, autovacuum
// off, then rows added, so the planner believes the table is empty.
func staleStats(t *testing.T, e *env, n int, topic string) {
	t.Helper()
	admin := pgtest.Admin(t)
	for _, q := range []string{
		`ALTER TABLE ` + e.table + ` SET (autovacuum_enabled = false)`,
		`ANALYZE ` + e.table,
		fmt.Sprintf(`INSERT INTO %s (id, topic) SELECT gen_random_uuid(), $1 FROM generate_series(1, %d)`, e.table, n),
	} {
		if _, err := admin.Exec(q, argsFor(q, topic)...); err != nil {
			t.Fatal(err)
		}
	}
}

func argsFor(q, topic string) []any {
	if strings.Contains(q, "$1") {
		return []any{topic}
	}
	return nil
}

// genericPool is a pgx pool whose sessions use generic plans for prepared
// statements (plan_cache_mode = force_generic_plan).
func genericPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	cfg.MaxConns = maxConns
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestClaimNeverExceedsLimit: under stale statistics and generic plans,
// with eight claimers at once, claiming one topic and then three, every
// claim takes at most its limit, the
// claims are disjoint, and rows marked processing equal rows returned.
func TestClaimNeverExceedsLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	staleStats(t, e, 2000, "t")
	d := postgres.Dialect().(outboxdriver.RelayDialect)
	db := pgxtx.FromPool(genericPool(t, 8))
	// More rounds than the generic-plan switch needs.
	total := dialecttest.ClaimConcurrently(t, d, db, e.ob.Table(), "t", 8, 12)
	// And claims of several topics (one LATERAL subquery per topic, each
	// locking up to the limit), on rows the statistics have not seen either.
	if _, err := pgtest.Admin(t).Exec(`INSERT INTO ` + e.table + ` (id, topic) SELECT gen_random_uuid(), 'u' FROM generate_series(1, 1000)`); err != nil {
		t.Fatal(err)
	}
	total += dialecttest.ClaimTopicsConcurrently(t, d, db, e.ob.Table(), []string{"t", "u", "none"}, 8, 12)
	if n := count(t, e.table, `state = 'processing'`); n != total {
		t.Errorf("%d rows processing, claims returned %d", n, total)
	}
	var plan string
	if err := pgtest.Admin(t).QueryRow(`SELECT reltuples::bigint::text FROM pg_class WHERE oid = $1::regclass`, e.table).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if plan != "0" && plan != "-1" {
		t.Errorf("statistics not stale: reltuples %s", plan)
	}
}

// TestFourRelays: four relays (separate pools, as separate replicas) on
// 20,000 messages never hold the same (id, attempts) twice and deliver
// every message.
func TestFourRelays(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	const n = 20000
	publishN(t, e, pool(t), n, outbox.Message{Topic: "t", Payload: []byte(`{"k":1}`)})
	tr := dialecttest.NewTrace()
	rec := newRecorder()
	for range 4 {
		r, err := e.ob.Relay(pgxtx.FromPool(pgtest.Pool(t)), fast(t, outbox.RelayConfig{Tracer: tr, Concurrency: 64}))
		if err != nil {
			t.Fatal(err)
		}
		r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
		start(t, r)
	}
	eventually(t, 120*time.Second, "all delivered and settled", func() bool { return count(t, e.table, "") == 0 })
	if rec.count() != n {
		t.Errorf("%d deliveries, want %d", rec.count(), n)
	}
	// No claim failed: in particular no deadlock between one relay's
	// settle and another's claim (see pgsql.ClaimSettleSQL).
	tr.CheckClaimedOnce(t, n, nil)
}

// TestClaimSettlesBeforeLocking: a claim that carries successes writes them
// before it locks any row to claim. Another relay may hold the lock of one
// of those successes (FOR UPDATE SKIP LOCKED keeps the lock of a row it
// re-checked and skipped until its statement commits); while the claim
// waits for it, it must hold no lock that relay's own settle could wait for,
// or the two deadlock. Here session C holds the lock of a success; the
// claim carrying it must wait without having locked the due row C then
// takes with NOWAIT.
func TestClaimSettlesBeforeLocking(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	p := pool(t)
	ids := publishN(t, e, p, 3, outbox.Message{Topic: "t"})
	ctx := context.Background()
	d := postgres.Dialect().(outboxdriver.RelayDialect)
	db := pgxtx.FromPool(p)
	// The first message is claimed (a success to carry); the others stay due.
	cs, _, err := d.Claim(ctx, db, e.ob.Table(), outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 1, Lease: time.Minute, MaxAttempts: 5})
	if err != nil || len(cs) != 1 || cs[0].ID != ids[0] {
		t.Fatalf("first claim %v, %v", cs, err)
	}
	c, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Rollback(ctx)
	if _, err := c.Exec(ctx, `SELECT 1 FROM `+e.table+` WHERE id = $1 FOR UPDATE`, ids[0]); err != nil {
		t.Fatal(err)
	}
	type result struct {
		claimed []outboxdriver.Claimed
		done    []outboxdriver.Fence
		err     error
	}
	res := make(chan result, 1)
	go func() {
		cs, done, err := d.Claim(ctx, db, e.ob.Table(), outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: time.Minute, MaxAttempts: 5,
			Done: []outboxdriver.Fence{{ID: ids[0], Attempts: 1}}})
		res <- result{cs, done, err}
	}()
	time.Sleep(300 * time.Millisecond) // the claim is waiting for C's lock
	if _, err := c.Exec(ctx, `SELECT 1 FROM `+e.table+` WHERE id = $1 FOR UPDATE NOWAIT`, ids[1]); err != nil {
		t.Errorf("a due row was locked by a claim still waiting to settle: %v", err)
	}
	if err := c.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil || len(r.done) != 1 || len(r.claimed) != 2 {
		t.Errorf("claim after the wait: claimed %d, settled %v, %v", len(r.claimed), r.done, r.err)
	}
}

// TestPlansUseIndexes: at 200,000 rows the claim, the settles and the
// purge use the indexes; no sequential scan of the table.
func TestPlansUseIndexes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	admin := pgtest.Admin(t)
	if _, err := admin.Exec(`INSERT INTO ` + e.table + ` (id, topic, state, available_at, settled_at)
		SELECT gen_random_uuid(), 't' || (g % 10), (ARRAY['pending','processing','delivered','dead'])[1 + g % 4],
		       now() - make_interval(secs => g), CASE WHEN g % 4 >= 2 THEN now() - make_interval(secs => g) END
		FROM generate_series(1, 200000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`ANALYZE ` + e.table); err != nil {
		t.Fatal(err)
	}
	explain := func(q string, args ...any) string { return explainPlan(t, q, args...) }
	id := outbox.NewID().String()
	deleteDone, _, retry, markDead, _ := pgsql.SettleSQL(e.ob.Table())
	for name, plan := range map[string]string{
		"claim":                 explain(pgsql.ClaimSQL(e.ob.Table(), 2), `{"t1","t2"}`, 100, 30.0, 10, 0.0),
		"claim+settle":          explain(pgsql.ClaimSettleSQL(e.ob.Table(), 2, false), `{"t1","t2"}`, 100, 30.0, 10, "{"+id+"}", "{1}", 0.0),
		"claim one":             explain(pgsql.ClaimSQL(e.ob.Table(), 1), "t1", 100, 30.0, 10, 0.0),
		"claim+settle one":      explain(pgsql.ClaimSettleSQL(e.ob.Table(), 1, false), "t1", 100, 30.0, 10, "{"+id+"}", "{1}", 0.0),
		"claim one in a window": explain(pgsql.ClaimSQL(e.ob.Table(), 1), "t1", 100, 30.0, 10, 2.5),
		"generic windowed":      genericPlan(t, pgsql.ClaimSettleSQL(e.ob.Table(), 2, false), `'{t1,t2}', 100, 30, 10, '{`+id+`}', '{1}', 2.5`),
		"settle":                explain(deleteDone, "{"+id+"}", "{1}"),
		"retry":                 explain(retry, "{"+id+"}", "{1}", "{1.5}", "{NULL}", `{"boom"}`),
		"dead":                  explain(markDead, "{"+id+"}", "{1}", `{"boom"}`),
		"renew":                 explain(pgsql.RenewSQL(e.ob.Table()), "{"+id+"}", "{1}", 30.0),
		"purge":                 explain(pgsql.PurgeSQL(e.ob.Table()), "{dead}", 36000.0, 1000, "key"),
		"generic purge":         genericPurgePlan(t, pgsql.PurgeSQL(e.ob.Table())),
		"generic claim":         genericPlan(t, pgsql.ClaimSettleSQL(e.ob.Table(), 2, false), `'{t1,t2}', 100, 30, 10, '{`+id+`}', '{1}', 0`),
		"generic claim one":     genericPlan(t, pgsql.ClaimSettleSQL(e.ob.Table(), 1, false), `'t1', 100, 30, 10, '{`+id+`}', '{1}', 0`),
		// Every topic (a catch-all handler): the live topics by a skip
		// scan of the claim index, then claimed as several topics are.
		"claim all":         explain(pgsql.ClaimSQL(e.ob.Table(), pgsql.AllTopics), "", 100, 30.0, 10, 0.0),
		"claim+settle all":  explain(pgsql.ClaimSettleSQL(e.ob.Table(), pgsql.AllTopics, false), "", 100, 30.0, 10, "{"+id+"}", "{1}", 0.0),
		"generic claim all": genericPlan(t, pgsql.ClaimSettleSQL(e.ob.Table(), pgsql.AllTopics, false), `'', 100, 30, 10, '{`+id+`}', '{1}', 0`),
	} {
		if strings.Contains(plan, "Seq Scan on outbox") {
			t.Errorf("%s plan scans the table:\n%s", name, plan)
		}
		if !strings.Contains(plan, "Index") {
			t.Errorf("%s plan uses no index:\n%s", name, plan)
		}
		if strings.Contains(name, "purge") {
			// Through the settled index, the lock taken once (not per
			// row), the rows deleted by primary key.
			if !strings.Contains(plan, "outbox_settled_idx") || !strings.Contains(plan, "One-Time Filter") || !strings.Contains(plan, "outbox_pkey") {
				t.Errorf("%s plan does not find the rows through the settled index, lock once and delete by key:\n%s", name, plan)
			}
		}
		if strings.Contains(name, "claim") {
			// The due rows come from the topic claim index in claim order,
			// locked as they are read, and are updated by TID.
			if !strings.Contains(plan, "Tid Scan") || !strings.Contains(plan, "outbox_topic_claim_idx") {
				t.Errorf("%s plan does not lock the due rows in index order and update them by TID:\n%s", name, plan)
			}
			// A Sort above the scan would read (and lock) every due row of
			// the topics first. A claim of several topics sorts only the
			// at most limit rows of each topic (the LATERAL subquery's
			// LIMIT), to merge them.
			sorts := strings.Count(plan, "Sort Key")
			if strings.Contains(name, "one") && sorts != 0 ||
				!strings.Contains(name, "one") && (sorts != 1 || !strings.Contains(plan, "Sort Key: x.available_at, x.id")) {
				t.Errorf("%s plan sorts more than each topic's first rows:\n%s", name, plan)
			}
			// The topics: unnested from $1, or, for every topic, a
			// recursive skip scan of the claim index (one probe a topic).
			if all := strings.Contains(name, "all"); !strings.Contains(name, "one") && !all && !strings.Contains(plan, "Function Scan on unnest") ||
				all && (!strings.Contains(plan, "Recursive Union") || !strings.Contains(plan, "Index Only Scan using outbox_topic_claim_idx") || !strings.Contains(plan, "(topic > ")) {
				t.Errorf("%s plan does not take its topics as it should:\n%s", name, plan)
			}
		}
		// A parameter, not its value: $1 (the topic, or the purge's
		// states), or $5 (the fenced ids; a claim of several topics shows
		// no $1, which only unnest reads).
		if strings.HasPrefix(name, "generic") && !strings.Contains(plan, "$1") && !strings.Contains(plan, "($5)") {
			t.Errorf("%s plan is not generic:\n%s", name, plan)
		}
		t.Logf("%s:\n%s", name, plan)
	}
}

// genericPurgePlan returns the plan of pgsql.PurgeSQL q under a generic
// plan, as genericPlan does for a claim.
func genericPurgePlan(t *testing.T, q string) string {
	t.Helper()
	return preparedPlan(t, "text, float8, int, text", q, `'{dead}', 36000, 1000, 'key'`)
}

// planOf runs q (an EXPLAIN) on db and returns its output, a line a row.
func planOf(t *testing.T, db interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, q string, args ...any) string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, q)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var line string
		rows.Scan(&line)
		b.WriteString(line + "\n")
	}
	return b.String()
}

// explainPlan returns the plan of EXPLAIN q, planned with the values of
// args.
func explainPlan(t *testing.T, q string, args ...any) string {
	return planOf(t, pgtest.Admin(t), `EXPLAIN `+q, args...)
}

// genericPlan returns the plan a prepared claim statement q (ClaimSQL's
// parameters, then the fences of ClaimSettleSQL) gets under a generic
// plan, as pgx's cached statements may after five runs: prepared on a
// connection of its own (EXPLAIN with parameters would plan with their
// values). args are the EXECUTE arguments, as SQL; opts, if any, EXPLAIN's
// options, such as "(FORMAT JSON)".
func genericPlan(t *testing.T, q, args string, opts ...string) string {
	t.Helper()
	// $1 is text in both forms: the topic, or a text[] literal.
	return preparedPlan(t, "text, int, float8, int, text, text, float8", q, args, opts...)
}

// preparedPlan prepares q with parameters of types on a connection of its
// own under force_generic_plan, and returns the plan of EXECUTE with args.
func preparedPlan(t *testing.T, types, q, args string, opts ...string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgtest.Admin(t).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{`SET plan_cache_mode = force_generic_plan`, `PREPARE generic_stmt (` + types + `) AS ` + q} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	defer conn.ExecContext(ctx, `RESET plan_cache_mode`)
	defer conn.ExecContext(ctx, `DEALLOCATE generic_stmt`)
	return planOf(t, conn, `EXPLAIN `+strings.Join(opts, " ")+` EXECUTE generic_stmt (`+args+`)`)
}

// TestClaimOfOneTopicSkipsOtherTopics: 50 due rows of one topic behind
// 200,000 older due rows of another. With the default schema (the claim
// index leads with the topic), a relay of that one topic, and a relay of
// three topics that include it, claim the 50 through the topic claim
// index and never read the other topic's rows, under custom and generic
// plans, even for topics the statistics call rare or have not seen; a
// claim of several topics sorts only each topic's first rows to merge
// them. postgres.TopicIndexSQL (building that index ahead of migration
// 0004) creates nothing on a migrated table.
func TestClaimOfOneTopicSkipsOtherTopics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	admin := pgtest.Admin(t)
	if _, err := admin.Exec(`INSERT INTO ` + e.table + ` (id, topic, available_at)
		SELECT gen_random_uuid(), CASE WHEN g <= 200000 THEN 'other' ELSE 'mine' END, now() - make_interval(secs => 300000 - g)
		FROM generate_series(1, 200050) g`); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"bad table;", strings.Repeat("t", 48)} {
		var ce *outbox.ConfigError
		if _, err := postgres.TopicIndexSQL(bad); !errors.As(err, &ce) {
			t.Errorf("TopicIndexSQL(%q): %v, want a ConfigError", bad, err)
		}
	}
	create, err := postgres.TopicIndexSQL(e.table)
	if err != nil {
		t.Fatal(err)
	}
	indexes := func() []string {
		rows, err := admin.Query(`SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = $1::regclass ORDER BY 1`, e.table)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var idx []string
		for rows.Next() {
			var s string
			rows.Scan(&s)
			idx = append(idx, s)
		}
		return idx
	}
	before := indexes()
	for _, q := range []string{create, `ANALYZE ` + e.table} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
	}
	if after := indexes(); !slices.Equal(before, after) {
		t.Errorf("TopicIndexSQL on a migrated table: indexes %v, then %v", before, after)
	}
	topicIdx := e.ob.Table().Name + "_topic_claim_idx"
	one, three := pgsql.ClaimSettleSQL(e.ob.Table(), 1, false), pgsql.ClaimSettleSQL(e.ob.Table(), 3, false)
	for _, c := range []struct {
		name  string
		nodes []planNode
		merge bool // several topics: one Sort, of each topic's first rows
	}{
		{"one topic", nodesOf(t, planOf(t, admin, `EXPLAIN (FORMAT JSON) `+one, "mine", 100, 30.0, 10, "{}", "{}", 0.0)), false},
		{"one topic, generic", nodesOf(t, genericPlan(t, one, `'mine', 100, 30, 10, '{}', '{}', 0`, "(FORMAT JSON)")), false},
		{"three rare topics", nodesOf(t, planOf(t, admin, `EXPLAIN (FORMAT JSON) `+three, "{mine,none,nil}", 100, 30.0, 10, "{}", "{}", 0.0)), true},
		{"three topics, generic", nodesOf(t, genericPlan(t, three, `'{mine,other,none}', 100, 30, 10, '{}', '{}', 0`, "(FORMAT JSON)")), true},
	} {
		var idx []string
		sorts := 0
		for _, n := range c.nodes {
			if n.Type == "Sort" {
				sorts++
				// The merge sorts the LATERAL subquery's rows, each
				// topic's at most limit: Nested Loop over unnest.
				if !c.merge || len(n.Plans) != 1 || n.Plans[0].Type != "Nested Loop" {
					t.Errorf("%s: the plan sorts more than each topic's first rows: %+v", c.name, c.nodes)
				}
			}
			if n.Index != "" {
				idx = append(idx, n.Index)
			}
		}
		if c.merge && sorts != 1 {
			t.Errorf("%s: %d sorts, want the merge: %+v", c.name, sorts, c.nodes)
		}
		if !slices.Contains(idx, topicIdx) {
			t.Errorf("%s: the plan reads indexes %v, want the topic index", c.name, idx)
		}
	}
	// What the claims read, run: the topic's 50 rows from the topic index,
	// none filtered out, none of the other topic.
	for _, c := range []struct {
		topics int
		arg    string
	}{{1, "mine"}, {3, "{none,mine,nil}"}} {
		tx, err := admin.Begin()
		if err != nil {
			t.Fatal(err)
		}
		run := nodesOf(t, planOf(t, tx, `EXPLAIN (ANALYZE, FORMAT JSON) `+pgsql.ClaimSQL(e.ob.Table(), c.topics), c.arg, 100, 30.0, 10, 0.0))
		tx.Rollback()
		// EXPLAIN gives rows per loop, rounded: up to one more a loop.
		read, slack := 0.0, 0.0
		for _, n := range run {
			if n.Removed > 0 {
				t.Errorf("claim of %d topics, run: %+v", c.topics, run)
			}
			if n.Index == topicIdx {
				read += n.Rows * n.Loops
				slack += n.Loops
			}
		}
		if read < 50 || read > 50+slack {
			t.Errorf("claim of %d topics read %v rows from the topic index, want 50: %+v", c.topics, read, run)
		}
	}
	// And they claim them all.
	d := postgres.Dialect().(outboxdriver.RelayDialect)
	db := pgxtx.FromPool(pool(t))
	for _, topics := range [][]string{{"mine"}, {"none", "mine", "nil"}} {
		cs, _, err := d.Claim(context.Background(), db, e.ob.Table(), outboxdriver.ClaimParams{Topics: topics, Limit: 100, Lease: time.Minute, MaxAttempts: 5})
		if err != nil || len(cs) != 50 {
			t.Fatalf("claim of %v: %d rows, %v", topics, len(cs), err)
		}
		for i, c := range cs {
			if c.Topic != "mine" || i > 0 && c.CreatedAt.Before(cs[i-1].CreatedAt) {
				t.Fatalf("claimed %+v", c)
			}
		}
		if _, err := admin.Exec(`UPDATE ` + e.table + ` SET state = 'pending', available_at = now() - interval '1 hour' WHERE topic = 'mine'`); err != nil {
			t.Fatal(err)
		}
	}
}

// planNode is one node of an EXPLAIN (FORMAT JSON) plan.
type planNode struct {
	Type    string  `json:"Node Type"`
	Index   string  `json:"Index Name"`
	Rows    float64 `json:"Actual Rows"`
	Loops   float64 `json:"Actual Loops"`
	Removed float64 `json:"Rows Removed by Filter"`
	Plans   []planNode
}

// nodesOf returns every node of an EXPLAIN (FORMAT JSON) plan.
func nodesOf(t *testing.T, js string) []planNode {
	t.Helper()
	var top []struct{ Plan planNode }
	if err := json.Unmarshal([]byte(js), &top); err != nil || len(top) != 1 {
		t.Fatalf("explain json: %v\n%s", err, js)
	}
	var all []planNode
	var walk func(n planNode)
	walk = func(n planNode) {
		all = append(all, n)
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(top[0].Plan)
	return all
}

// TestLeaseReclaim: a claim whose relay died (never settles) comes back
// when its lease lapses, as the next attempt.
func TestLeaseReclaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	ids := publishN(t, e, pool(t), 1, outbox.Message{Topic: "t"})
	d := postgres.Dialect().(outboxdriver.RelayDialect)
	cs, _, err := d.Claim(context.Background(), pgxtx.FromPool(pool(t)), e.ob.Table(), outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: time.Second, MaxAttempts: 5})
	if err != nil || len(cs) != 1 {
		t.Fatalf("claim: %v %v", cs, err)
	}
	r := newRelay(t, e, outbox.RelayConfig{})
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	begin := time.Now()
	start(t, r)
	eventually(t, 10*time.Second, "reclaimed", func() bool { return rec.count() == 1 })
	if took := time.Since(begin); took < 500*time.Millisecond {
		t.Errorf("reclaimed after %v: before the lease lapsed", took)
	}
	if a := rec.attempts(ids[0]); a[0] != 2 {
		t.Errorf("attempt %v, want 2", a)
	}
}

// TestDedupDeliveredOnce: one dedup key published by two transactions is
// delivered once.
func TestDedupDeliveredOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	p := pool(t)
	publishN(t, e, p, 1, outbox.Message{Topic: "t", DedupKey: "once"})
	publishN(t, e, p, 1, outbox.Message{Topic: "t", DedupKey: "once"})
	r := newRelay(t, e, outbox.RelayConfig{})
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	start(t, r)
	eventually(t, 10*time.Second, "delivered", func() bool { return count(t, e.table, "") == 0 })
	time.Sleep(200 * time.Millisecond)
	if n := rec.count(); n != 1 {
		t.Errorf("%d deliveries, want 1", n)
	}
}

// TestKeepDeliveredAndPurge: kept delivered rows are purged by the janitor
// after their retention, dead rows are not; Purge by state and age; Stats.
func TestKeepDeliveredAndPurge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	r := newRelay(t, e, outbox.RelayConfig{KeepDelivered: 1500 * time.Millisecond, JanitorEvery: 100 * time.Millisecond})
	r.Handle("ok", func(ctx context.Context, d outbox.Delivery) error { return nil })
	r.Handle("bad", func(ctx context.Context, d outbox.Delivery) error { return outbox.DeadLetter(errors.New("no")) })
	p := pool(t)
	publishN(t, e, p, 3, outbox.Message{Topic: "ok"})
	publishN(t, e, p, 2, outbox.Message{Topic: "bad"})
	publishN(t, e, p, 4, outbox.Message{Topic: "later", Delay: time.Hour})
	run := start(t, r)
	eventually(t, 10*time.Second, "kept as delivered", func() bool { return count(t, e.table, `state = 'delivered'`) == 3 })
	eventually(t, 10*time.Second, "dead", func() bool { return count(t, e.table, `state = 'dead'`) == 2 })
	db := pgxtx.FromPool(p)
	stats, err := e.ob.Stats(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][4]int64{"ok": {0, 0, 3, 0}, "bad": {0, 0, 0, 2}, "later": {4, 0, 0, 0}}
	if len(stats) != 3 {
		t.Errorf("stats %+v", stats)
	}
	for _, s := range stats {
		if w := want[s.Topic]; [4]int64{s.Pending, s.Processing, s.Delivered, s.Dead} != w {
			t.Errorf("stats %+v, want %v", s, w)
		}
		if s.OldestPending != 0 {
			t.Errorf("%s: oldest due pending %v, want 0 (the pending ones are not due)", s.Topic, s.OldestPending)
		}
	}
	eventually(t, 10*time.Second, "janitor purged delivered", func() bool { return count(t, e.table, `state = 'delivered'`) == 0 })
	if n := count(t, e.table, `state = 'dead'`); n != 2 {
		t.Errorf("janitor touched dead rows: %d left", n)
	}
	run.stop(t)

	// Purge by state and age.
	if _, err := pgtest.Admin(t).Exec(`UPDATE ` + e.table + ` SET settled_at = now() - interval '2 hours' WHERE id = (SELECT id FROM ` + e.table + ` WHERE state = 'dead' ORDER BY id LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	if n, err := e.ob.Purge(context.Background(), db, outbox.PurgeOptions{States: []outbox.State{outbox.StateDelivered}}); err != nil || n != 0 {
		t.Errorf("purge delivered: %d %v", n, err)
	}
	if n, err := e.ob.Purge(context.Background(), db, outbox.PurgeOptions{States: []outbox.State{outbox.StateDead}, OlderThan: time.Hour}); err != nil || n != 1 {
		t.Errorf("purge dead older than 1h: %d %v, want 1", n, err)
	}
	if n, err := e.ob.Purge(context.Background(), db, outbox.PurgeOptions{}); err != nil || n != 1 {
		t.Errorf("purge all terminal: %d %v, want 1", n, err)
	}
	if _, err := e.ob.Purge(context.Background(), db, outbox.PurgeOptions{States: []outbox.State{outbox.StatePending}}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("purging pending: %v", err)
	}
	if n := count(t, e.table, ""); n != 4 {
		t.Errorf("%d rows left, want the 4 pending", n)
	}
}

// TestNotifyWakesRelay: with a one-minute poll, a publish is delivered within
// moments thanks to LISTEN/NOTIFY; after the listener's connection is
// terminated, the relay reconnects and wake-ups resume.
func TestNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	var logs logBuffer
	r := newRelay(t, e, outbox.RelayConfig{PollInterval: time.Minute, Logger: logs.logger()})
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	p := pool(t)
	start(t, r)
	listening := func() bool {
		return count(t, "pg_stat_activity", `application_name = 'oncommit-listener' AND query LIKE 'LISTEN%' AND backend_type = 'client backend' AND pid IN (SELECT pid FROM pg_stat_activity WHERE query LIKE '%`+e.schema+`%')`) == 1
	}
	eventually(t, 10*time.Second, "listener up", listening)
	publishN(t, e, p, 1, outbox.Message{Topic: "t"})
	eventually(t, 5*time.Second, "woken by NOTIFY", func() bool { return rec.count() == 1 })

	if _, err := pgtest.Admin(t).Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'oncommit-listener' AND query LIKE '%` + e.schema + `%'`); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "listener lost logged", func() bool { return strings.Contains(logs.String(), "listener lost") })
	eventually(t, 10*time.Second, "listener back", listening)
	publishN(t, e, p, 1, outbox.Message{Topic: "t"})
	eventually(t, 5*time.Second, "woken after reconnect", func() bool { return rec.count() == 2 })
}

// TestFrozenClaim: with a 500 ms command timeout, a claim on a backend
// stopped with SIGSTOP fails with an error wrapping
// context.DeadlineExceeded within timeout + 250 ms; after SIGCONT the relay
// recovers and delivers everything.
func TestFrozenClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var pid int
	if err := p.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	tr := &timedTrace{Trace: dialecttest.NewTrace()}
	db := &faultDB{inner: pgxtx.FromPool(p), fail: func(q string) error {
		if strings.Contains(q, "FOR UPDATE SKIP LOCKED") {
			tr.began.Store(time.Now().UnixNano())
		}
		return nil
	}}
	r, err := e.ob.Relay(db, fast(t, outbox.RelayConfig{CommandTimeout: 500 * time.Millisecond, PollInterval: 100 * time.Millisecond, Tracer: tr, Listen: outbox.ListenOff}))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	publishN(t, e, pool(t), 5, outbox.Message{Topic: "t"})
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("cannot stop backend %d: %v", pid, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	start(t, r)
	eventually(t, 5*time.Second, "a failed claim", func() bool { return tr.failed.Load() > 0 })
	if got := time.Duration(tr.firstFailAfter.Load()); got > 750*time.Millisecond {
		t.Errorf("claim failed after %v, want at most 750ms", got)
	}
	first := tr.ClaimErrors()[0]
	if !errors.Is(first, context.DeadlineExceeded) {
		t.Errorf("claim error %v does not wrap context.DeadlineExceeded", first)
	}
	resume()
	eventually(t, 20*time.Second, "recovered and delivered", func() bool { return rec.count() == 5 })
	eventually(t, 10*time.Second, "settled", func() bool { return count(t, e.table, "") == 0 })
}

// timedTrace measures how long a failed claim took.
type timedTrace struct {
	*dialecttest.Trace
	began          atomic.Int64
	failed         atomic.Int32
	firstFailAfter atomic.Int64
}

func (tt *timedTrace) TraceClaim(ctx context.Context, cs []outboxdriver.Claimed, err error) {
	if err != nil && tt.failed.Add(1) == 1 {
		tt.firstFailAfter.Store(time.Now().UnixNano() - tt.began.Load())
	}
	tt.Trace.TraceClaim(ctx, cs, err)
}

// TestPoisonMessageKillsProcess: a message whose handler kills its relay
// process every time runs exactly MaxAttempts times, then is dead-lettered at
// claim without running again. The relay runs as a child process
// (TestHelperRelay) that is SIGKILLed from its handler's START line.
func TestPoisonMessageKillsProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	ids := publishN(t, e, pool(t), 1, outbox.Message{Topic: "poison"})
	const maxAttempts = 3
	child := func() (*exec.Cmd, *bufio.Scanner) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRelay$", "-test.count=1")
		cmd.Env = append(os.Environ(), "OUTBOX_HELPER_RELAY=1", "OUTBOX_HELPER_URL="+pgtest.URL(t),
			"OUTBOX_HELPER_TABLE="+e.table, fmt.Sprint("OUTBOX_HELPER_MAX_ATTEMPTS=", maxAttempts))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, bufio.NewScanner(out)
	}
	runs := 0
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		cmd, out := child()
		line := ""
		for out.Scan() {
			if line = out.Text(); strings.HasPrefix(line, "START ") {
				break
			}
		}
		want := fmt.Sprintf("START %s %d", ids[0], attempt)
		if line != want {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child printed %q, want %q", line, want)
		}
		runs++
		cmd.Process.Signal(syscall.SIGKILL) // killed mid-handler
		cmd.Wait()
	}
	// One more relay process: the claim dead-letters the message before
	// any handler runs.
	cmd, out := child()
	lines := make(chan string, 16)
	go func() {
		for out.Scan() {
			lines <- out.Text()
		}
		close(lines)
	}()
	eventually(t, 15*time.Second, "dead-lettered at claim", func() bool { s, _, _ := rowState(t, e, ids[0]); return s == "dead" })
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	for l := range lines {
		if strings.HasPrefix(l, "START ") {
			t.Errorf("handler ran again after max attempts: %s", l)
		}
	}
	if _, attempts, lastErr := rowState(t, e, ids[0]); attempts != maxAttempts || !strings.Contains(lastErr, "max attempts") {
		t.Errorf("dead row: attempts %d, last error %q", attempts, lastErr)
	}
	if runs != maxAttempts {
		t.Errorf("handler ran %d times, want %d", runs, maxAttempts)
	}
}

// TestHelperRelay is the child process of TestPoisonMessageKillsProcess: a
// relay whose handler prints START <id> <attempt> and blocks.
func TestHelperRelay(t *testing.T) {
	if os.Getenv("OUTBOX_HELPER_RELAY") != "1" {
		return // not a child process: nothing to do
	}
	var maxAttempts int
	fmt.Sscan(os.Getenv("OUTBOX_HELPER_MAX_ATTEMPTS"), &maxAttempts)
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: os.Getenv("OUTBOX_HELPER_TABLE")})
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgxpool.New(context.Background(), os.Getenv("OUTBOX_HELPER_URL"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := ob.Relay(pgxtx.FromPool(p), outbox.RelayConfig{Lease: time.Second, PollInterval: 50 * time.Millisecond, MaxAttempts: maxAttempts})
	if err != nil {
		t.Fatal(err)
	}
	r.Handle("poison", func(ctx context.Context, d outbox.Delivery) error {
		fmt.Printf("START %s %d\n", d.ID, d.Attempt)
		os.Stdout.Sync()
		select {} // until killed
	})
	r.Run(context.Background())
}

// TestClaimCarriesSettles: a claim that carries successes deletes (or marks
// delivered) the fenced ones in the same statement, skips the stale ones,
// and never claims a row it settles.
func TestClaimCarriesSettles(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprint("keep=", keep), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, outbox.Config{})
			ids := publishN(t, e, pool(t), 3, outbox.Message{Topic: "t"})
			d := postgres.Dialect().(outboxdriver.RelayDialect)
			db := pgxtx.FromPool(pool(t))
			p := outboxdriver.ClaimParams{Topics: []string{"t"}, Limit: 2, Lease: time.Minute, MaxAttempts: 5}
			first, _, err := d.Claim(context.Background(), db, e.ob.Table(), p)
			if err != nil || len(first) != 2 {
				t.Fatalf("claim: %v %v", first, err)
			}
			p.Limit, p.KeepDelivered = 10, keep
			p.Done = []outboxdriver.Fence{{ID: first[0].ID, Attempts: 1}, {ID: first[1].ID, Attempts: 7}} // the second is stale
			claimed, done, err := d.Claim(context.Background(), db, e.ob.Table(), p)
			if err != nil {
				t.Fatal(err)
			}
			if len(done) != 1 || done[0] != p.Done[0] {
				t.Errorf("settled %v, want only %v", done, p.Done[0])
			}
			if len(claimed) != 1 || claimed[0].ID != ids[2] {
				t.Errorf("claimed %v, want only the third message", claimed)
			}
			wantFirst := "gone"
			if keep {
				wantFirst = "delivered"
			}
			if s, _, _ := rowState(t, e, first[0].ID); s != wantFirst {
				t.Errorf("settled row is %s, want %s", s, wantFirst)
			}
			if s, a, _ := rowState(t, e, first[1].ID); s != "processing" || a != 1 {
				t.Errorf("stale fence changed the row: %s attempts %d", s, a)
			}
		})
	}
}
