package sqltx

import (
	"context"
	"fmt"
	"testing"

	"github.com/oncommit/oncommit/internal/pgtest"
)

// TestQueryPrepared: statements are prepared once and reused, at most
// maxPrepared are kept (the rest still run, unprepared), and a kept
// statement still runs after the table it reads changes.
func TestQueryPrepared(t *testing.T) {
	db := pgtest.Open(t, "pgx")
	schema := pgtest.Schema(t)
	ctx := context.Background()
	tbl := schema + ".t"
	if _, err := db.Exec(`CREATE TABLE ` + tbl + ` (a INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO ` + tbl + ` VALUES (1), (2), (3)`); err != nil {
		t.Fatal(err)
	}
	p := FromDB(db)
	count := func(q string, args ...any) int {
		t.Helper()
		rows, err := p.QueryPrepared(ctx, q, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	q := `SELECT a FROM ` + tbl + ` WHERE a >= $1`
	if count(q, 2) != 2 || count(q, 1) != 3 {
		t.Fatal("wrong rows")
	}
	first, _ := p.stmts.Load(q)
	count(q, 3)
	if again, _ := p.stmts.Load(q); again != first || p.prepared.Load() != 1 {
		t.Fatalf("statement not reused: %d kept", p.prepared.Load())
	}
	if _, err := db.Exec(`ALTER TABLE ` + tbl + ` ADD COLUMN b TEXT`); err != nil {
		t.Fatal(err)
	}
	if count(q, 1) != 3 {
		t.Fatal("wrong rows after the table changed")
	}
	for i := range maxPrepared + 10 {
		if n := count(fmt.Sprintf(`SELECT a FROM %s WHERE a >= $1 AND %d = %d`, tbl, i, i), 1); n != 3 {
			t.Fatalf("query %d: %d rows", i, n)
		}
	}
	if n := p.prepared.Load(); n != maxPrepared {
		t.Errorf("%d statements kept, want %d", n, maxPrepared)
	}
	if _, err := p.QueryPrepared(ctx, `SELECT nope FROM t`); err == nil {
		t.Error("bad statement: no error")
	}
}
