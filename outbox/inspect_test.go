package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/opfmt"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// TestInspectBadInputSendsNothing: every filter, page size and action the
// inspection API (Targets and ActOn included) refuses is a *FilterError
// naming the field, and no statement reaches the database (sqlmock
// expects none).
func TestInspectBadInputSendsNothing(t *testing.T) {
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	odb := sqltx.FromDB(db)
	now := time.Now()
	many := make([]outbox.ID, outbox.MaxFilterIDs+1)
	for i := range many {
		many[i] = outbox.NewID()
	}
	filters := []struct {
		f     outbox.Filter
		field string
	}{
		{outbox.Filter{States: []outbox.State{"Dead"}}, "States"},
		{outbox.Filter{IDs: many}, "IDs"},
		{outbox.Filter{IDs: []outbox.ID{{}}}, "IDs"},
		{outbox.Filter{Topic: strings.Repeat("t", outbox.MaxTopicBytes+1)}, "Topic"},
		{outbox.Filter{Topic: "\xff"}, "Topic"},
		{outbox.Filter{Key: "a\x00b"}, "Key"},
		{outbox.Filter{ErrorContains: strings.Repeat("e", outbox.MaxErrorContainsBytes+1)}, "ErrorContains"},
		{outbox.Filter{CreatedFrom: now, CreatedTo: now}, "CreatedFrom"},
		{outbox.Filter{SettledFrom: now, SettledTo: now.Add(-time.Second)}, "SettledFrom"},
		{outbox.Filter{CreatedTo: time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC)}, "CreatedTo"},
		{outbox.Filter{SettledFrom: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, "SettledFrom"},
	}
	check := func(what, field string, err error) {
		t.Helper()
		var fe *outbox.FilterError
		if !errors.As(err, &fe) || fe.Field != field || !errors.Is(err, outbox.ErrInvalidFilter) {
			t.Errorf("%s: %v, want a FilterError on %s", what, err, field)
		}
	}
	for _, c := range filters {
		_, err := ob.List(ctx, odb, c.f, 10)
		check("list "+opfmt.Filter(c.f), c.field, err)
		_, err = ob.Count(ctx, odb, c.f)
		check("count "+opfmt.Filter(c.f), c.field, err)
		_, err = ob.Act(ctx, odb, outbox.ActRedrive, c.f, nil)
		check("act "+opfmt.Filter(c.f), c.field, err)
	}
	for _, limit := range []int{-1, outbox.MaxPageSize + 1} {
		_, err := ob.List(ctx, odb, outbox.Filter{}, limit)
		check("list of a bad page size", "Limit", err)
	}
	_, err = ob.Get(ctx, odb, outbox.ID{})
	check("get of the zero id", "IDs", err)
	_, err = ob.Act(ctx, odb, outbox.Action(0), outbox.Filter{Topic: "t"}, nil)
	check("act of no action", "Action", err)
	_, err = ob.Act(ctx, odb, outbox.ActDelete, outbox.Filter{}, nil)
	check("act on every message", "Filter", err)
	_, err = ob.Act(ctx, odb, outbox.ActDelete, outbox.Filter{Topic: "t", After: outbox.NewID()}, nil)
	check("act with a cursor", "After", err)
	// Targets refuses what Act refuses; ActOn too (not an empty filter:
	// its ids bound it), and a zero id. ActOn on no ids, and Targets of an
	// action whose source states the filter excludes, send nothing.
	_, err = ob.Targets(ctx, odb, outbox.ActDelete, outbox.Filter{})
	check("targets of every message", "Filter", err)
	_, err = ob.Targets(ctx, odb, outbox.Action(0), outbox.Filter{Topic: "t"})
	check("targets of no action", "Action", err)
	_, err = ob.Targets(ctx, odb, outbox.ActDelete, outbox.Filter{Topic: "t", After: outbox.NewID()})
	check("targets with a cursor", "After", err)
	if ids, err := ob.Targets(ctx, odb, outbox.ActRedrive, outbox.Filter{States: []outbox.State{outbox.StatePending}}); ids != nil || err != nil {
		t.Errorf("targets of a redrive of pending messages: %v %v, want none", ids, err)
	}
	if _, err := ob.Targets(ctx, odb, outbox.ActSkip, outbox.Filter{Topic: "t"}); !errors.Is(err, outbox.ErrUnsupported) {
		t.Errorf("targets of a skip without OrderByKey: %v", err)
	}
	_, err = ob.ActOn(ctx, odb, outbox.ActDelete, outbox.Filter{}, []outbox.ID{{}}, nil)
	check("act on the zero id", "IDs", err)
	_, err = ob.ActOn(ctx, odb, outbox.Action(9), outbox.Filter{}, []outbox.ID{outbox.NewID()}, nil)
	check("act on ids of no action", "Action", err)
	_, err = ob.ActOn(ctx, odb, outbox.ActDelete, outbox.Filter{After: outbox.NewID()}, []outbox.ID{outbox.NewID()}, nil)
	check("act on ids with a cursor", "After", err)
	if n, err := ob.ActOn(ctx, odb, outbox.ActDelete, outbox.Filter{Topic: "t"}, nil, nil); n != 0 || err != nil {
		t.Errorf("act on no ids: %d %v", n, err)
	}
	if n, err := ob.ActOn(ctx, odb, outbox.ActDelete, outbox.Filter{IDs: []outbox.ID{outbox.NewID()}}, []outbox.ID{outbox.NewID()}, nil); n != 0 || err != nil {
		t.Errorf("act on ids outside f.IDs: %d %v", n, err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// TestTargetsThenActOn: on PostgreSQL, Targets lists the messages an
// action would change (past one page of MaxPageSize, in id order, only
// those in its source state), and ActOn changes those and no message
// published after them, in batches of MaxFilterIDs, with one log line.
func TestTargetsThenActOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, outbox.Config{})
	db := sqltx.FromDB(pgtest.Admin(t))
	const n = outbox.MaxFilterIDs*2 + 5
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "t", Delay: time.Hour}
	}
	publish := func(msgs ...outbox.Message) []outbox.Result {
		tx, err := pgtest.Admin(t).BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.ob.PublishBatch(ctx, sqltx.From(tx), msgs)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		return res
	}
	var res []outbox.Result
	for batch := range slices.Chunk(msgs, 1000) {
		res = append(res, publish(batch...)...)
	}
	ids, err := e.ob.Targets(ctx, db, outbox.ActRetry, outbox.Filter{Topic: "t"})
	if err != nil || len(ids) != n || ids[0] != res[0].ID || ids[n-1] != res[n-1].ID {
		t.Fatalf("targets of a retry: %d ids, %v, want %d from %s", len(ids), err, n, res[0].ID)
	}
	if ids, err := e.ob.Targets(ctx, db, outbox.ActRedrive, outbox.Filter{Topic: "t"}); len(ids) != 0 || err != nil {
		t.Errorf("targets of a redrive (none dead): %d %v", len(ids), err)
	}
	late := publish(outbox.Message{Topic: "t", Delay: time.Hour})
	var logged strings.Builder
	changed, err := e.ob.ActOn(ctx, db, outbox.ActRetry, outbox.Filter{Topic: "t"}, ids,
		&outbox.ActOptions{Actor: "alice", Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil || changed != n {
		t.Fatalf("act on the targets: %d %v, want %d", changed, err, n)
	}
	if due := count(t, e.table, `available_at <= now()`); due != n {
		t.Errorf("%d messages due after the retry, want %d", due, n)
	}
	if due := count(t, e.table, `id = $1 AND available_at > now()`, late[0].ID.String()); due != 1 {
		t.Errorf("the message published after the targets was retried too")
	}
	if lines := strings.Count(logged.String(), "\n"); lines != 1 || !strings.Contains(logged.String(), `filter="ids=2005 topic=\"t\""`) || !strings.Contains(logged.String(), "changed=2005") {
		t.Errorf("log: %q, want one line for the call", logged.String())
	}
}
