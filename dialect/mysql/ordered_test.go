package mysql_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/mysql/internal/mysqltest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// TestCheckOrderedNeedsMigrations: CheckOrdered (a relay's start-up check
// with OrderByKey) passes on a migrated table and reports
// ErrSchemaMismatch without the keys table of 0006 or the column of 0005.
func TestCheckOrderedNeedsMigrations(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	od := mysql.Dialect().(outboxdriver.OrderedDialect)
	ctx := context.Background()
	tbl, err := outboxdriver.ParseTable(e.table)
	if err != nil {
		t.Fatal(err)
	}
	db := sqltx.FromDB(e.pool)
	if err := od.CheckOrdered(ctx, db, tbl); err != nil {
		t.Fatalf("migrated table: %v", err)
	}
	admin := mysqltest.Admin(t)
	if _, err := admin.Exec("DROP TABLE " + e.table + "_keys"); err != nil {
		t.Fatal(err)
	}
	if err := od.CheckOrdered(ctx, db, tbl); !errors.Is(err, outboxdriver.ErrSchemaMismatch) {
		t.Errorf("without the keys table: %v, want ErrSchemaMismatch", err)
	}
	if _, err := admin.Exec("ALTER TABLE " + e.table + " DROP KEY outbox_key_seq_idx, DROP COLUMN key_seq"); err != nil {
		t.Fatal(err)
	}
	if err := od.CheckOrdered(ctx, db, tbl); !errors.Is(err, outboxdriver.ErrSchemaMismatch) {
		t.Errorf("without key_seq: %v, want ErrSchemaMismatch", err)
	}
}

// spi drives an ordered Outbox's table through the dialect's SPI, as a
// relay and an operator do.
type spi struct {
	*env
	db outboxdriver.DB
	od outboxdriver.OrderedDialect
}

func newSPI(t *testing.T) *spi {
	t.Helper()
	e := newEnv(t, nil, outbox.Config{OrderByKey: true})
	return &spi{e, sqltx.FromDB(e.pool), mysql.Dialect().(outboxdriver.OrderedDialect)}
}

// claim claims up to 10 heads of topic x with runs of at most run.
func (s *spi) claim(t *testing.T, run int) []outboxdriver.Claimed {
	t.Helper()
	cs, _, err := s.od.ClaimOrdered(context.Background(), s.db, s.ob.Table(),
		outboxdriver.ClaimParams{Topics: []string{"x"}, Limit: 10, Lease: time.Minute, MaxAttempts: 100}, run)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func (s *spi) settle(t *testing.T, runs ...outboxdriver.RunOutcome) []outboxdriver.Fence {
	t.Helper()
	applied, busy, err := s.od.SettleRuns(context.Background(), s.db, s.ob.Table(), outboxdriver.SettleParams{}, runs)
	if err != nil || len(busy) > 0 {
		t.Fatalf("settle: busy %v, %v", busy, err)
	}
	return applied
}

// kill claims key K's head alone and settles it dead, halting the key or
// not.
func (s *spi) kill(t *testing.T, halt bool) {
	t.Helper()
	cs := s.claim(t, 0)
	if len(cs) != 1 {
		t.Fatalf("claimed %v, want K's head", cs)
	}
	f := outboxdriver.Fence{ID: cs[0].ID, Attempts: cs[0].Attempts}
	s.settle(t, outboxdriver.RunOutcome{Head: f, Key: "K", Halt: halt,
		Failed: outboxdriver.Settlement{Fence: f, Kind: outboxdriver.SettleDead, Error: "poison"}})
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
// published before the redrive (last_seq grows past it, so a later
// publish comes after it); a halted head keeps its place and is delivered
// first.
func TestRedrivePlace(t *testing.T) {
	t.Parallel()
	x := outbox.Message{Topic: "x", Key: "K"}
	for _, c := range []struct {
		name string
		// history publishes K's messages m1, m2..., kills some and
		// redrives with redrive.
		history func(t *testing.T, s *spi, redrive func()) (m []outbox.ID)
		want    string // the order of delivery
	}{
		{"continue", func(t *testing.T, s *spi, redrive func()) []outbox.ID {
			m := s.publish(t, x, x, x, x)
			s.kill(t, false) // m1; m2 is the head
			redrive()
			return m
		}, "m2 m3 m4 m1"},
		{"halted head", func(t *testing.T, s *spi, redrive func()) []outbox.ID {
			m := s.publish(t, x, x, x, x)
			s.kill(t, false) // m1 under ContinueKey
			s.kill(t, true)  // m2 halts K
			redrive()
			return append(m, s.publish(t, x)...)
		}, "m2 m3 m4 m1 m5"},
	} {
		for _, via := range []string{"Redrive", "Act"} {
			for _, run := range []int{1, 10} {
				t.Run(fmt.Sprintf("%s/%s/run=%d", c.name, via, run), func(t *testing.T) {
					t.Parallel()
					s := newSPI(t)
					ctx := context.Background()
					redrive := func() {
						var err error
						if via == "Redrive" {
							_, err = s.ob.Redrive(ctx, s.db, "")
						} else {
							_, err = s.ob.Act(ctx, s.db, outbox.ActRedrive, outbox.Filter{States: []outbox.State{outbox.StateDead}},
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
					if n := count(t, s.table, ""); n != 0 {
						t.Errorf("%d messages left", n)
					}
					// m1 took one more number when it was redriven.
					if n := count(t, s.table+"_keys", "live = 0 AND halted_seq IS NULL AND last_seq = ?", len(m)+1); n != 1 {
						t.Errorf("key K's row is off: want live 0, not halted, last_seq %d", len(m)+1)
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
	t.Parallel()
	for _, failed := range []bool{false, true} {
		t.Run(fmt.Sprintf("failed=%v", failed), func(t *testing.T) {
			t.Parallel()
			s := newSPI(t)
			ids := s.publish(t, outbox.Message{Topic: "x", Key: "K"}, outbox.Message{Topic: "x", Key: "J"})
			if cs := s.claim(t, 10); len(cs) != 2 {
				t.Fatalf("claimed %v", cs)
			}
			run := outboxdriver.RunOutcome{Head: outboxdriver.Fence{ID: ids[0], Attempts: 1}, Key: "K", Done: []outbox.ID{ids[0], ids[1]}}
			if failed {
				run.Done = run.Done[:1]
				run.Failed = outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: ids[1], Attempts: 2}, Kind: outboxdriver.SettleRetry, Error: "boom"}
			}
			if applied := s.settle(t, run); len(applied) != 1 {
				t.Fatalf("applied %v", applied)
			}
			if n := count(t, s.table, "id = ? AND state = 'processing' AND attempts = 1", ids[1].String()); n != 1 {
				t.Error("J's head, claimed elsewhere, was changed by K's settle")
			}
			if n := count(t, s.table, "id = ?", ids[0].String()); n != 0 {
				t.Error("K's head was not settled")
			}
		})
	}
}

// TestSettleRunsLocksOnlyItsKeys (I6): a settle of runs of most keys of a
// small keys table (16 of 20), one of them held by an open publishing transaction,
// writes the others at once and returns the held key's run as busy: it
// locks key rows one by one through the primary key, never by a scan that
// passes (and waits for) the held row, in the SKIP LOCKED lock and in the
// update of the key rows alike.
func TestSettleRunsLocksOnlyItsKeys(t *testing.T) {
	t.Parallel()
	s := newSPI(t)
	var keys []string
	var msgs []outbox.Message
	for i := range 20 {
		keys = append(keys, string(rune('a'+i)))
		msgs = append(msgs, outbox.Message{Topic: "x", Key: keys[i]})
	}
	ids := s.publish(t, msgs...)
	if _, err := mysqltest.Admin(t).Exec("ANALYZE TABLE " + s.table + "_keys"); err != nil {
		t.Fatal(err)
	}
	cs, _, err := s.od.ClaimOrdered(context.Background(), s.db, s.ob.Table(),
		outboxdriver.ClaimParams{Topics: []string{"x"}, Limit: 20, Lease: time.Minute, MaxAttempts: 100}, 0)
	if err != nil || len(cs) != len(keys) {
		t.Fatalf("claimed %v, %v", cs, err)
	}
	tx := s.begin(t)
	if _, err := s.ob.Publish(context.Background(), sqltx.From(tx), outbox.Message{Topic: "x", Key: "b"}); err != nil {
		t.Fatal(err)
	}
	var runs []outboxdriver.RunOutcome
	for i, k := range keys[:16] {
		runs = append(runs, outboxdriver.RunOutcome{Head: outboxdriver.Fence{ID: ids[i], Attempts: 1}, Key: k, Done: []outbox.ID{ids[i]}})
	}
	// A guard against a hang, not a measure: InnoDB's lock wait timeout is longer.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	applied, busy, err := s.od.SettleRuns(ctx, s.db, s.ob.Table(), outboxdriver.SettleParams{}, runs)
	if err != nil {
		t.Fatalf("settle beside the open publish of key b: %v", err)
	}
	if len(applied) != 15 || !slices.Equal(busy, []int{1}) {
		t.Errorf("applied %v busy %v, want every run but b's (1) applied, and b's busy", applied, busy)
	}
	if n := count(t, s.table, "message_key < 'q' AND message_key <> 'b'"); n != 0 {
		t.Errorf("%d messages of the settled keys left", n)
	}
}
