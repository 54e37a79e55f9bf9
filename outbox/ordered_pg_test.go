package outbox_test

import (
	"context"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// outboxSeqScan matches a sequential scan of the outbox table (not of
// outbox_keys).
var outboxSeqScan = regexp.MustCompile(`Seq Scan on outbox( |$)`)

// TestOrderedPlansUseIndexes: with 200,000 ordered messages (2,000 keys of
// 100, one head each, and a hot key's delivered history kept) the ordered
// claim reads heads from the claim index and runs from the key index, and
// the settle of runs, the skip of a head and the ordered publish find
// their rows by index: no sequential scan of the table.
func TestOrderedPlansUseIndexes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{OrderByKey: true})
	admin := pgtest.Admin(t)
	if _, err := admin.Exec(`INSERT INTO ` + e.table + ` (id, topic, message_key, key_seq, state, available_at)
		SELECT gen_random_uuid(), 't' || (g % 3), 'k' || (g / 100), g % 100 + 1,
		       CASE WHEN g % 100 = 0 THEN 'pending' ELSE 'blocked' END, now() - make_interval(secs => g)
		FROM generate_series(0, 199999) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`INSERT INTO ` + e.table + ` (id, topic, message_key, key_seq, state, settled_at)
		SELECT gen_random_uuid(), 't0', 'k0', -g, 'delivered', now() FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`INSERT INTO ` + e.table + `_keys (message_key, last_seq, live) SELECT 'k' || g, 100, 100 FROM generate_series(0, 1999) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`ANALYZE ` + e.table + `; ANALYZE ` + e.table + `_keys`); err != nil {
		t.Fatal(err)
	}
	id := outbox.NewID().String()
	tbl := e.ob.Table()
	ins, err := e.ob.PublishSQL(outbox.Message{Topic: "t0", Key: "k7"}, outbox.Message{Topic: "t1", Key: "k8"})
	if err != nil {
		t.Fatal(err)
	}
	for name, plan := range map[string]string{
		"claim one":       explainPlan(t, pgsql.OrderedClaimSQL(tbl, 1, false), "t0", 100, 30.0, 10, "{"+id+"}", "{1}", "{t0}", 100),
		"claim":           explainPlan(t, pgsql.OrderedClaimSQL(tbl, 2, false), "{t0,t1}", 100, 30.0, 10, "{}", "{}", "{t0,t1}", 100),
		"settle run":      explainPlan(t, pgsql.SettleRunsSQL(tbl, false), "{"+id+"}", "{1}", "{k0}", "{NULL}", "{0}", "{0}", "{NULL}", "{NULL}", "{f}", "{"+id+"}", "{1}", "{1}"),
		"skip head":       explainPlan(t, pgsql.SkipHeadSQL(tbl), "k0", ""),
		"skip head by id": explainPlan(t, pgsql.SkipHeadSQL(tbl), "k0", id),
		"redrive by ids":  explainPlan(t, pgsql.RedriveOrderedIDsSQL(tbl), "{"+id+"}"),
		"publish":         explainPlan(t, ins.Query, ins.Args...),
	} {
		if outboxSeqScan.MatchString(plan) {
			t.Errorf("%s plan scans the table:\n%s", name, plan)
		}
		if name != "publish" && !regexp.MustCompile(`outbox_key_seq_idx`).MatchString(plan) {
			t.Errorf("%s plan does not use the key index:\n%s", name, plan)
		}
		t.Logf("%s:\n%s", name, plan)
	}
}

// TestOrderedClaimReadsOnlyItsRuns: the ordered claim reads, of the
// blocked messages behind its heads, the run members it returns (and the
// one that cuts a run), not every blocked message of each key up to the
// run budget. 50 keys of 100 messages (a head and 99 blocked each) and a
// budget of 100: the claim's scans of the key index return about 100
// rows (a range scan of up to the budget per head returned 4,950), and
// the claim returns 50 heads with runs of 2, each its key's next two.
func TestOrderedClaimReadsOnlyItsRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{OrderByKey: true})
	admin := pgtest.Admin(t)
	if _, err := admin.Exec(`INSERT INTO ` + e.table + ` (id, topic, message_key, key_seq, state, available_at)
		SELECT gen_random_uuid(), 't0', 'k' || (g / 100), g % 100 + 1,
		       CASE WHEN g % 100 = 0 THEN 'pending' ELSE 'blocked' END, now() - interval '1 minute'
		FROM generate_series(0, 4999) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`INSERT INTO ` + e.table + `_keys (message_key, last_seq, live) SELECT 'k' || g, 100, 100 FROM generate_series(0, 49) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`ANALYZE ` + e.table + `; ANALYZE ` + e.table + `_keys`); err != nil {
		t.Fatal(err)
	}
	tx, err := admin.Begin()
	if err != nil {
		t.Fatal(err)
	}
	run := nodesOf(t, planOf(t, tx, `EXPLAIN (ANALYZE, FORMAT JSON) `+pgsql.OrderedClaimSQL(e.ob.Table(), 1, false),
		"t0", 100, 30.0, math.MaxInt32, "{}", "{}", "{t0}", 100))
	tx.Rollback()
	// EXPLAIN gives rows per loop, rounded: up to one more a loop.
	read, slack := 0.0, 0.0
	for _, n := range run {
		if strings.HasSuffix(n.Index, "key_seq_idx") {
			read += n.Rows * n.Loops
			slack += n.Loops
		}
	}
	if read < 100 || read > 100+slack {
		t.Errorf("the claim read %v rows from the key index, want 100 (+%v): %+v", read, slack, run)
	}
	d := postgres.Dialect().(outboxdriver.OrderedDialect)
	cs, _, err := d.ClaimOrdered(context.Background(), pgxtx.FromPool(pool(t)), e.ob.Table(),
		outboxdriver.ClaimParams{Topics: []string{"t0"}, Limit: 100, Lease: time.Minute, MaxAttempts: 5}, 100)
	if err != nil || len(cs) != 50 {
		t.Fatalf("claimed %d heads, %v; want 50", len(cs), err)
	}
	for _, c := range cs {
		if len(c.Run) != 2 || c.Run[0].KeySeq != c.KeySeq+1 || c.Run[1].KeySeq != c.KeySeq+2 || c.Run[0].Key != c.Key || c.Run[1].Key != c.Key {
			t.Errorf("head %s seq %d: run %+v, want its key's next two", c.Key, c.KeySeq, c.Run)
		}
	}
}

// TestOrderedMigrationDown: 0005's down file keeps the messages (blocked
// ones become pending) and restores the former schema, on a table in its
// own schema with a custom name; its up file then applies again.
func TestOrderedMigrationDown(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	table := schema + ".events"
	admin := pgtest.Admin(t)
	if err := postgres.Migrate(context.Background(), admin, table); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: table, OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := admin.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.PublishBatch(context.Background(), sqltx.From(tx), []outbox.Message{{Topic: "t", Key: "k"}, {Topic: "t", Key: "k"}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	migs, err := migrations.Load(migrations.Postgres(), table)
	if err != nil {
		t.Fatal(err)
	}
	var m migrations.Migration
	for _, x := range migs {
		if x.Version == 5 {
			m = x
		}
	}
	if m.Version != 5 {
		t.Fatal("no migration 5")
	}
	if _, err := admin.Exec(m.Down); err != nil {
		t.Fatalf("down: %v", err)
	}
	if n := count(t, table, "state = 'pending'"); n != 2 {
		t.Errorf("%d pending messages after the down migration, want 2", n)
	}
	if _, err := admin.Exec(`INSERT INTO ` + table + ` (id, topic, state) VALUES (gen_random_uuid(), 't', 'blocked')`); err == nil {
		t.Error("the down migration left state 'blocked' allowed")
	}
	var keys *string
	if err := admin.QueryRow(`SELECT to_regclass($1)::text`, table+"_keys").Scan(&keys); err != nil || keys != nil {
		t.Errorf("keys table after the down migration: %v %v", keys, err)
	}
	if _, err := admin.Exec(m.Up); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if err := admin.QueryRow(`SELECT to_regclass($1)::text`, table+"_keys").Scan(&keys); err != nil || keys == nil || *keys != table+"_keys" {
		t.Errorf("keys table after the up migration: %v %v", keys, err)
	}
}
