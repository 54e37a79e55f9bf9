package mysql_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/internal/publishsql"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
	"github.com/oncommit/oncommit/outboxtest"
)

// TestOutboxtestExpectsBothStatements: with sqlmock, outboxtest scripts the
// MySQL publish exactly: one Exec without a dedup key; the Exec and the
// query for the stored ids with one; a duplicate is reported as such. With
// OrderByKey, the statements that number the stored ordered messages
// follow, except after a duplicate.
func TestOutboxtestExpectsBothStatements(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			ob, err := outbox.New(mysql.Dialect(), outbox.Config{OrderByKey: ordered})
			if err != nil {
				t.Fatal(err)
			}
			db, mock, err := sqlmock.New()
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			plain := outbox.Message{Topic: "t", Key: "a", Payload: []byte(`{"n":1}`)}
			dedup := outbox.Message{Topic: "t", Key: "a", DedupKey: "k"}
			if st, err := ob.PublishSQL(plain); err != nil || (len(publishsql.Of(st).Sequence) > 0) != ordered {
				t.Fatalf("Sequence %v, %v", publishsql.Of(st).Sequence, err)
			}
			mock.ExpectBegin()
			outboxtest.ExpectPublish(mock, ob, plain)
			outboxtest.ExpectPublish(mock, ob, dedup)
			outboxtest.ExpectPublishDuplicate(mock, ob, dedup)
			batch := []outbox.Message{plain, {Topic: "u", Key: "b"}, {Topic: "t", Key: "a", DedupKey: "k2"}}
			outboxtest.ExpectPublish(mock, ob, batch...)
			mock.ExpectCommit()
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for i, m := range []outbox.Message{plain, dedup, dedup} {
				res, err := ob.Publish(ctx, sqltx.From(tx), m)
				if err != nil {
					t.Fatal(err)
				}
				if res.Duplicate != (i == 2) {
					t.Errorf("publish %d: duplicate %v", i, res.Duplicate)
				}
			}
			if _, err := ob.PublishBatch(ctx, sqltx.From(tx), batch); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// idRE matches the text form of a generated id.
var idRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// TestOrderedPublishSQL pins the ordered publish on MySQL, statement by
// statement and byte for byte (ids aside): the INSERT stores the ordered
// rows blocked, then the key rows are taken in key order and the rows
// numbered from them, all on the caller's transaction and nothing else.
func TestOrderedPublishSQL(t *testing.T) {
	ob, err := outbox.New(mysql.Dialect(), outbox.Config{OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	// Ids become <id>; the rest must be equal.
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherFunc(func(want, got string) error {
		if g := idRE.ReplaceAllString(got, "<id>"); g != want {
			return fmt.Errorf("statement\n%s\nwant\n%s", g, want)
		}
		return nil
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ids := "(SELECT _ascii'<id>' COLLATE ascii_bin AS id, 1 AS pos UNION ALL SELECT _ascii'<id>', 2) AS k STRAIGHT_JOIN `outbox` AS s FORCE INDEX (PRIMARY) ON s.id = k.id\n" +
		"WHERE s.state = 'blocked' AND s.key_seq IS NULL"
	mock.ExpectBegin()
	mock.ExpectExec("INSERT INTO `outbox` (id, topic, message_key, state) VALUES (?, ?, ?, 'blocked'), (?, ?, ?, 'blocked'), (?, ?, ?, 'pending')").
		WithArgs(sqlmock.AnyArg(), "t", "b", sqlmock.AnyArg(), "t", "a", sqlmock.AnyArg(), "t", nil).WillReturnResult(sqlmock.NewResult(0, 3))
	mock.ExpectExec("INSERT INTO `outbox_keys` (message_key, last_seq, live)\nSELECT s.message_key, COUNT(*), COUNT(*) FROM " + ids +
		" GROUP BY s.message_key ORDER BY s.message_key\nON DUPLICATE KEY UPDATE last_seq = last_seq + VALUES(last_seq), live = live + VALUES(live)").
		WillReturnResult(sqlmock.NewResult(0, 2))
	mock.ExpectExec("UPDATE (SELECT s.id, ROW_NUMBER() OVER (PARTITION BY s.message_key ORDER BY k.pos) AS ord, COUNT(*) OVER (PARTITION BY s.message_key) AS n\n    FROM " +
		ids + ") AS v\nSTRAIGHT_JOIN `outbox` AS o FORCE INDEX (PRIMARY) ON o.id = v.id\nSTRAIGHT_JOIN `outbox_keys` AS ks FORCE INDEX (PRIMARY) ON ks.message_key = o.message_key\n" +
		"SET o.key_seq = ks.last_seq - v.n + v.ord, o.state = IF(v.ord = 1 AND ks.live = v.n, 'pending', 'blocked')").
		WillReturnResult(sqlmock.NewResult(0, 2))
	mock.ExpectCommit()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.PublishBatch(context.Background(), sqltx.From(tx), []outbox.Message{{Topic: "t", Key: "b"}, {Topic: "t", Key: "a"}, {Topic: "t"}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}

// TestSequenceStatementsOne pins the numbering of a publish of one ordered
// message: the same two steps without grouping or window functions.
func TestSequenceStatementsOne(t *testing.T) {
	id := outbox.NewID()
	tbl, err := outboxdriver.ParseTable("outbox")
	if err != nil {
		t.Fatal(err)
	}
	got := mysql.Dialect().(outboxdriver.Sequencer).SequenceStatements(tbl, []outbox.ID{id})
	one := "id = '" + id.String() + "' AND s.state = 'blocked' AND s.key_seq IS NULL"
	want := []string{
		"INSERT INTO `outbox_keys` (message_key, last_seq, live)\nSELECT s.message_key, 1, 1 FROM `outbox` AS s WHERE s." + one +
			"\nON DUPLICATE KEY UPDATE last_seq = last_seq + 1, live = live + 1",
		"UPDATE `outbox` AS o STRAIGHT_JOIN `outbox_keys` AS ks FORCE INDEX (PRIMARY) ON ks.message_key = o.message_key\n" +
			"SET o.key_seq = ks.last_seq, o.state = IF(ks.live = 1, 'pending', 'blocked')\nWHERE o." + strings.ReplaceAll(one, "s.", "o."),
	}
	if len(got) != len(want) {
		t.Fatalf("%d statements, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Query != want[i] || len(got[i].Args) != 0 {
			t.Errorf("statement %d:\n%s\nwant\n%s", i, got[i].Query, want[i])
		}
	}
}
