package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
)

// TestCLI runs the built binary through every subcommand on each database.
func TestCLI(t *testing.T) {
	for _, c := range []struct {
		name string
		open func(t *testing.T) db
		d    outbox.Dialect
	}{
		{"sqlite", sqliteDB, sqlite.Dialect()},
		{"postgres", postgresDB, postgres.Dialect()},
		{"mysql", mysqlDB, mysql.Dialect()},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := c.open(t)
			d.dialect = c.d
			cliRoundTrip(t, d)
		})
	}
}

var (
	idRE   = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	timeRE = regexp.MustCompile(`\d{4}-\d\d-\d\d \d\d:\d\d:\d\d`)
)

// golden compares out, with ids and times replaced, to testdata/name.
func golden(t *testing.T, name, out string) {
	t.Helper()
	got := timeRE.ReplaceAllString(idRE.ReplaceAllString(out, "<ID>"), "<TIME>")
	path := filepath.Join("testdata", name)
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s: got\n%s\nwant\n%s", name, got, want)
	}
}

func cliRoundTrip(t *testing.T, d db) {
	// Migrations: none applied, then all, then status says so.
	for _, m := range lines(t, d.ok(t, 0, "migrate", "status", "--json")) {
		if m["applied"] != false {
			t.Errorf("before migrate up: %v", m)
		}
	}
	if len(lines(t, d.ok(t, 0, "migrate", "up", "--json"))) == 0 {
		t.Error("migrate up applied nothing")
	}
	status := lines(t, d.ok(t, 0, "migrate", "status", "--json"))
	for _, m := range status {
		if m["applied"] != true {
			t.Errorf("after migrate up: %v", m)
		}
	}
	// down reverts the latest, up applies it again.
	down := lines(t, d.ok(t, 0, "migrate", "down", "--json"))
	if len(down) != 1 || down[0]["version"] != status[len(status)-1]["version"] {
		t.Errorf("migrate down: %v, want the latest of %v", down, status)
	}
	d.ok(t, 0, "migrate", "up")

	ob, err := outbox.New(d.dialect, outbox.Config{Table: d.table})
	if err != nil {
		t.Fatal(err)
	}
	res := d.seed(t, ob,
		outbox.Message{Topic: "mail", Key: "order-1", Payload: []byte(`{"to":"a@example.com","html":"</script><script>alert(1)</script>"}`), Headers: map[string]string{"trace": "t1"}},
		outbox.Message{Topic: "mail", Key: "order-2"},
		outbox.Message{Topic: "mail", Key: "later", Delay: time.Hour},
		outbox.Message{Topic: "hook", Key: "h", Delay: time.Hour})
	failAll(t, ob, d.pool, "mail", 2)

	golden(t, "stats.txt", d.ok(t, 0, "stats"))
	st := lines(t, d.ok(t, 0, "stats", "--json"))
	if len(st) != 2 || st[1]["topic"] != "mail" || st[1]["dead"] != 2.0 || st[1]["pending"] != 1.0 || st[0]["topic"] != "hook" {
		t.Errorf("stats --json: %v", st)
	}
	golden(t, "list-dead.txt", d.ok(t, 0, "list", "--state", "dead"))
	dead := lines(t, d.ok(t, 0, "list", "--state", "dead", "--topic", "mail", "--error", "refused", "--json"))
	if len(dead) != 2 || dead[0]["id"] != res[0].ID.String() || dead[0]["last_error"] != "smtp: connection refused <b>" || dead[0]["attempt"] != 1.0 {
		t.Errorf("list --state dead --json: %v", dead)
	}
	if got := lines(t, d.ok(t, 0, "list", "--key", "order-2", "--json")); len(got) != 1 || got[0]["id"] != res[1].ID.String() {
		t.Errorf("list --key order-2: %v", got)
	}
	// Pages: --limit 1 prints the cursor, --after goes on, --all reads every page.
	out, errs, code := d.run(t, "list", "--limit", "1", "--json")
	if code != 0 || len(lines(t, out)) != 1 || !strings.Contains(errs, "more: --after "+res[0].ID.String()) {
		t.Errorf("list --limit 1: %d %q %q", code, out, errs)
	}
	if got := lines(t, d.ok(t, 0, "list", "--limit", "1", "--after", res[2].ID.String(), "--json")); len(got) != 1 || got[0]["id"] != res[3].ID.String() {
		t.Errorf("list --after: %v", got)
	}
	if got := lines(t, d.ok(t, 0, "list", "--limit", "1", "--all", "--json")); len(got) != 4 {
		t.Errorf("list --all: %d messages", len(got))
	}
	d.ok(t, exitNothing, "list", "--topic", "nope")
	d.ok(t, exitUsage, "list", "--state", "bogus")
	d.ok(t, exitUsage, "list", "--created-from", "yesterday")
	d.ok(t, exitUsage, "list", "--limit", "5000")

	show := lines(t, d.ok(t, 0, "show", res[0].ID.String(), "--json"))
	if len(show) != 1 || show[0]["state"] != "dead" || show[0]["payload"].(map[string]any)["html"] != "</script><script>alert(1)</script>" ||
		show[0]["headers"].(map[string]any)["trace"] != "t1" {
		t.Errorf("show --json: %v", show)
	}
	if out := d.ok(t, 0, "show", res[0].ID.String()); !strings.Contains(out, `"to": "a@example.com"`) || !strings.Contains(out, "last error:  smtp: connection refused") {
		t.Errorf("show:\n%s", out)
	}
	d.ok(t, exitNothing, "show", outbox.NewID().String())
	d.ok(t, exitUsage, "show", "not-an-id")

	// A destructive command without --yes and without a terminal changes
	// nothing; --dry-run says what would change.
	d.ok(t, exitUsage, "redrive", "--state", "dead")
	if n := count(t, ob, d, outbox.Filter{States: []outbox.State{outbox.StateDead}}); n != 2 {
		t.Fatalf("redrive without --yes changed messages: %d dead", n)
	}
	if got := lines(t, d.ok(t, 0, "redrive", "--state", "dead", "--dry-run", "--json")); len(got) != 1 || got[0]["would_change"] != 2.0 {
		t.Errorf("redrive --dry-run: %v", got)
	}
	if got := lines(t, d.ok(t, 0, "redrive", res[0].ID.String(), "--yes", "--json")); got[0]["changed"] != 1.0 {
		t.Errorf("redrive ID: %v", got)
	}
	if got := lines(t, d.ok(t, 0, "redrive", "--state", "dead", "--topic", "mail", "--yes", "--json")); got[0]["changed"] != 1.0 {
		t.Errorf("redrive --state dead: %v", got)
	}
	d.ok(t, exitNothing, "list", "--state", "dead")
	d.ok(t, exitNothing, "redrive", "--state", "dead", "--yes")
	// retry: the delayed messages become due.
	if got := lines(t, d.ok(t, 0, "retry", "--topic", "hook", "--yes", "--json")); got[0]["changed"] != 1.0 {
		t.Errorf("retry: %v", got)
	}
	if n := count(t, ob, d, outbox.Filter{Topic: "hook"}); n != 1 {
		t.Errorf("retry lost the message: %d", n)
	}
	d.ok(t, exitUsage, "delete", "--yes") // no filter: never everything
	if got := lines(t, d.ok(t, 0, "delete", res[3].ID.String(), "--yes", "--json")); got[0]["changed"] != 1.0 {
		t.Errorf("delete ID: %v", got)
	}
	d.ok(t, exitNothing, "show", res[3].ID.String())
	if got := lines(t, d.ok(t, 0, "purge", "--dry-run", "--older-than", "0s", "--json")); got[0]["would_change"] != 0.0 {
		t.Errorf("purge --dry-run: %v", got)
	}
	d.ok(t, exitUsage, "purge", "--states", "pending", "--yes")
	// Skip: PostgreSQL and SQLite have ordered delivery (nothing halted
	// here: nothing matched); MySQL says clearly that it has none.
	if d.name == "postgres" || d.name == "sqlite" {
		d.ok(t, exitNothing, "skip", "--state", "dead", "--yes")
	} else if _, errs, code := d.run(t, "skip", "--state", "dead", "--yes"); code != exitError || !strings.Contains(errs, "skip needs ordered delivery, which only PostgreSQL and SQLite have") {
		t.Errorf("skip on %s: exit %d, %q", d.name, code, errs)
	}
	w := lines(t, d.ok(t, 0, "watch", "--count", "2", "--interval", "10ms", "--json"))
	if len(w) != 2 || w[0]["topic"] != "mail" || w[1]["topic"] != "mail" {
		t.Errorf("watch --count 2: %v, want two snapshots of topic mail (hook's one message was deleted)", w)
	}
}

func count(t *testing.T, ob *outbox.Outbox, d db, f outbox.Filter) int64 {
	t.Helper()
	n, err := ob.Count(context.Background(), sqlDB(d), f)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestConfirm: on a terminal, a destructive command asks and acts only on
// yes.
func TestConfirm(t *testing.T) {
	d := sqliteDB(t)
	d.dialect = sqlite.Dialect()
	d.ok(t, 0, "migrate", "up")
	ob, err := outbox.New(d.dialect, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	res := d.seed(t, ob, outbox.Message{Topic: "t", Delay: time.Hour})
	for _, c := range []struct {
		answer string
		code   int
		left   int64
	}{{"n\n", exitError, 1}, {"\n", exitError, 1}, {"y\n", exitOK, 0}} {
		var out, errb bytes.Buffer
		cl := &cli{stdin: strings.NewReader(c.answer), stdout: &out, stderr: &errb, terminal: true}
		code := cl.run(context.Background(), []string{"delete", res[0].ID.String(), "--dsn", d.dsn})
		if code != c.code || !strings.Contains(errb.String(), "delete 1 message(s) matching id="+res[0].ID.String()+"? [y/N]") {
			t.Errorf("answer %q: exit %d, stderr %q", c.answer, code, errb.String())
		}
		if n := count(t, ob, d, outbox.Filter{}); n != c.left {
			t.Errorf("answer %q: %d messages left, want %d", c.answer, n, c.left)
		}
	}
}

func TestKindOf(t *testing.T) {
	for _, c := range []struct{ dsn, kind string }{
		{"postgres://u@h/db", "postgres"}, {"postgresql://h/db", "postgres"}, {"host=h dbname=db", "postgres"},
		{"file:app.db", "sqlite"}, {"sqlite:app.db", "sqlite"}, {"/var/lib/app.sqlite3", "sqlite"},
		{"root@tcp(127.0.0.1:3306)/test", "mysql"}, {"mysql://u:p@tcp(h)/db", "mysql"}, {"u@unix(/run/mysqld.sock)/db", "mysql"},
		{"nonsense", ""},
	} {
		k, _, err := kindOf(c.dsn, "")
		if k != c.kind || (c.kind == "" && err == nil) {
			t.Errorf("kindOf(%q) = %q, %v; want %q", c.dsn, k, err, c.kind)
		}
	}
}

// TestSkip: on PostgreSQL and SQLite, skip takes the dead head that halts
// an ordered key (by id or filter), asks for --yes, says what it would
// change with --dry-run, and logs who skipped what and how many; the key
// goes on.
func TestSkip(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		d := postgresDB(t)
		d.dialect = postgres.Dialect()
		testSkip(t, d)
	})
	t.Run("sqlite", func(t *testing.T) {
		d := sqliteDB(t)
		d.dialect = sqlite.Dialect()
		testSkip(t, d)
	})
}

func testSkip(t *testing.T, d db) {
	d.ok(t, 0, "migrate", "up")
	ob, err := outbox.New(d.dialect, outbox.Config{Table: d.table, OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	res := d.seed(t, ob, outbox.Message{Topic: "x", Key: "H"}, outbox.Message{Topic: "x", Key: "H"}, outbox.Message{Topic: "x", Key: "H"})
	failAll(t, ob, d.pool, "x", 1) // H's head dies and halts H
	head := res[0].ID.String()
	if got := lines(t, d.ok(t, 0, "list", "--key", "H", "--json")); len(got) != 3 || got[0]["state"] != "dead" || got[1]["state"] != "blocked" {
		t.Fatalf("key H before the skip: %v", got)
	}
	d.ok(t, exitUsage, "skip", head) // no --yes, no terminal
	if got := lines(t, d.ok(t, 0, "skip", "--key", "H", "--dry-run", "--json")); len(got) != 1 || got[0]["would_change"] != 1.0 {
		t.Errorf("skip --dry-run: %v", got)
	}
	d.ok(t, exitNothing, "skip", res[1].ID.String(), "--yes") // blocked, not a dead head
	out, errs, code := d.run(t, "skip", head, "--yes", "--json", "--actor", "alice")
	if code != 0 || len(lines(t, out)) != 1 || lines(t, out)[0]["changed"] != 1.0 {
		t.Fatalf("skip ID: exit %d, %q, %q", code, out, errs)
	}
	for _, want := range []string{`msg="outbox: operator action"`, "action=skip", "actor=alice", `filter="id=` + head + `"`, "changed=1"} {
		if !strings.Contains(errs, want) {
			t.Errorf("skip's log line lacks %s: %q", want, errs)
		}
	}
	if got := lines(t, d.ok(t, 0, "show", res[1].ID.String(), "--json")); got[0]["state"] != "pending" {
		t.Errorf("H's next message after the skip: %v, want pending", got)
	}
	if got := lines(t, d.ok(t, 0, "show", head, "--json")); got[0]["state"] != "dead" {
		t.Errorf("the skipped message: %v, want dead", got)
	}
	d.ok(t, exitNothing, "skip", head, "--yes")
	// Purge deletes the skipped message (settled by the skip), logged with
	// the OS user by default.
	out, errs, code = d.run(t, "purge", "--states", "dead", "--older-than", "0s", "--yes", "--json")
	if code != 0 || lines(t, out)[0]["changed"] != 1.0 || !strings.Contains(errs, "action=purge actor="+defaultActor()) || !strings.HasPrefix(defaultActor(), "cli") {
		t.Errorf("purge: exit %d, %q, %q (actor %s)", code, out, errs, defaultActor())
	}
}
