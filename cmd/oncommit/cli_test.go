package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
)

// TestCLI runs the built binary through every subcommand on each database.
func TestCLI(t *testing.T) { eachDB(t, cliRoundTrip) }

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
	// down reverts the latest (with --yes), up applies it again.
	down := lines(t, d.ok(t, 0, "migrate", "down", "--yes", "--json"))
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
	// Skip: every dialect has ordered delivery (nothing halted here:
	// nothing matched).
	d.ok(t, exitNothing, "skip", "--state", "dead", "--yes")
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
	d, ob := sqliteOutbox(t)
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

// TestSkip: on PostgreSQL, SQLite and MySQL/MariaDB, skip takes the dead
// head that halts an ordered key (by id or filter), asks for --yes, says
// what it would change with --dry-run, and logs who skipped what and how
// many; the key goes on. A skip of a blocked message, or of the head once
// skipped, is refused (exit 1).
func TestSkip(t *testing.T) {
	eachDB(t, testSkip)
	t.Run("help", func(t *testing.T) {
		d := sqliteDB(t)
		for _, args := range [][]string{{"skip", "--help"}, {"help"}} {
			_, errs, code := d.run(t, args...)
			if code != 0 || !strings.Contains(errs, "skip dead messages that halt their ordered key") {
				t.Errorf("oncommit %s: exit %d, %q", strings.Join(args, " "), code, errs)
			}
			// Every dialect has ordered delivery: no line about it names
			// some of them (it said "PostgreSQL, SQLite").
			for _, line := range strings.Split(errs, "\n") {
				if strings.Contains(line, "ordered") && dialectName.MatchString(line) {
					t.Errorf("oncommit %s names dialects for ordered delivery: %q", strings.Join(args, " "), line)
				}
			}
		}
	})
}

// dialectName matches a database's name in help text.
var dialectName = regexp.MustCompile(`(?i)postgres|sqlite|mysql|mariadb`)

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
	d.ok(t, exitError, "skip", res[1].ID.String(), "--yes") // blocked, not a dead head: refused
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
	d.ok(t, exitError, "skip", head, "--yes") // skipped already: halts no key
	// Purge deletes the skipped message (settled by the skip), logged with
	// the OS user by default.
	out, errs, code = d.run(t, "purge", "--states", "dead", "--older-than", "0s", "--yes", "--json")
	if code != 0 || lines(t, out)[0]["changed"] != 1.0 || !strings.Contains(errs, "action=purge actor="+defaultActor()) || !strings.HasPrefix(defaultActor(), "cli") {
		t.Errorf("purge: exit %d, %q, %q (actor %s)", code, out, errs, defaultActor())
	}
}

// TestMigrateDownNeedsYes: without --yes, migrate down reverts nothing and
// says which migration it would revert and how many undelivered messages
// the table holds (exit 2); the first migration's says it drops them.
// With --yes it reverts, down to the table's drop.
func TestMigrateDownNeedsYes(t *testing.T) {
	eachDB(t, func(t *testing.T, d db) {
		d.ok(t, 0, "migrate", "up")
		ob, err := outbox.New(d.dialect, outbox.Config{Table: d.table})
		if err != nil {
			t.Fatal(err)
		}
		d.seed(t, ob, outbox.Message{Topic: "a"}, outbox.Message{Topic: "a", Delay: time.Hour}, outbox.Message{Topic: "a"}, outbox.Message{Topic: "done"})
		if _, err := d.pool.Exec("UPDATE " + d.table + " SET state = 'delivered' WHERE topic = 'done'"); err != nil {
			t.Fatal(err)
		}
		applied := func() int {
			n := 0
			for _, m := range lines(t, d.ok(t, 0, "migrate", "status", "--json")) {
				if m["applied"] == true {
					n++
				}
			}
			return n
		}
		for left := applied(); left > 0; left-- {
			_, errs, code := d.run(t, "migrate", "down")
			want := "(table " + d.table + " and its 3 undelivered message(s) stay); pass --yes"
			if left == 1 {
				want = "0001_init, which drops table " + d.table + " and the 3 undelivered message(s) in it; pass --yes"
			}
			if code != exitUsage || !strings.Contains(errs, "not confirmed: migrate down would revert") || !strings.Contains(errs, want) {
				t.Fatalf("migrate down without --yes, %d applied: exit %d, %q, want it to say %q", left, code, errs, want)
			}
			if n := applied(); n != left {
				t.Fatalf("migrate down without --yes reverted a migration: %d applied, want %d", n, left)
			}
			if n := count(t, ob, d, outbox.Filter{}); n != 4 {
				t.Fatalf("migrate down without --yes: %d messages, want 4", n)
			}
			d.ok(t, 0, "migrate", "down", "--yes")
		}
		if n := applied(); n != 0 {
			t.Errorf("after every down: %d applied", n)
		}
		if _, err := ob.Count(context.Background(), sqlDB(d), outbox.Filter{}); err == nil {
			t.Error("the table is still there after the first migration's down")
		}
		d.ok(t, exitNothing, "migrate", "down", "--yes")
	})
}

// hookReader runs hook before its first read: what happens while an
// operator reads a confirmation question.
type hookReader struct {
	hook func()
	r    io.Reader
}

func (h *hookReader) Read(p []byte) (int, error) {
	if h.hook != nil {
		h.hook()
		h.hook = nil
	}
	return h.r.Read(p)
}

// TestConfirmActsOnWhatItShowed: a confirmed action changes only the
// messages its question counted, not one published while the operator
// answered; a confirmed purge deletes only messages settled before the
// cut-off of its count, not one that aged past the cut-off meanwhile.
func TestConfirmActsOnWhatItShowed(t *testing.T) {
	d, ob := sqliteOutbox(t)
	d.seed(t, ob, outbox.Message{Topic: "t", Delay: time.Hour}, outbox.Message{Topic: "t", Delay: time.Hour})
	var late []outbox.Result
	var out, errb bytes.Buffer
	cl := &cli{stdin: &hookReader{hook: func() { late = d.seed(t, ob, outbox.Message{Topic: "t", Delay: time.Hour}) }, r: strings.NewReader("y\n")},
		stdout: &out, stderr: &errb, terminal: true}
	code := cl.run(context.Background(), []string{"delete", "--topic", "t", "--dsn", d.dsn, "--json"})
	if code != exitOK || !strings.Contains(errb.String(), `delete 2 message(s) matching topic="t"? [y/N]`) {
		t.Fatalf("delete: exit %d, %q", code, errb.String())
	}
	if got := lines(t, out.String()); len(got) != 1 || got[0]["changed"] != 2.0 {
		t.Errorf("delete confirmed for 2 messages: %v", got)
	}
	if _, err := ob.Get(context.Background(), sqlDB(d), late[0].ID); err != nil {
		t.Errorf("the message published while the question was asked: %v, want it left alone", err)
	}

	// Purge: two dead messages, one settled two hours ago, one that
	// reaches an hour's age while the question is asked.
	res := d.seed(t, ob, outbox.Message{Topic: "p"}, outbox.Message{Topic: "p"})
	failAll(t, ob, d.pool, "p", 2)
	const ago = "CAST(unixepoch('subsec') * 1000 AS INTEGER) - "
	if _, err := d.pool.Exec("UPDATE outbox SET settled_at = "+ago+"7200000 WHERE id = ?", res[0].ID.String()); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	cl.stdin = &hookReader{hook: func() {
		time.Sleep(300 * time.Millisecond)
		if _, err := d.pool.Exec("UPDATE outbox SET settled_at = "+ago+"3600100 WHERE id = ?", res[1].ID.String()); err != nil {
			t.Error(err)
		}
	}, r: strings.NewReader("y\n")}
	code = cl.run(context.Background(), []string{"purge", "--states", "dead", "--older-than", "1h", "--dsn", d.dsn, "--json"})
	if code != exitOK || !strings.Contains(errb.String(), "purge 1 message(s), state=dead settled<1h0m0s ago? [y/N]") {
		t.Fatalf("purge: exit %d, %q", code, errb.String())
	}
	if got := lines(t, out.String()); len(got) != 1 || got[0]["changed"] != 1.0 {
		t.Errorf("purge confirmed for 1 message: %v", got)
	}
	if m, err := ob.Get(context.Background(), sqlDB(d), res[1].ID); err != nil || m.State != outbox.StateDead {
		t.Errorf("the message that aged past the cut-off while the question was asked: %+v, %v, want it kept", m, err)
	}
}

// TestHumanOutputEscapesControls: stats, list and show write the control
// characters of a message's topic, key, error, headers and payload (ESC,
// CR, the C1 CSI U+009B) as Go escapes, so message data cannot drive the
// operator's terminal; --json is unchanged.
func TestHumanOutputEscapesControls(t *testing.T) {
	d, ob := sqliteOutbox(t)
	const topic, key = "red\x1b[31m", "k\x1b]0;owned\x07\r"
	res := d.seed(t, ob, outbox.Message{Topic: topic, Key: key, Payload: []byte("{\"p\":\"\u009b2J\"}"), Headers: map[string]string{"h": "\u009b31m"}})
	if _, err := d.pool.Exec("UPDATE outbox SET last_error = ? WHERE id = ?", "boom\x1b[2J\x1b[H", res[0].ID.String()); err != nil {
		t.Fatal(err)
	}
	id := res[0].ID.String()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"stats"}, []string{`red\x1b[31m`}},
		{[]string{"list"}, []string{`red\x1b[31m`, `k\x1b]0;owned\a\r`, `boom\x1b[2J\x1b[H`}},
		{[]string{"show", id}, []string{`red\x1b[31m`, `k\x1b]0;owned\a\r`, `boom\x1b[2J\x1b[H`, `"h": "\u009b31m"`, `"p": "\u009b2J"`}},
	} {
		out := d.ok(t, 0, c.args...)
		if strings.ContainsAny(out, "\x1b\x07\r\u009b") {
			t.Errorf("oncommit %s wrote a control character: %q", c.args[0], out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("oncommit %s: %q lacks %q", c.args[0], out, w)
			}
		}
	}
	if got := lines(t, d.ok(t, 0, "show", id, "--json")); got[0]["topic"] != topic || got[0]["key"] != key || got[0]["last_error"] != "boom\x1b[2J\x1b[H" {
		t.Errorf("show --json: %v", got)
	}
}

// serve starts oncommit serve with args on d and returns the address it
// serves on and what it wrote on stderr until it said so; the process is
// killed at cleanup.
func (d db) serve(t *testing.T, args ...string) (addr, stderr string) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"serve", "--dsn", d.dsn, "--table", d.table}, args...)...)
	cmd.Env = append(os.Environ(), "OUTBOX_DSN=", "DATABASE_URL=")
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	re := regexp.MustCompile(`dashboard of \S+ on http://(\S+)/`)
	var b strings.Builder
	for sc := bufio.NewScanner(pipe); sc.Scan(); {
		b.WriteString(sc.Text() + "\n")
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			go func() { _, _ = io.Copy(io.Discard, pipe) }()
			return m[1], b.String()
		}
	}
	t.Fatalf("oncommit serve %s did not start: %q", strings.Join(args, " "), b.String())
	return "", ""
}

// TestServeHosts: oncommit serve answers the host of --addr, localhost
// and the names of --allowed-hosts, and refuses others (421); it refuses
// --actions on an address that is not a loopback one unless
// --remote-actions, which it then warns about.
func TestServeHosts(t *testing.T) {
	d, _ := sqliteOutbox(t)
	addr, _ := d.serve(t, "--addr", "127.0.0.1:0", "--actions", "--allowed-hosts", "ops.example.com, ops2.example.com")
	_, port, _ := net.SplitHostPort(addr)
	for host, want := range map[string]int{
		addr: 200, "localhost:" + port: 200, "ops.example.com": 200, "OPS2.example.com:" + port: 200,
		"evil.example.com:" + port: http.StatusMisdirectedRequest,
	} {
		req, err := http.NewRequest("GET", "http://"+addr+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
	if _, errs, code := d.run(t, "serve", "--addr", "0.0.0.0:0", "--actions"); code != exitUsage || !strings.Contains(errs, "not a loopback address") || !strings.Contains(errs, "--remote-actions") {
		t.Errorf("serve --actions on 0.0.0.0: exit %d, %q", code, errs)
	}
	if _, errs, code := d.run(t, "serve", "--addr", "127.0.0.1:0", "--allowed-hosts", "ops.example.com:8443"); code != exitUsage || !strings.Contains(errs, "AllowedHosts") {
		t.Errorf("serve --allowed-hosts with a port: exit %d, %q", code, errs)
	}
	if _, errs := d.serve(t, "--addr", "0.0.0.0:0", "--actions", "--remote-actions"); !strings.Contains(errs, "level=WARN") || !strings.Contains(errs, "non-loopback address") {
		t.Errorf("serve --actions --remote-actions on 0.0.0.0: %q, want a warning", errs)
	}
	// Read-only on every address: no refusal.
	d.serve(t, "--addr", "0.0.0.0:0")
}

// TestOrderedState: on PostgreSQL, SQLite and MySQL/MariaDB, an operator
// sees ordered delivery's state: stats count blocked messages and keys
// (table and JSON), list takes --state blocked, show of a dead head says
// it halts its key, lists what waits behind it and names skip and
// redrive, show of a blocked message names its head; a delete of the
// halted head, of its key or of a blocked message changes nothing and
// says why (exit 1, not "nothing matched"), as does a skip of a blocked
// message; the redrive then goes through.
func TestOrderedState(t *testing.T) { eachDB(t, testOrderedState) }

func testOrderedState(t *testing.T, d db) {
	d.ok(t, 0, "migrate", "up")
	ob, err := outbox.New(d.dialect, outbox.Config{Table: d.table, OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	res := d.seed(t, ob,
		outbox.Message{Topic: "x", Key: "H"}, outbox.Message{Topic: "x", Key: "H"}, outbox.Message{Topic: "x", Key: "H"},
		outbox.Message{Topic: "y", Key: "G"}, outbox.Message{Topic: "y", Key: "G"})
	failAll(t, ob, d.pool, "x", 1) // H's head dies and halts H; G (no handler) waits
	head, blocked := res[0].ID.String(), res[1].ID.String()

	st := lines(t, d.ok(t, 0, "stats", "--json"))
	want := map[string]map[string]float64{
		"x": {"dead": 1, "blocked": 2, "blocked_keys": 1, "held_keys": 1, "pending": 0},
		"y": {"dead": 0, "blocked": 1, "blocked_keys": 0, "held_keys": 1, "pending": 1},
	}
	if len(st) != 2 {
		t.Fatalf("stats --json: %v", st)
	}
	for _, s := range st {
		for k, v := range want[s["topic"].(string)] {
			if s[k] != v {
				t.Errorf("stats --json, topic %v: %s = %v, want %v (%v)", s["topic"], k, s[k], v, s)
			}
		}
	}
	if x := st[0]; x["topic"] != "x" || !(x["oldest_blocked_key_seconds"] != nil && x["oldest_blocked_key_seconds"].(float64) > 0) {
		t.Errorf("stats --json: the oldest blocked key of x: %v", x)
	}
	out := d.ok(t, 0, "stats")
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if len(rows) != 3 || !strings.Contains(rows[0], "BLOCKED") || !strings.Contains(rows[0], "BLOCKED KEYS") || !strings.Contains(rows[0], "OLDEST BLOCKED KEY") {
		t.Errorf("stats:\n%s", out)
	} else if f := strings.Fields(rows[1]); len(f) != 9 || strings.Join(f[:8], " ") != "x 0 2 0 1 0 - 1" || f[8] == "-" {
		// x: pending 0, blocked 2, processing 0, dead 1, delivered 0,
		// oldest due -, blocked keys 1, an age.
		t.Errorf("stats row of x: %q", rows[1])
	}

	if got := lines(t, d.ok(t, 0, "list", "--state", "blocked", "--json")); len(got) != 3 || got[0]["id"] != blocked || got[0]["state"] != "blocked" || got[2]["key"] != "G" {
		t.Errorf("list --state blocked: %v", got)
	}
	if got := lines(t, d.ok(t, 0, "list", "--state", "blocked", "--key", "H", "--json")); len(got) != 2 {
		t.Errorf("list --state blocked --key H: %v", got)
	}

	sh := lines(t, d.ok(t, 0, "show", head, "--json"))[0]
	if sh["halts_key"] != true || sh["blocked_behind"] != 2.0 || sh["key_seq"] == nil {
		t.Errorf("show of the halted head --json: %v", sh)
	}
	out = d.ok(t, 0, "show", head)
	for _, w := range []string{"halts key:", "2 message(s) blocked behind it", "oncommit skip " + head, "oncommit redrive " + head, blocked, res[2].ID.String()} {
		if !strings.Contains(out, w) {
			t.Errorf("show of the halted head lacks %q:\n%s", w, out)
		}
	}
	if sb := lines(t, d.ok(t, 0, "show", blocked, "--json"))[0]; sb["waits_behind"] != head || sb["halts_key"] != nil {
		t.Errorf("show of a blocked message --json: %v", sb)
	}
	if out := d.ok(t, 0, "show", blocked); !strings.Contains(out, "waits behind:  "+head+" (dead), its key's head") {
		t.Errorf("show of a blocked message:\n%s", out)
	}

	// Refusals say why, and change nothing.
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"delete", head, "--yes"}, []string{"delete changes nothing: message " + head + " halts its ordered key", "skip it", "redrive it"}},
		{[]string{"delete", "--key", "H", "--yes"}, []string{"message " + head + " halts its ordered key", "2 messages (" + blocked + ", " + res[2].ID.String() + "), each: holds its place in its ordered key"}},
		{[]string{"delete", blocked, "--yes"}, []string{"message " + blocked + " holds its place in its ordered key"}},
		{[]string{"skip", blocked, "--yes"}, []string{"skip changes nothing: message " + blocked + " is blocked behind the head of its ordered key"}},
		{[]string{"redrive", blocked, "--yes"}, []string{"message " + blocked + " is blocked behind the head of its ordered key, not dead"}},
	} {
		_, errs, code := d.run(t, c.args...)
		if code != exitError || strings.Contains(errs, "nothing matched") {
			t.Errorf("oncommit %s: exit %d, %q; want exit 1 with a reason", strings.Join(c.args, " "), code, errs)
		}
		for _, w := range c.want {
			if !strings.Contains(errs, w) {
				t.Errorf("oncommit %s: %q lacks %q", strings.Join(c.args, " "), errs, w)
			}
		}
	}
	if n := count(t, ob, d, outbox.Filter{Key: "H"}); n != 3 {
		t.Fatalf("after the refused actions: %d messages of H, want 3", n)
	}
	dry := lines(t, d.ok(t, 0, "delete", "--key", "G", "--dry-run", "--json"))
	left, _ := dry[0]["left_alone"].([]any)
	var leftIDs []any
	if len(left) == 1 {
		leftIDs, _ = left[0].(map[string]any)["ids"].([]any)
	}
	if dry[0]["would_change"] != 0.0 || len(leftIDs) != 2 {
		t.Errorf("delete --key G --dry-run: %v", dry)
	}
	// What the refusal says to do works: the redrive makes the head pending
	// again, its key's others still behind it.
	if got := lines(t, d.ok(t, 0, "redrive", head, "--yes", "--json")); got[0]["changed"] != 1.0 {
		t.Errorf("redrive of the halted head: %v", got)
	}
	if sh := lines(t, d.ok(t, 0, "show", head, "--json"))[0]; sh["state"] != "pending" || sh["blocked_behind"] != 2.0 {
		t.Errorf("the head after its redrive: %v", sh)
	}
}

// TestMissingTable: every command but migrate, pointed at a table that
// does not exist, says so and which command creates it (exit 1), on each
// database.
func TestMissingTable(t *testing.T) {
	eachDB(t, func(t *testing.T, d db) {
		d.table = strings.TrimSuffix(d.table, "outbox") + "nosuch"
		for _, args := range [][]string{{"stats"}, {"list", "--state", "blocked"}, {"show", outbox.NewID().String()}, {"delete", "--topic", "x", "--yes"}, {"watch", "--count", "1"}} {
			_, errs, code := d.run(t, args...)
			want := "table " + d.table + " does not exist in this database: create it with oncommit migrate up --table " + d.table
			if code != exitError || !strings.Contains(errs, want) || !strings.Contains(errs, "outbox table does not exist") {
				t.Errorf("oncommit %s --table %s: exit %d, %q; want exit 1 and %q", strings.Join(args, " "), d.table, code, errs, want)
			}
		}
	})
}

// TestSubscribers: on PostgreSQL, SQLite and MySQL/MariaDB, an operator
// sees the subscribers of a topic with several (Config.Subscribers):
// stats has a row per subscriber (table and JSON), list and show name
// each copy's subscriber, --subscriber selects one subscriber's copies,
// and a redrive with --subscriber changes only that subscriber's dead
// copies.
func TestSubscribers(t *testing.T) { eachDB(t, testSubscribers) }

func testSubscribers(t *testing.T, d db) {
	d.ok(t, 0, "migrate", "up")
	ob, err := outbox.New(d.dialect, outbox.Config{Table: d.table, Subscribers: map[string][]string{"order.placed": {"mail", "fwd"}}})
	if err != nil {
		t.Fatal(err)
	}
	d.seed(t, ob,
		outbox.Message{Topic: "order.placed", Key: "k1", Payload: []byte(`{"n":1}`)},
		outbox.Message{Topic: "order.placed", Key: "k2", Payload: []byte(`{"n":2}`)},
		outbox.Message{Topic: "audit", Key: "a", Delay: time.Hour})
	// mail fails both copies, fwd fails k1's and delivers k2's: dead are
	// mail's two copies and fwd's of k1.
	r, err := ob.Relay(sqlDB(d), outbox.RelayConfig{MaxAttempts: 1, KeepDelivered: time.Hour, PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Subscribe("order.placed", "mail", func(context.Context, outbox.Delivery) error { return errors.New("smtp down") }); err != nil {
		t.Fatal(err)
	}
	if err := r.Subscribe("order.placed", "fwd", func(_ context.Context, dl outbox.Delivery) error {
		if dl.Key == "k1" {
			return errors.New("broker down")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		dead := count(t, ob, d, outbox.Filter{States: []outbox.State{outbox.StateDead}})
		delivered := count(t, ob, d, outbox.Filter{States: []outbox.State{outbox.StateDelivered}})
		if dead == 3 && delivered == 1 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("copies not settled in time: %d dead, %d delivered", dead, delivered)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// stats: a row per subscriber, after the topic without.
	st := lines(t, d.ok(t, 0, "stats", "--json"))
	type row struct {
		topic, sub      string
		dead, delivered float64
		pending         float64
	}
	want := []row{{"audit", "", 0, 0, 1}, {"order.placed", "fwd", 1, 1, 0}, {"order.placed", "mail", 2, 0, 0}}
	if len(st) != len(want) {
		t.Fatalf("stats --json: %v", st)
	}
	for i, w := range want {
		if s := st[i]; s["topic"] != w.topic || s["subscriber"] != w.sub || s["dead"] != w.dead || s["delivered"] != w.delivered || s["pending"] != w.pending {
			t.Errorf("stats --json row %d: %v, want %+v", i, s, w)
		}
	}
	out := d.ok(t, 0, "stats")
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if len(rows) != 4 || !strings.HasPrefix(rows[0], "TOPIC") || strings.Fields(rows[0])[1] != "SUBSCRIBER" {
		t.Fatalf("stats:\n%s", out)
	}
	// audit has no subscriber: its cell is blank (the next field is its
	// pending count).
	if f := strings.Fields(rows[1]); f[0] != "audit" || f[1] != "1" {
		t.Errorf("stats row of audit: %q", rows[1])
	}
	if f := strings.Fields(rows[3]); f[0] != "order.placed" || f[1] != "mail" || f[2] != "0" {
		t.Errorf("stats row of mail: %q", rows[3])
	}

	// list --subscriber: only mail's copies, the message's own key.
	mail := lines(t, d.ok(t, 0, "list", "--subscriber", "mail", "--json"))
	if len(mail) != 2 || mail[0]["subscriber"] != "mail" || mail[1]["subscriber"] != "mail" || mail[0]["key"] != "k1" || mail[1]["key"] != "k2" {
		t.Errorf("list --subscriber mail: %v", mail)
	}
	if got := lines(t, d.ok(t, 0, "list", "--subscriber", "fwd", "--key", "k1", "--json")); len(got) != 1 || got[0]["subscriber"] != "fwd" || got[0]["state"] != "dead" {
		t.Errorf("list --subscriber fwd --key k1: %v", got)
	}
	if got := lines(t, d.ok(t, 0, "list", "--topic", "audit", "--json")); len(got) != 1 || got[0]["subscriber"] != "" {
		t.Errorf("list --topic audit: %v, want subscriber \"\"", got)
	}
	out = d.ok(t, 0, "list", "--state", "dead")
	if rows := strings.Split(strings.TrimSpace(out), "\n"); len(rows) != 4 || strings.Fields(rows[0])[2] != "SUBSCRIBER" {
		t.Errorf("list --state dead:\n%s", out)
	} else if f := strings.Fields(rows[1]); f[1] != "order.placed" || (f[2] != "mail" && f[2] != "fwd") || f[3] != "k1" {
		t.Errorf("list --state dead, first row: %q", rows[1])
	}
	if out := d.ok(t, 0, "list", "--topic", "audit"); strings.Contains(out, "SUBSCRIBER") {
		t.Errorf("list of messages without subscribers has a SUBSCRIBER column:\n%s", out)
	}
	d.ok(t, exitNothing, "list", "--subscriber", "nobody")
	d.ok(t, exitUsage, "list", "--subscriber", "bad name")

	// show: the copy's subscriber.
	id := mail[0]["id"].(string)
	if sh := lines(t, d.ok(t, 0, "show", id, "--json")); sh[0]["subscriber"] != "mail" || sh[0]["key"] != "k1" {
		t.Errorf("show --json: %v", sh)
	}
	if out := d.ok(t, 0, "show", id); !strings.Contains(out, "subscriber:  mail\n") || !strings.Contains(out, "key:         k1\n") {
		t.Errorf("show:\n%s", out)
	}

	// redrive --subscriber mail: mail's two dead copies, not fwd's.
	if got := lines(t, d.ok(t, 0, "redrive", "--state", "dead", "--subscriber", "mail", "--dry-run", "--json")); got[0]["would_change"] != 2.0 || got[0]["filter"] != `state=dead subscriber="mail"` {
		t.Errorf("redrive --subscriber mail --dry-run: %v", got)
	}
	if got := lines(t, d.ok(t, 0, "redrive", "--state", "dead", "--topic", "order.placed", "--subscriber", "mail", "--yes", "--json")); got[0]["changed"] != 2.0 {
		t.Errorf("redrive --subscriber mail: %v", got)
	}
	if n := count(t, ob, d, outbox.Filter{Subscriber: "mail", States: []outbox.State{outbox.StatePending}}); n != 2 {
		t.Errorf("after the redrive: %d of mail's copies pending, want 2", n)
	}
	if dead := lines(t, d.ok(t, 0, "list", "--state", "dead", "--json")); len(dead) != 1 || dead[0]["subscriber"] != "fwd" || dead[0]["key"] != "k1" {
		t.Errorf("dead after the redrive: %v, want fwd's copy of k1 only", dead)
	}
	d.ok(t, exitNothing, "redrive", "--state", "dead", "--subscriber", "mail", "--yes")
}

// TestSubscriberShowOrdered: with ordered delivery, show of a
// subscriber's copy tells its place among that subscriber's copies of the
// key (which have an order of their own), not among the other's.
func TestSubscriberShowOrdered(t *testing.T) {
	d := sqliteDB(t)
	d.ok(t, 0, "migrate", "up")
	ob, err := outbox.New(sqlite.Dialect(), outbox.Config{OrderByKey: true, Subscribers: map[string][]string{"o": {"mail", "fwd"}}})
	if err != nil {
		t.Fatal(err)
	}
	d.seed(t, ob, outbox.Message{Topic: "o", Key: "k"}, outbox.Message{Topic: "o", Key: "k"})
	mail := lines(t, d.ok(t, 0, "list", "--subscriber", "mail", "--key", "k", "--json"))
	if len(mail) != 2 || mail[1]["state"] != "blocked" {
		t.Fatalf("list --subscriber mail --key k: %v", mail)
	}
	head, blocked := mail[0]["id"].(string), mail[1]["id"].(string)
	if sh := lines(t, d.ok(t, 0, "show", head, "--json"))[0]; sh["blocked_behind"] != 1.0 {
		t.Errorf("show of mail's head --json: %v, want 1 blocked behind it", sh)
	}
	if out := d.ok(t, 0, "show", blocked); !strings.Contains(out, "waits behind:  "+head+" (pending), its key's head") || !strings.Contains(out, "subscriber:    mail\n") {
		t.Errorf("show of mail's blocked copy:\n%s", out)
	}
}
