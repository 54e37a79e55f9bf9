package mysql_test

import (
	"context"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/outbox"
)

// TestTextComparedExactly: topics and dedup keys that differ only by
// trailing spaces are different, as they are on PostgreSQL and SQLite.
// utf8mb4_bin is a PAD SPACE collation on MariaDB and MySQL ('k' = 'k '),
// so a UNIQUE index on such a column took "k " for a duplicate of "k" (the
// message was dropped and reported Duplicate), a relay of topic "t" claimed
// messages of "t ", redrive of "t" revived "t ", and stats merged them.
func TestTextComparedExactly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, outbox.Config{})
	ctx := context.Background()
	d := mysql.Dialect().(outbox.RelayDialect)
	db := sqltx.Pool(e.pool)

	tx := e.begin(t)
	res, err := e.ob.PublishBatch(ctx, sqltx.From(tx), []outbox.Message{
		{Topic: "t", DedupKey: "k"}, {Topic: "t ", DedupKey: "k "}, {Topic: "t  ", DedupKey: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if res[0].Duplicate || res[1].Duplicate || !res[2].Duplicate {
		t.Fatalf("results %+v, want stored, stored (\"k \" is not \"k\"), duplicate", res)
	}
	if n := count(t, e.table, ""); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}

	st, err := d.Stats(ctx, db, e.ob.Table())
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].Topic != "t" || st[0].Pending != 1 || st[1].Topic != "t " || st[1].Pending != 1 {
		t.Errorf("stats %+v, want one pending message for each of \"t\" and \"t \"", st)
	}

	p := outbox.ClaimParams{Topics: []string{"t"}, Limit: 10, Lease: time.Minute, MaxAttempts: 1}
	cs, _, err := d.Claim(ctx, db, e.ob.Table(), p)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].ID != res[0].ID || cs[0].Topic != "t" {
		t.Fatalf("a claim of topic \"t\" took %+v, want only %s", cs, res[0].ID)
	}
	// Both dead: the next claims dead-letter them (max attempts 1).
	if _, err := e.pool.Exec(`UPDATE ` + e.table + ` SET available_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, attempts = 1`); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"t", "t "} {
		p.Topics = []string{topic}
		if cs, _, err := d.Claim(ctx, db, e.ob.Table(), p); err != nil || len(cs) != 1 || !cs[0].Dead || cs[0].Topic != topic {
			t.Fatalf("claim of %q: %+v %v, want its one message dead-lettered", topic, cs, err)
		}
	}
	if n, err := d.Redrive(ctx, db, e.ob.Table(), "t"); err != nil || n != 1 {
		t.Errorf("redrive of \"t\" revived %d, %v; want 1", n, err)
	}
	if n := count(t, e.table, `state = 'dead'`); n != 1 {
		t.Errorf("%d dead rows after redriving \"t\", want 1 (the message of \"t \")", n)
	}
}
