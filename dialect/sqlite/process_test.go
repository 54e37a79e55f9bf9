package sqlite_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
)

const dsnOpts = "?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"

// TestTwoProcesses: two relays in separate processes on one SQLite file
// (WAL) deliver 5,000 messages, each exactly once, and neither logs an
// error (no SQLITE_BUSY reaches the user: the busy timeout absorbs the
// single-writer contention).
func TestTwoProcesses(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "shared.db")
	db, err := sql.Open("sqlite", "file:"+path+dsnOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlite.Migrate(context.Background(), db, ""); err != nil {
		t.Fatal(err)
	}
	ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{})
	const n = 5000
	batch := make([]outbox.Message, 1000)
	for i := range batch {
		batch[i] = outbox.Message{Topic: "t", Payload: []byte(`{"n":1}`)}
	}
	for range n / len(batch) {
		publish(t, db, ob, batch...)
	}

	type child struct {
		cmd    *exec.Cmd
		out    string
		stderr bytes.Buffer
	}
	var children []*child
	for i := range 2 {
		c := &child{out: filepath.Join(dir, fmt.Sprint("delivered-", i))}
		c.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperSQLiteRelay$", "-test.count=1")
		c.cmd.Env = append(os.Environ(), "OUTBOX_SQLITE_HELPER=1", "OUTBOX_SQLITE_PATH="+path, "OUTBOX_SQLITE_OUT="+c.out)
		c.cmd.Stderr = &c.stderr
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, c)
	}
	for _, c := range children {
		done := make(chan error, 1)
		go func() { done <- c.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("child: %v\n%s", err, c.stderr.String())
			}
		case <-time.After(60 * time.Second):
			c.cmd.Process.Kill()
			t.Fatalf("child did not finish\n%s", c.stderr.String())
		}
	}
	seen := map[string]int{}
	for _, c := range children {
		if strings.Contains(c.stderr.String(), "level=ERROR") {
			t.Errorf("a relay logged errors:\n%s", c.stderr.String())
		}
		f, err := os.Open(c.out)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		k := 0
		for sc.Scan() {
			seen[sc.Text()]++
			k++
		}
		f.Close()
		t.Logf("process %s delivered %d", filepath.Base(c.out), k)
	}
	if len(seen) != n {
		t.Errorf("%d distinct messages delivered, want %d", len(seen), n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("%s delivered %d times", id, k)
		}
	}
}

// TestHelperSQLiteRelay is a child process of TestTwoProcesses: a relay
// that writes the id of each delivery to a file and stops once the table
// has stayed empty for a moment.
func TestHelperSQLiteRelay(t *testing.T) {
	if os.Getenv("OUTBOX_SQLITE_HELPER") != "1" {
		return // not a child process
	}
	db, err := sql.Open("sqlite", "file:"+os.Getenv("OUTBOX_SQLITE_PATH")+dsnOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out, err := os.Create(os.Getenv("OUTBOX_SQLITE_OUT"))
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(out)
	var mu sync.Mutex
	ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{})
	r, err := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
		mu.Lock()
		fmt.Fprintln(w, d.ID)
		mu.Unlock()
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	empty := 0
	for empty < 5 {
		time.Sleep(100 * time.Millisecond)
		var left int
		if err := db.QueryRow(`SELECT count(*) FROM outbox`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			empty++
		} else {
			empty = 0
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	out.Close()
}
