package outbox_test

import (
	"strings"
	"testing"
	"time"

	_ "github.com/oncommit/oncommit/dialect/postgres" // fills in pgsql
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// TestInspectPlansUseIndexes: on a table of 200,000 rows, most delivered
// and a few hundred dead, the operators' listings, counts and actions read
// through an index, never the whole table: dead messages through the dead
// index (migration 0006), one message by the primary key, a topic's live
// messages through the claim index.
func TestInspectPlansUseIndexes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, outbox.Config{})
	admin := pgtest.Admin(t)
	if _, err := admin.Exec(`INSERT INTO ` + e.table + ` (id, topic, state, available_at, settled_at, last_error)
		SELECT gen_random_uuid(), 't' || (g % 10),
		       CASE WHEN g % 500 = 0 THEN 'dead' WHEN g % 50 = 0 THEN 'pending' ELSE 'delivered' END,
		       now() - make_interval(secs => g), CASE WHEN g % 50 <> 0 OR g % 500 = 0 THEN now() - make_interval(secs => g) END,
		       CASE WHEN g % 500 = 0 THEN 'boom ' || g END
		FROM generate_series(1, 200000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`ANALYZE ` + e.table); err != nil {
		t.Fatal(err)
	}
	tbl := e.ob.Table()
	dead := []outbox.State{outbox.StateDead}
	id := outbox.NewID()
	plan := func(q string, args []any) string { return explainPlan(t, q, args...) }
	list := func(f outbox.Filter) string { return plan(pgsql.ListSQL(tbl, f, 51, false)) }
	act := func(a outbox.Action, f outbox.Filter) string { return plan(pgsql.ActSQL(tbl, a, f)) }
	count := func(f outbox.Filter) string { return plan(pgsql.CountSQL(tbl, f)) }
	for _, c := range []struct {
		name, plan, index string
	}{
		{"list dead", list(outbox.Filter{States: dead}), "outbox_dead_idx"},
		{"list dead, next page", list(outbox.Filter{States: dead, After: id}), "outbox_dead_idx"},
		{"list dead of a topic with an error", list(outbox.Filter{States: dead, Topic: "t0", ErrorContains: "boom"}), "outbox_dead_idx"},
		{"list dead settled in the last hour", list(outbox.Filter{States: dead, SettledFrom: time.Now().Add(-time.Hour)}), ""},
		{"count dead", count(outbox.Filter{States: dead}), "outbox_dead_idx"},
		{"get", plan(pgsql.ListSQL(tbl, outbox.Filter{IDs: []outbox.ID{id}}, 1, true)), "outbox_pkey"},
		{"list all", list(outbox.Filter{}), "outbox_pkey"},
		{"list a topic's pending", list(outbox.Filter{States: []outbox.State{outbox.StatePending}, Topic: "t1"}), ""},
		{"redrive dead of a topic", act(outbox.ActRedrive, outbox.Filter{Topic: "t1"}), "outbox_dead_idx"},
		{"redrive ids", act(outbox.ActRedrive, outbox.Filter{IDs: []outbox.ID{id, outbox.NewID()}}), "outbox_dead_idx"},
		{"delete ids", act(outbox.ActDelete, outbox.Filter{IDs: []outbox.ID{id, outbox.NewID()}}), "outbox_pkey"},
		{"delete dead", act(outbox.ActDelete, outbox.Filter{States: dead}), "outbox_dead_idx"},
		{"retry a topic", act(outbox.ActRetry, outbox.Filter{Topic: "t1"}), "outbox_topic_claim_idx"},
		{"redrive of ordered dead messages, their pick", plan(pgsql.DeadOrderedSQL(tbl, outbox.Filter{Topic: "t1"})), ""},
		{"count of a purge (its confirmation)", count(outbox.Filter{States: []outbox.State{outbox.StateDead, outbox.StateDelivered}, SettledTo: time.Now().Add(-7 * 24 * time.Hour)}), "outbox_settled_idx"},
	} {
		if strings.Contains(c.plan, "Seq Scan on outbox") {
			t.Errorf("%s plan scans the table:\n%s", c.name, c.plan)
		}
		if !strings.Contains(c.plan, "Index") || !strings.Contains(c.plan, c.index) {
			t.Errorf("%s plan does not use %q:\n%s", c.name, c.index, c.plan)
		}
	}
}
