// Package chaostest is the process-kill chaos test every dialect runs
// (RELIABILITY.md, row A2): publishers in child processes write a business
// row and its message in one transaction and are SIGKILLed at random,
// before, during or after COMMIT; four relays in child processes record
// every delivery in a ledger and are SIGKILLed every 200-800 ms and
// restarted; then one relay in the test process drains the table and a
// checker classifies every message: lost, unexpected, delivered more than
// once, and why each extra delivery happened.
//
// A dialect's test describes its database with a [Backend] and calls [Run].
// The child processes are the test binary itself, run again on the same
// test: [Run] notices it is a child (OUTBOX_CHAOS_ROLE) and plays its part
// instead. The short variant runs by default; OUTBOX_RELIABILITY=long runs
// the long one (60 s, 5,000 messages). OUTBOX_CHAOS_SEED replays a seed;
// OUTBOX_CHAOS_REPORT names a file the JSON figures are appended to.
package chaostest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/outbox"
)

// Topic is the topic of every message the chaos test publishes.
const Topic = "chaos"

// Target says where a test's database is: whatever its [Backend] needs to
// connect from a child process (a URL, a schema, a file). It crosses to the
// children as JSON. The ordered checker adds "pool" (a connection count)
// to the target it opens in the test process, for its producers: a
// backend with a pool of its own sizes it so.
type Target map[string]string

// Backend is one dialect and driver: how to make a database for a test and
// how to connect to it from any process.
type Backend struct {
	// Dialect is the outbox dialect.
	Dialect outbox.Dialect
	// Setup, in the test process only, makes a fresh, migrated database
	// (dropped when t ends) and says where it is.
	Setup func(t testing.TB) Target
	// Open connects to the target, in any process.
	Open func(ctx context.Context, target Target) (*Conn, error)
	// Lease is the relays' lease. Defaults to 3s: short, so that healing
	// is quick, and long enough that a relay starved of CPU (-race, a busy
	// CI machine) keeps its leases.
	Lease time.Duration
	// StreamDrained, for a dialect that streams messages beside the table
	// (outboxdriver.Streamer), is called once every publisher has stopped:
	// the function it returns reports whether the stream has settled
	// everything published until then. Healing waits for it as well as for
	// the table.
	StreamDrained func(ctx context.Context, c *Conn) (func() (bool, error), error)
}

// Conn is one process's connections to the test's database.
type Conn struct {
	// Table is the outbox table, for outbox.Config.Table.
	Table string
	// Business and Ledger name the tables the harness creates: the
	// business rows (written with the messages) and the deliveries.
	Business, Ledger string
	// Relay is the relays' DB.
	Relay outbox.DB
	// Begin opens a business transaction.
	Begin func(ctx context.Context) (Txn, error)
	// SQL runs autocommit statements on the database of Table and Business.
	SQL *sql.DB
	// LedgerSQL runs the ledger's autocommit statements. Nil means SQL.
	LedgerSQL *sql.DB
	// Rebind turns the harness's ? placeholders into the driver's. Nil
	// keeps them.
	Rebind func(q string) string
	// Close closes everything.
	Close func()
}

// Txn is an open business transaction.
type Txn struct {
	Tx       outbox.Tx
	Exec     func(ctx context.Context, q string, args ...any) error
	Commit   func() error
	Rollback func() error
}

// Dollar is a Rebind for PostgreSQL: the n-th ? becomes $n.
func Dollar(q string) string {
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (c *Conn) q(s string) string {
	if c.Rebind != nil {
		return c.Rebind(s)
	}
	return s
}

func (c *Conn) ledger() *sql.DB {
	if c.LedgerSQL != nil {
		return c.LedgerSQL
	}
	return c.SQL
}

// Options shape one run.
type Options struct {
	Duration   time.Duration // how long publishers publish and relays are killed (at least)
	Messages   int           // messages to publish over Duration (the run goes on, up to 3x Duration, until they are)
	Relays     int           // relay processes
	Publishers int           // publisher processes
	// KillMin and KillMax bound the pause between two relay kills.
	KillMin, KillMax time.Duration
	// PubKillMin and PubKillMax bound the pause between two publisher kills.
	PubKillMin, PubKillMax time.Duration
	// HandlerWork bounds the handler's simulated work (uniform in [0, it)).
	HandlerWork time.Duration
	// Seed seeds every random choice; 0 draws one.
	Seed uint64
	// Name and Mode label the report.
	Name, Mode string
}

// Short is the default run: a few seconds, a few hundred messages.
func Short() Options {
	return Options{Duration: 5 * time.Second, Messages: 400, Relays: 4, Publishers: 2,
		KillMin: 200 * time.Millisecond, KillMax: 800 * time.Millisecond,
		PubKillMin: 400 * time.Millisecond, PubKillMax: 1500 * time.Millisecond,
		HandlerWork: 5 * time.Millisecond, Mode: "short"}
}

// Long is the run behind OUTBOX_RELIABILITY=long: 60 s, 5,000 messages.
func Long() Options {
	o := Short()
	o.Duration, o.Messages, o.Mode = 60*time.Second, 5000, "long"
	return o
}

// FromEnv is Long under OUTBOX_RELIABILITY=long, else Short, with the seed
// of OUTBOX_CHAOS_SEED and the duration and messages of
// OUTBOX_CHAOS_DURATION and OUTBOX_CHAOS_MESSAGES when set.
func FromEnv() Options {
	o := Short()
	if os.Getenv("OUTBOX_RELIABILITY") == "long" {
		o = Long()
	}
	if s := os.Getenv("OUTBOX_CHAOS_SEED"); s != "" {
		o.Seed, _ = strconv.ParseUint(s, 10, 64)
	}
	if s := os.Getenv("OUTBOX_CHAOS_DURATION"); s != "" {
		if d, err := time.ParseDuration(s); err == nil {
			o.Duration, o.Mode = d, "custom"
		}
	}
	if s := os.Getenv("OUTBOX_CHAOS_MESSAGES"); s != "" {
		if n, err := strconv.Atoi(s); err == nil {
			o.Messages, o.Mode = n, "custom"
		}
	}
	return o
}

// Environment of the child processes.
const (
	envRole   = "OUTBOX_CHAOS_ROLE" // relay or publisher
	envTarget = "OUTBOX_CHAOS_TARGET"
	envChild  = "OUTBOX_CHAOS_CHILD" // index,serial,seed
	envRate   = "OUTBOX_CHAOS_RATE"  // publisher: transactions per second
	envWork   = "OUTBOX_CHAOS_WORK"  // relay: handler work bound
	envLease  = "OUTBOX_CHAOS_LEASE"
)

// Run runs the chaos test on b (or, in a child process, plays the child's
// part).
func Run(t *testing.T, b Backend, o Options) {
	if b.Lease == 0 {
		// 6 s: "no extra delivery that no kill explains" holds while no
		// live relay is starved for a lease. At 3 s, CI runs beside other
		// work (load average over 20, 60 s runs taking 180 s) lapsed
		// leases of live relays: 32 and 75 such extras in two runs.
		b.Lease = 6 * time.Second
	}
	if role := os.Getenv(envRole); role != "" {
		runChild(t, b, role)
		return
	}
	if o.Seed == 0 {
		o.Seed = rand.Uint64() >> 1
	}
	if o.Name == "" {
		o.Name = t.Name()
	}
	t.Logf("seed %d (replay with OUTBOX_CHAOS_SEED=%d)", o.Seed, o.Seed)
	rep := run(t, b, o)
	writeReport(t, rep)
	rep.check(t)
}

// writeReport logs rep as one JSON line and appends it to the file
// OUTBOX_CHAOS_REPORT names, if any.
func writeReport(t *testing.T, rep any) {
	line, _ := json.Marshal(rep)
	t.Logf("%s", line)
	if f := os.Getenv("OUTBOX_CHAOS_REPORT"); f != "" {
		if fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintf(fh, "%s\n", line)
			fh.Close()
		}
	}
}

// runPattern is the -test.run pattern that selects exactly t in a child.
func runPattern(t *testing.T) string {
	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// createTables makes the business and ledger tables.
func createTables(ctx context.Context, c *Conn) error {
	if _, err := c.SQL.ExecContext(ctx, `CREATE TABLE `+c.Business+` (id VARCHAR(64) NOT NULL PRIMARY KEY)`); err != nil {
		return fmt.Errorf("create business table: %w", err)
	}
	// kind: S when a handler starts, F when it finishes; proc: the serial
	// of the process that ran it (-1 for the healing relay); at_ns: when,
	// on the handler's clock (Unix ns: the processes share the machine's
	// clock, which the parent reads to time its kills).
	if _, err := c.ledger().ExecContext(ctx, `CREATE TABLE `+c.Ledger+` (id VARCHAR(64) NOT NULL, bkey VARCHAR(64) NOT NULL,
		attempt INT NOT NULL, kind CHAR(1) NOT NULL, proc INT NOT NULL, at_ns BIGINT NOT NULL)`); err != nil {
		return fmt.Errorf("create ledger table: %w", err)
	}
	return nil
}

// SQLBegin is a Conn.Begin for database/sql.
func SQLBegin(db *sql.DB) func(ctx context.Context) (Txn, error) {
	return func(ctx context.Context) (Txn, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return Txn{}, err
		}
		return Txn{Tx: sqltx.From(tx),
			Exec: func(ctx context.Context, q string, args ...any) error {
				_, err := tx.ExecContext(ctx, q, args...)
				return err
			},
			Commit:   tx.Commit,
			Rollback: tx.Rollback}, nil
	}
}
