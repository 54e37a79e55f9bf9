package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
)

// TestPurgePlan: a purge batch finds its rows through the settled index,
// in a subquery evaluated once (its LIMIT holds), and deletes them by
// rowid.
func TestPurgePlan(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "p.db")+dsnOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := sqlite.Migrate(ctx, db, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < 4000)
		INSERT INTO outbox (id, topic, state, settled_at)
		SELECT printf('%036d', x), 't', CASE x % 4 WHEN 0 THEN 'pending' WHEN 1 THEN 'processing' WHEN 2 THEN 'delivered' ELSE 'dead' END,
		       CASE WHEN x % 4 >= 2 THEN x END FROM g`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`ANALYZE`); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`EXPLAIN QUERY PLAN `+sqlite.PurgeSQL(outbox.Table{Name: "outbox"}), `["dead"]`, 1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan strings.Builder
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(detail + "\n")
	}
	got := plan.String()
	for _, want := range []string{"USING INTEGER PRIMARY KEY (rowid=?)", "LIST SUBQUERY", "USING INDEX outbox_settled_idx (settled_at<?)"} {
		if !strings.Contains(got, want) {
			t.Errorf("purge plan lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "SCAN outbox") {
		t.Errorf("purge plan scans the table:\n%s", got)
	}
	t.Logf("purge plan:\n%s", got)
}
