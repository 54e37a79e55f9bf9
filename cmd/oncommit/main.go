// Command oncommit is the operator's tool for an oncommit outbox table on
// PostgreSQL, SQLite or MySQL/MariaDB: migrate it, look at its counts and
// messages, redrive, retry, delete, skip and purge messages, watch it, and serve
// the web dashboard.
//
//	cd cmd/oncommit && go install .   # from a clone: no release is tagged yet
//	export OUTBOX_DSN=postgres://localhost/app
//	oncommit stats
//	oncommit list --state dead --topic order.placed
//	oncommit show 01890a5d-ac96-774b-bcce-b302099a8057
//	oncommit redrive --state dead --topic order.placed --yes
//	oncommit redrive --state dead --topic order.placed --subscriber mail --yes
//	oncommit skip 01890a5d-ac96-774b-bcce-b302099a8057 --yes
//	oncommit serve --addr 127.0.0.1:8080
//
// The DSN comes from --dsn, else OUTBOX_DSN, else DATABASE_URL; the
// database is told from it (postgres:// URLs, file: URIs or *.db files,
// user@tcp(host)/db) or named with --driver. Output is an aligned table,
// or one JSON object per line with --json.
//
// A topic with subscribers (outbox.Config.Subscribers) stores a copy of
// each message per subscriber, each with its own id, state and attempts.
// stats counts each subscriber's copies on a row of their own, list and
// show name the subscriber of each copy: a SUBSCRIBER column (a
// "subscriber:" line in show) when some message shown has one, and a
// "subscriber" field in JSON, "" for a message without. list and the
// actions take --subscriber NAME, beside --topic, to select only that
// subscriber's copies (with --key: its copies of that key's messages).
//
// Every command that changes messages (redrive, retry, delete, skip,
// purge) logs one line on stderr with who acted (--actor, by default
// cli:<the OS user>), the action, the filter and how many messages
// changed.
//
// Every command but migrate first checks the table: a table that does
// not exist, or lacks columns, is an error that says to run oncommit
// migrate up. An action that would leave every message it selects as it
// is (a delete of the dead head that halts an ordered key, a skip of a
// message that halts none...) changes nothing and says why.
//
// Exit codes: 0 done, 1 error (an action refused included), 2 usage (bad
// flags, or a destructive command without --yes when no terminal can
// confirm), 3 nothing matched (list, show, or an action whose filter
// selects no message).
//
// It parses its flags with the standard library's flag package: a handful
// of flags per subcommand needs no framework, and the tool adds no module
// beyond the database drivers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"
)

// Exit codes.
const (
	exitOK      = 0
	exitError   = 1
	exitUsage   = 2
	exitNothing = 3
)

// errNothing is returned when nothing matched.
var errNothing = errors.New("nothing matched")

type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErr(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// globals are the flags every subcommand takes.
type globals struct {
	dsn, driver, table string
	json               bool
}

func (g *globals) register(fs *flag.FlagSet) {
	dsn := os.Getenv("OUTBOX_DSN")
	if dsn == "" {
		dsn = os.Getenv("DATABASE_URL")
	}
	fs.StringVar(&g.dsn, "dsn", dsn, "database DSN (default $OUTBOX_DSN, else $DATABASE_URL)")
	fs.StringVar(&g.driver, "driver", "", "postgres, sqlite or mysql (default: told from the DSN)")
	fs.StringVar(&g.table, "table", "outbox", "outbox table: name or schema.name")
	fs.BoolVar(&g.json, "json", false, "one JSON object per line instead of a table")
}

// cli is one run of the tool.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// terminal reports whether stdin is a terminal a person can answer on.
	terminal bool
}

type command struct {
	name, args, help string
	run              func(ctx context.Context, c *cli, args []string) error
}

var commands []command

func init() {
	commands = []command{
		{"migrate", "up|down|status", "apply, revert the latest, or list the table's migrations", runMigrate},
		{"stats", "", "messages per topic and state, with the oldest due message's age", runStats},
		{"watch", "", "stats refreshed every second (like top) until interrupted", runWatch},
		{"list", "[filters]", "messages matching the filters, oldest first", runList},
		{"show", "ID", "one message with its payload, headers and last error", runShow},
		{"redrive", "[ID...] [filters]", "make dead messages pending, due now, with fresh attempts", runAct("redrive")},
		{"retry", "[ID...] [filters]", "make pending messages that wait for a retry or a delay due now", runAct("retry")},
		{"delete", "[ID...] [filters]", "delete messages (never one a handler is running)", runAct("delete")},
		{"skip", "[ID...] [filters]", "skip dead messages that halt their ordered key", runAct("skip")},
		{"purge", "[--older-than D] [--states dead,delivered]", "delete dead and delivered messages settled long ago", runPurge},
		{"serve", "[--addr A] [--actions]", "serve the web dashboard", runServe},
	}
}

func (c *cli) usage() {
	fmt.Fprintln(c.stderr, "usage: oncommit COMMAND [flags] [args]\n\ncommands:")
	for _, cmd := range commands {
		fmt.Fprintf(c.stderr, "  %-8s %-44s %s\n", cmd.name, cmd.args, cmd.help)
	}
	fmt.Fprintln(c.stderr, "\nevery command takes --dsn, --driver, --table and --json; oncommit COMMAND -h lists its flags.")
	fmt.Fprintln(c.stderr, "exit codes: 0 done, 1 error (an action refused included), 2 usage, 3 nothing matched.")
}

// run runs the tool with args (without the program name) and returns its
// exit code.
func (c *cli) run(ctx context.Context, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		c.usage()
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	for _, cmd := range commands {
		if cmd.name != args[0] {
			continue
		}
		err := cmd.run(ctx, c, args[1:])
		var ue *usageError
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, flag.ErrHelp):
			return exitOK
		case errors.As(err, &ue):
			fmt.Fprintf(c.stderr, "oncommit %s: %v\n", cmd.name, err)
			return exitUsage
		case errors.Is(err, errNothing):
			fmt.Fprintf(c.stderr, "oncommit %s: %v\n", cmd.name, err)
			return exitNothing
		default:
			fmt.Fprintf(c.stderr, "oncommit %s: %v\n", cmd.name, err)
			return exitError
		}
	}
	fmt.Fprintf(c.stderr, "oncommit: unknown command %q\n", args[0])
	c.usage()
	return exitUsage
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	c := &cli{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, terminal: term.IsTerminal(int(os.Stdin.Fd()))}
	code := c.run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
