package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// TestUnorderedSQL pins the statements an Outbox without OrderByKey sends,
// as they were before ordered delivery came to SQLite, and the ordered
// publish's state column.
func TestUnorderedSQL(t *testing.T) {
	plain, err := outbox.New(sqlite.Dialect(), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ordered, err := outbox.New(sqlite.Dialect(), outbox.Config{OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []outbox.Message{{Topic: "t", Key: "k"}, {Topic: "t"}}
	for _, c := range []struct {
		name string
		ob   *outbox.Outbox
		msgs []outbox.Message
		want string
	}{
		{"plain keyed", plain, msgs, `INSERT INTO "outbox" (id, topic, message_key) VALUES (?, ?, ?), (?, ?, ?)`},
		{"plain dedup", plain, []outbox.Message{{Topic: "t", Key: "k", DedupKey: "d"}},
			`INSERT INTO "outbox" (id, topic, message_key, dedup_key) VALUES (?, ?, ?, ?) ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING RETURNING id`},
		{"ordered mixed", ordered, msgs, `INSERT INTO "outbox" (id, topic, message_key, state) VALUES (?, ?, ?, 'blocked'), (?, ?, ?, 'pending')`},
		{"ordered unkeyed", ordered, []outbox.Message{{Topic: "t"}}, `INSERT INTO "outbox" (id, topic) VALUES (?, ?)`},
	} {
		st, err := c.ob.PublishSQL(c.msgs...)
		if err != nil {
			t.Fatal(err)
		}
		if st.Query != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, st.Query, c.want)
		}
	}
	const claim = `UPDATE "outbox" SET
    state        = CASE WHEN attempts - attempts_base >= ?4 THEN 'dead' ELSE 'processing' END,
    settled_at   = CASE WHEN attempts - attempts_base >= ?4 THEN CAST(unixepoch('subsec') * 1000 AS INTEGER) END,
    last_error   = CASE WHEN attempts - attempts_base >= ?4 THEN 'max attempts reached' ELSE last_error END,
    available_at = CASE WHEN attempts - attempts_base >= ?4 THEN available_at ELSE CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?3 END,
    attempts     = CASE WHEN attempts - attempts_base >= ?4 THEN attempts ELSE attempts + 1 END
WHERE rowid IN (
    SELECT rowid FROM "outbox"
    WHERE state IN ('pending', 'processing') AND available_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)
      AND topic IN (SELECT value FROM json_each(?1))
    ORDER BY available_at, id
    LIMIT ?2)
RETURNING id, topic, coalesce(message_key, ''), payload, headers, attempts, attempts_base, state, created_at`
	if got := sqlite.ClaimSQL(outboxdriver.Table{Name: "outbox"}); got != claim {
		t.Errorf("the claim changed:\n%s", got)
	}
}

// applyExcept applies the SQLite migrations but version skip by hand, and
// records them as sqlite.Migrate does.
func applyExcept(t *testing.T, db *sql.DB, skip int) {
	t.Helper()
	migs, err := migrations.Load(migrations.SQLite(), "outbox")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE "oncommit_migrations" (table_name text NOT NULL, version integer NOT NULL, name text NOT NULL, PRIMARY KEY (table_name, version))`); err != nil {
		t.Fatal(err)
	}
	for _, m := range migs {
		if m.Version == skip {
			continue
		}
		if _, err := db.Exec(m.Up); err != nil {
			t.Fatalf("%04d: %v", m.Version, err)
		}
		if _, err := db.Exec(`INSERT INTO "oncommit_migrations" VALUES ('outbox', ?, ?)`, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOrderedMigrationAfterDeadIndex: on a database migrated before
// ordered delivery existed (0001-0003 and 0005), sqlite.Migrate applies
// 0004: the messages are kept as they were, the dead index survives the
// rebuild, ordered publishing works; its down file keeps the messages
// (blocked ones become pending) and drops what it added.
func TestOrderedMigrationAfterDeadIndex(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "m.db")+dsnOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	applyExcept(t, db, 4)
	if _, err := db.Exec(`INSERT INTO outbox (id, topic, message_key, payload, state, attempts, attempts_base, settled_at, last_error) VALUES
		('00000000-0000-0000-0000-000000000001', 'x', 'k', '{"a":1}', 'dead', 3, 1, 5, 'boom'),
		('00000000-0000-0000-0000-000000000002', 'x', NULL, NULL, 'pending', 0, 0, NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := sqlite.Migrate(ctx, db, ""); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `outbox WHERE id = '00000000-0000-0000-0000-000000000001' AND topic = 'x' AND message_key = 'k' AND payload = '{"a":1}'
		AND state = 'dead' AND attempts = 3 AND attempts_base = 1 AND settled_at = 5 AND last_error = 'boom' AND key_seq IS NULL`); n != 1 {
		t.Error("the dead message changed in the rebuild")
	}
	if n := count(t, db, `sqlite_master WHERE name IN ('outbox_claim_idx', 'outbox_dedup_idx', 'outbox_settled_idx', 'outbox_dead_idx', 'outbox_key_seq_idx', 'outbox_keys', 'outbox_seq_trg')`); n != 7 {
		t.Errorf("%d of the 7 indexes, tables and triggers after 0004", n)
	}
	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{{Topic: "x", Key: "k"}, {Topic: "x", Key: "k"}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `outbox WHERE key_seq IS NOT NULL`); n != 2 {
		t.Fatalf("%d ordered messages numbered, want 2", n)
	}
	migs, err := migrations.Load(migrations.SQLite(), "outbox")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range migs {
		if m.Version == 4 {
			if _, err := db.Exec(m.Down); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := count(t, db, `outbox WHERE state = 'pending'`); n != 3 {
		t.Errorf("%d pending messages after 0004's down, want 3 (the blocked one too)", n)
	}
	if n := count(t, db, `sqlite_master WHERE name IN ('outbox_key_seq_idx', 'outbox_keys', 'outbox_seq_trg')`); n != 0 {
		t.Errorf("%d of 0004's objects left after its down", n)
	}
	if _, err := db.Exec(`SELECT key_seq FROM outbox`); err == nil {
		t.Error("key_seq is still there after 0004's down")
	}
}

// TestCheckOrdered: a relay of an ordered Outbox refuses to start on a
// table whose numbering trigger is missing (ordered messages would stay
// blocked, unnumbered, for ever).
func TestCheckOrdered(t *testing.T) {
	db, _ := open(t)
	od := sqlite.Dialect().(outboxdriver.OrderedDialect)
	tbl := outboxdriver.Table{Name: "outbox"}
	ctx := context.Background()
	if err := od.CheckOrdered(ctx, sqltx.FromDB(db), tbl); err != nil {
		t.Fatalf("migrated table: %v", err)
	}
	if _, err := db.Exec(`DROP TRIGGER outbox_seq_trg`); err != nil {
		t.Fatal(err)
	}
	if err := od.CheckOrdered(ctx, sqltx.FromDB(db), tbl); !errors.Is(err, outboxdriver.ErrSchemaMismatch) {
		t.Errorf("without the trigger: %v, want ErrSchemaMismatch", err)
	}
}

// TestOrderedPlans: the run read, the promotion and the head check walk the
// key index, never the whole table, so they stay bounded at any backlog.
func TestOrderedPlans(t *testing.T) {
	db, _ := open(t)
	tbl := outboxdriver.Table{Name: "outbox"}
	done, failed := sqlite.RunSettleSQL(tbl, false)
	for name, c := range map[string]struct {
		q    string
		args []any
	}{
		"runs":    {sqlite.RunSQL(tbl), []any{`[["a","k",1]]`, `["x"]`, 10, false}},
		"promote": {sqlite.PromoteSQL(tbl), []any{`["k"]`}},
		"skip":    {sqlite.SkipHeadSQL(tbl), []any{"k", ""}},
		"done":    {done, []any{`[["a", 1]]`}},
		"failed":  {failed, []any{`[]`}},
		"redrive": {sqlite.RedriveKeysSQL(tbl), []any{`[]`}},
	} {
		rows, err := db.Query(`EXPLAIN QUERY PLAN `+c.q, c.args...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		text := strings.Join(plan, "\n")
		for _, line := range plan {
			if strings.HasPrefix(line, "SCAN outbox") || strings.HasPrefix(line, "SCAN b") || strings.HasPrefix(line, "SCAN h") || strings.HasPrefix(line, "SCAN x") || strings.HasPrefix(line, "SCAN o") {
				t.Errorf("%s scans the outbox table:\n%s", name, text)
			}
		}
		t.Logf("%s:\n%s", name, text)
	}
}

// spi drives an ordered Outbox's table through the dialect's SPI, as a
// relay and an operator do.
type spi struct {
	db  *sql.DB
	ob  *outbox.Outbox
	od  outboxdriver.OrderedDialect
	tbl outboxdriver.Table
}

func newSPI(t *testing.T) *spi {
	t.Helper()
	db, _ := open(t)
	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	return &spi{db, ob, sqlite.Dialect().(outboxdriver.OrderedDialect), ob.Table()}
}

// claim claims up to 10 heads of topic x with runs of at most run.
func (s *spi) claim(t *testing.T, run int) []outboxdriver.Claimed {
	t.Helper()
	cs, _, err := s.od.ClaimOrdered(context.Background(), sqltx.FromDB(s.db), s.tbl,
		outboxdriver.ClaimParams{Topics: []string{"x"}, Limit: 10, Lease: time.Minute, MaxAttempts: 100}, run)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func (s *spi) settle(t *testing.T, runs ...outboxdriver.RunOutcome) []outboxdriver.Fence {
	t.Helper()
	applied, busy, err := s.od.SettleRuns(context.Background(), sqltx.FromDB(s.db), s.tbl, outboxdriver.SettleParams{}, runs)
	if err != nil || len(busy) > 0 {
		t.Fatalf("settle: busy %v, %v", busy, err)
	}
	return applied
}

// kill claims key K's head alone and settles it dead, halting the key or
// not, and returns its id.
func (s *spi) kill(t *testing.T, halt bool) outbox.ID {
	t.Helper()
	cs := s.claim(t, 0)
	if len(cs) != 1 {
		t.Fatalf("claimed %v, want K's head", cs)
	}
	f := outboxdriver.Fence{ID: cs[0].ID, Attempts: cs[0].Attempts}
	s.settle(t, outboxdriver.RunOutcome{Head: f, Key: "K", Halt: halt,
		Failed: outboxdriver.Settlement{Fence: f, Kind: outboxdriver.SettleDead, Error: "poison"}})
	return f.ID
}

// deliverAll claims with runs of at most run and settles every run done
// until nothing is left to claim, and returns the ids in delivery order.
func (s *spi) deliverAll(t *testing.T, run int) []outbox.ID {
	t.Helper()
	var order []outbox.ID
	for range 20 {
		cs := s.claim(t, run)
		if len(cs) == 0 {
			return order
		}
		var runs []outboxdriver.RunOutcome
		for _, c := range cs {
			ids := []outbox.ID{c.ID}
			for _, m := range c.Run {
				ids = append(ids, m.ID)
			}
			order = append(order, ids...)
			runs = append(runs, outboxdriver.RunOutcome{Head: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}, Key: c.Key, Done: ids})
		}
		s.settle(t, runs...)
	}
	t.Fatal("the delivery did not end")
	return nil
}

// TestRedrivePlace (I5): where a redriven message re-enters its key
// depends on the key's messages and the redrive, not on the run length
// the relay claims with, through Redrive and through Act alike: a message
// dead under ContinueKey re-enters after every message of its key
// published before the redrive; a halted head keeps its place and is
// delivered first.
func TestRedrivePlace(t *testing.T) {
	x := outbox.Message{Topic: "x", Key: "K"}
	for _, c := range []struct {
		name string
		// history publishes K's messages m1, m2..., kills some and
		// redrives with redrive.
		history func(t *testing.T, s *spi, redrive func()) (m []outbox.ID)
		want    string // the order of delivery
	}{
		{"continue", func(t *testing.T, s *spi, redrive func()) []outbox.ID {
			m := publish(t, s.db, s.ob, x, x, x, x)
			s.kill(t, false) // m1; m2 is the head
			redrive()
			return m
		}, "m2 m3 m4 m1"},
		{"halted head", func(t *testing.T, s *spi, redrive func()) []outbox.ID {
			m := publish(t, s.db, s.ob, x, x, x, x)
			s.kill(t, false) // m1 under ContinueKey
			s.kill(t, true)  // m2 halts K
			redrive()
			return append(m, publish(t, s.db, s.ob, x)...)
		}, "m2 m3 m4 m1 m5"},
	} {
		for _, via := range []string{"Redrive", "Act"} {
			for _, run := range []int{1, 10} {
				t.Run(fmt.Sprintf("%s/%s/run=%d", c.name, via, run), func(t *testing.T) {
					s := newSPI(t)
					ctx := context.Background()
					redrive := func() {
						var err error
						if via == "Redrive" {
							_, err = s.ob.Redrive(ctx, sqltx.FromDB(s.db), "")
						} else {
							_, err = s.ob.Act(ctx, sqltx.FromDB(s.db), outbox.ActRedrive, outbox.Filter{States: []outbox.State{outbox.StateDead}},
								&outbox.ActOptions{Logger: slog.New(slog.DiscardHandler)})
						}
						if err != nil {
							t.Fatal(err)
						}
					}
					m := c.history(t, s, redrive)
					var got []string
					for _, id := range s.deliverAll(t, run) {
						got = append(got, fmt.Sprintf("m%d", slices.Index(m, id)+1))
					}
					if g := strings.Join(got, " "); g != c.want {
						t.Errorf("delivered %s, want %s", g, c.want)
					}
					if n := count(t, s.db, `outbox`); n != 0 {
						t.Errorf("%d messages left", n)
					}
				})
			}
		}
	}
}

// TestSettleRunsFenced (I2): SettleRuns changes a row only where the row
// still carries the run's fence, checked by the write itself: a run's
// head processing with its claimed attempts, a run member blocked. An
// outcome that names another claim's head (processing, not the run's)
// leaves it alone, as a success and as a failure.
func TestSettleRunsFenced(t *testing.T) {
	for _, failed := range []bool{false, true} {
		t.Run(fmt.Sprintf("failed=%v", failed), func(t *testing.T) {
			s := newSPI(t)
			ids := publish(t, s.db, s.ob, outbox.Message{Topic: "x", Key: "K"}, outbox.Message{Topic: "x", Key: "J"})
			if cs := s.claim(t, 10); len(cs) != 2 {
				t.Fatalf("claimed %v", cs)
			}
			k := outboxdriver.Fence{ID: ids[0], Attempts: 1}
			run := outboxdriver.RunOutcome{Head: k, Key: "K", Done: []outbox.ID{ids[0], ids[1]}}
			if failed {
				run.Done = run.Done[:1]
				run.Failed = outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: ids[1], Attempts: 2}, Kind: outboxdriver.SettleRetry, Error: "boom"}
			}
			if applied := s.settle(t, run); len(applied) != 1 {
				t.Fatalf("applied %v", applied)
			}
			if st, a := state(t, s.db, ids[1]); st != "processing" || a != 1 {
				t.Errorf("J's head, claimed elsewhere: %s attempts %d, want processing 1", st, a)
			}
			if st, _ := state(t, s.db, ids[0]); st != "gone" {
				t.Errorf("K's head: %s, want gone", st)
			}
		})
	}
}
