package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
)

// TestInspectBadInputSendsNothing: every filter, page size and action the
// inspection API refuses is a *FilterError naming the field, and no
// statement reaches the database (sqlmock expects none).
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
		check("list "+outbox.FilterString(c.f), c.field, err)
		_, err = ob.Count(ctx, odb, c.f)
		check("count "+outbox.FilterString(c.f), c.field, err)
		_, err = ob.Act(ctx, odb, outbox.ActRedrive, c.f, nil)
		check("act "+outbox.FilterString(c.f), c.field, err)
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
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}
