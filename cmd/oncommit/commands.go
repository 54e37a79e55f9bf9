package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/oncommit/oncommit/dashboard"
	"github.com/oncommit/oncommit/internal/opfmt"
	"github.com/oncommit/oncommit/outbox"
)

// flagSet returns a flag set for command name with the global flags; its
// usage (oncommit COMMAND -h) says what the command does, then its flags.
func (c *cli) flagSet(name string, g *globals) *flag.FlagSet {
	fs := flag.NewFlagSet("oncommit "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() {
		for _, cmd := range commands {
			if cmd.name == name {
				fmt.Fprintf(c.stderr, "usage: oncommit %s %s\n\n%s.\n\nflags:\n", name, cmd.args, cmd.help)
			}
		}
		fs.PrintDefaults()
	}
	g.register(fs)
	return fs
}

// parse parses args, flags and arguments in any order.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageErr("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return rest, nil
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
}

// filterFlags are the flags that build an outbox.Filter.
type filterFlags struct {
	state, topic, subscriber, key, errText       string
	createdFrom, createdTo, settledFrom, settled string
}

func (f *filterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.state, "state", "", "states, comma-separated: pending, blocked (ordered, behind its key's head), processing, dead, delivered")
	fs.StringVar(&f.topic, "topic", "", "topic, exactly")
	fs.StringVar(&f.subscriber, "subscriber", "", "subscriber, exactly: only its copies of the messages of topics with subscribers (with --key: its copies of that key's messages)")
	fs.StringVar(&f.key, "key", "", "message key, exactly")
	fs.StringVar(&f.errText, "error", "", "text the last error contains (case-sensitive)")
	fs.StringVar(&f.createdFrom, "created-from", "", "created at or after (RFC 3339 time, or a duration such as 1h: that long ago)")
	fs.StringVar(&f.createdTo, "created-to", "", "created before (time or duration ago)")
	fs.StringVar(&f.settledFrom, "settled-from", "", "settled (dead-lettered, delivered) at or after (time or duration ago)")
	fs.StringVar(&f.settled, "settled-to", "", "settled before (time or duration ago)")
}

// when parses an RFC 3339 time, or a duration before now.
func when(flagName, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, usageErr("--%s %q: want a time such as 2026-01-02T15:04:05Z or a duration such as 30m", flagName, s)
	}
	return t, nil
}

// filter builds the filter of the flags and the ids given as arguments.
func (f *filterFlags) filter(ids []string) (outbox.Filter, error) {
	out := outbox.Filter{Topic: f.topic, Subscriber: f.subscriber, Key: f.key, ErrorContains: f.errText}
	for _, s := range ids {
		id, err := outbox.ParseID(s)
		if err != nil {
			return out, usageErr("%v", err)
		}
		out.IDs = append(out.IDs, id)
	}
	if f.state != "" {
		for _, s := range strings.Split(f.state, ",") {
			out.States = append(out.States, outbox.State(strings.TrimSpace(s)))
		}
	}
	var err error
	for _, c := range []struct {
		name, s string
		to      *time.Time
	}{{"created-from", f.createdFrom, &out.CreatedFrom}, {"created-to", f.createdTo, &out.CreatedTo}, {"settled-from", f.settledFrom, &out.SettledFrom}, {"settled-to", f.settled, &out.SettledTo}} {
		if *c.to, err = when(c.name, c.s); err != nil {
			return out, err
		}
	}
	return out, nil
}

// asUsage turns a filter the outbox package refused into a usage error.
func asUsage(err error) error {
	var fe *outbox.FilterError
	if errors.As(err, &fe) {
		return usageErr("%v", err)
	}
	return err
}

// connect parses the flags and opens the target.
func connect(ctx context.Context, c *cli, name string, args []string, extra func(fs *flag.FlagSet)) (*target, *globals, []string, error) {
	g := &globals{}
	fs := c.flagSet(name, g)
	if extra != nil {
		extra(fs)
	}
	rest, err := parse(fs, args)
	if err != nil {
		return nil, nil, nil, err
	}
	t, err := open(ctx, g)
	if err != nil {
		return nil, nil, nil, err
	}
	if name != "migrate" {
		if err := t.check(ctx); err != nil {
			t.Close()
			return nil, nil, nil, err
		}
	}
	return t, g, rest, nil
}

// check checks the table before a command reads it: one that does not
// exist, or lacks columns, is an error saying which migrate command
// makes it right.
func (t *target) check(ctx context.Context) error {
	err := t.ob.Check(ctx, t.odb)
	switch {
	case errors.Is(err, outbox.ErrTableMissing):
		return fmt.Errorf("table %s does not exist in this database: create it with oncommit migrate up --table %s (%w)", t.table, t.table, err)
	case errors.Is(err, outbox.ErrSchemaMismatch):
		return fmt.Errorf("table %s lacks columns this oncommit needs: apply the newer migrations with oncommit migrate up --table %s (%w)", t.table, t.table, err)
	}
	return err
}

func runMigrate(ctx context.Context, c *cli, args []string) error {
	var yes bool
	t, g, rest, err := connect(ctx, c, "migrate", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&yes, "yes", false, "migrate down: revert the latest migration (without it, down says what it would drop and changes nothing)")
	})
	if err != nil {
		return err
	}
	defer t.Close()
	if len(rest) != 1 {
		return usageErr("want migrate up, migrate down or migrate status")
	}
	switch rest[0] {
	case "up":
		before, err := t.applied(ctx)
		if err != nil {
			return err
		}
		if err := t.migrateUp(ctx); err != nil {
			return err
		}
		after, err := t.applied(ctx)
		if err != nil {
			return err
		}
		out := newOut(c.stdout, g.json, "applied", "")
		migs, _, _, _ := t.migrationSet()
		for _, m := range migs {
			if after[m.Version] && !before[m.Version] {
				out.row(map[string]any{"version": m.Version, "name": m.Name, "applied": true}, fmt.Sprintf("%04d_%s", m.Version, m.Name), "")
			}
		}
		return out.flush()
	case "down":
		m, drops, err := t.latestApplied(ctx)
		if err != nil {
			return err
		}
		if !yes {
			n, err := t.undelivered(ctx)
			if err != nil {
				return err
			}
			if drops {
				return usageErr("not confirmed: migrate down would revert %04d_%s, which drops table %s and the %d undelivered message(s) in it; pass --yes to revert it", m.Version, m.Name, t.table, n)
			}
			return usageErr("not confirmed: migrate down would revert %04d_%s (table %s and its %d undelivered message(s) stay); pass --yes to revert it", m.Version, m.Name, t.table, n)
		}
		if err := t.migrateDown(ctx, m); err != nil {
			return err
		}
		out := newOut(c.stdout, g.json, "reverted", "")
		out.row(map[string]any{"version": m.Version, "name": m.Name, "applied": false}, fmt.Sprintf("%04d_%s", m.Version, m.Name), "")
		return out.flush()
	case "status":
		migs, _, _, err := t.migrationSet()
		if err != nil {
			return err
		}
		done, err := t.applied(ctx)
		if err != nil {
			return err
		}
		out := newOut(c.stdout, g.json, "MIGRATION", "APPLIED")
		for _, m := range migs {
			out.row(map[string]any{"version": m.Version, "name": m.Name, "applied": done[m.Version]}, fmt.Sprintf("%04d_%s", m.Version, m.Name), yesNo(done[m.Version]))
		}
		return out.flush()
	}
	return usageErr("want migrate up, migrate down or migrate status, not %q", rest[0])
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func age(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
}

// writeStats writes the stats of each topic, one row per subscriber of a
// topic with subscribers (the SUBSCRIBER column is in a table only when
// some row has one; "subscriber" is "" in JSON for a topic without);
// ordered adds the columns of ordered delivery: the blocked messages, the
// keys a failed head blocks (dead under HaltKey, or waiting for a retry)
// and the age of the oldest such head (held keys too, in JSON).
func writeStats(w io.Writer, asJSON, ordered bool, st []outbox.TopicStats) error {
	header := []any{"TOPIC", "SUBSCRIBER", "PENDING", "PROCESSING", "DEAD", "DELIVERED", "OLDEST DUE"}
	if ordered {
		header = []any{"TOPIC", "SUBSCRIBER", "PENDING", "BLOCKED", "PROCESSING", "DEAD", "DELIVERED", "OLDEST DUE", "BLOCKED KEYS", "OLDEST BLOCKED KEY"}
	}
	out := newOut(w, asJSON, header...)
	out.optional("SUBSCRIBER")
	for _, s := range st {
		obj := map[string]any{"topic": s.Topic, "subscriber": s.Subscriber, "pending": s.Pending, "processing": s.Processing, "dead": s.Dead, "delivered": s.Delivered, "oldest_due_seconds": s.OldestPending.Seconds()}
		if !ordered {
			out.row(obj, s.Topic, s.Subscriber, s.Pending, s.Processing, s.Dead, s.Delivered, age(s.OldestPending))
			continue
		}
		obj["blocked"], obj["held_keys"], obj["blocked_keys"], obj["oldest_blocked_key_seconds"] = s.Blocked, s.HeldKeys, s.BlockedKeys, s.OldestBlockedKey.Seconds()
		out.row(obj, s.Topic, s.Subscriber, s.Pending, s.Blocked, s.Processing, s.Dead, s.Delivered, age(s.OldestPending), s.BlockedKeys, age(s.OldestBlockedKey))
	}
	return out.flush()
}

func runStats(ctx context.Context, c *cli, args []string) error {
	t, g, rest, err := connect(ctx, c, "stats", args, nil)
	if err != nil {
		return err
	}
	defer t.Close()
	if len(rest) > 0 {
		return usageErr("stats takes no arguments")
	}
	st, err := t.ob.Stats(ctx, t.odb)
	if err != nil {
		return err
	}
	return writeStats(c.stdout, g.json, t.ob.OrdersByKey(), st)
}

func runWatch(ctx context.Context, c *cli, args []string) error {
	var every time.Duration
	var times int
	t, g, _, err := connect(ctx, c, "watch", args, func(fs *flag.FlagSet) {
		fs.DurationVar(&every, "interval", time.Second, "refresh interval")
		fs.IntVar(&times, "count", 0, "stop after this many refreshes (0: until interrupted)")
	})
	if err != nil {
		return err
	}
	defer t.Close()
	for i := 0; times == 0 || i < times; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(every):
			}
		}
		st, err := t.ob.Stats(ctx, t.odb)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if !g.json {
			fmt.Fprintf(c.stdout, "\033[H\033[2J%s  %s  every %v\n\n", time.Now().Format(time.TimeOnly), t.table, every)
		}
		if err := writeStats(c.stdout, g.json, t.ob.OrdersByKey(), st); err != nil {
			return err
		}
	}
	return nil
}

func messageJSON(m outbox.MessageInfo) map[string]any {
	o := map[string]any{"id": m.ID.String(), "topic": m.Topic, "subscriber": m.Subscriber, "key": m.Key, "state": m.State, "attempt": m.Attempts - m.AttemptsBase,
		"attempts": m.Attempts, "created_at": m.CreatedAt, "available_at": m.AvailableAt, "last_error": m.LastError}
	if !m.SettledAt.IsZero() {
		o["settled_at"] = m.SettledAt
	}
	if m.DedupKey != "" {
		o["dedup_key"] = m.DedupKey
	}
	if m.Payload != nil {
		o["payload"] = json.RawMessage(m.Payload)
	}
	if m.Headers != nil {
		o["headers"] = json.RawMessage(m.Headers)
	}
	if m.KeySeq != 0 {
		o["key_seq"] = m.KeySeq
	}
	return o
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func runList(ctx context.Context, c *cli, args []string) error {
	var ff filterFlags
	var limit int
	var after string
	var all bool
	t, g, rest, err := connect(ctx, c, "list", args, func(fs *flag.FlagSet) {
		ff.register(fs)
		fs.IntVar(&limit, "limit", outbox.DefaultPageSize, "messages per page (at most 1000)")
		fs.StringVar(&after, "after", "", "list messages after this id (the cursor printed after a page)")
		fs.BoolVar(&all, "all", false, "every page, not only the first")
	})
	if err != nil {
		return err
	}
	defer t.Close()
	f, err := ff.filter(rest)
	if err != nil {
		return err
	}
	if after != "" {
		if f.After, err = outbox.ParseID(after); err != nil {
			return usageErr("--after: %v", err)
		}
	}
	out := newOut(c.stdout, g.json, "ID", "TOPIC", "SUBSCRIBER", "KEY", "STATE", "ATTEMPT", "CREATED", "LAST ERROR")
	out.optional("SUBSCRIBER")
	n := 0
	for {
		p, err := t.ob.List(ctx, t.odb, f, limit)
		if err != nil {
			return asUsage(err)
		}
		for _, m := range p.Messages {
			n++
			out.row(messageJSON(m), m.ID, m.Topic, m.Subscriber, m.Key, m.State, m.Attempts-m.AttemptsBase, m.CreatedAt.UTC().Format("2006-01-02 15:04:05"), oneLine(m.LastError, 60))
		}
		if p.Next.IsZero() {
			break
		}
		if !all {
			if err := out.flush(); err != nil {
				return err
			}
			fmt.Fprintf(c.stderr, "more: --after %s\n", p.Next)
			return nil
		}
		f.After = p.Next
	}
	if err := out.flush(); err != nil {
		return err
	}
	if n == 0 {
		return errNothing
	}
	return nil
}

func runShow(ctx context.Context, c *cli, args []string) error {
	t, g, rest, err := connect(ctx, c, "show", args, nil)
	if err != nil {
		return err
	}
	defer t.Close()
	if len(rest) != 1 {
		return usageErr("want show ID")
	}
	id, err := outbox.ParseID(rest[0])
	if err != nil {
		return usageErr("%v", err)
	}
	m, err := t.ob.Get(ctx, t.odb, id)
	if errors.Is(err, outbox.ErrNotFound) {
		return fmt.Errorf("%w: no message %s", errNothing, id)
	}
	if err != nil {
		return err
	}
	kp, err := placeInKey(ctx, t, m)
	if err != nil {
		return err
	}
	if g.json {
		o := messageJSON(m)
		if m.KeySeq != 0 && m.State == outbox.StateDead {
			o["halts_key"] = m.HaltsKey()
		}
		if kp.head {
			o["blocked_behind"] = kp.behind
		}
		if kp.waitsOn != nil {
			o["waits_behind"] = kp.waitsOn.ID.String()
		}
		return json.NewEncoder(c.stdout).Encode(o)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	settled := "never"
	if !m.SettledAt.IsZero() {
		settled = m.SettledAt.UTC().Format(time.RFC3339Nano)
	}
	kvs := [][2]string{
		{"id", m.ID.String()}, {"topic", m.Topic}, {"key", m.Key}, {"state", string(m.State)},
	}
	if m.Subscriber != "" {
		kvs = slices.Insert(kvs, 2, [2]string{"subscriber", m.Subscriber})
	}
	kvs = append(kvs, [][2]string{
		{"attempt", fmt.Sprintf("%d (%d claims in all)", m.Attempts-m.AttemptsBase, m.Attempts)},
		{"created", m.CreatedAt.UTC().Format(time.RFC3339Nano)}, {"available", m.AvailableAt.UTC().Format(time.RFC3339Nano)},
		{"settled", settled}, {"dedup key", m.DedupKey}, {"last error", m.LastError},
	}...)
	if m.KeySeq != 0 {
		kvs = append(kvs, [2]string{"ordered", fmt.Sprintf("place %d in its key", m.KeySeq)})
	}
	switch {
	case m.HaltsKey():
		kvs = append(kvs, [2]string{"halts key", fmt.Sprintf("yes: its key waits, %d message(s) blocked behind it, until it is skipped (oncommit skip %s: the key goes on without it) or redriven (oncommit redrive %s: delivered again, first)", kp.behind, m.ID, m.ID)})
	case kp.head:
		kvs = append(kvs, [2]string{"behind it", fmt.Sprintf("%d message(s) of its key, blocked", kp.behind)})
	case kp.waitsOn != nil:
		kvs = append(kvs, [2]string{"waits behind", fmt.Sprintf("%s (%s), its key's head", kp.waitsOn.ID, kp.waitsOn.State)})
	}
	for _, kv := range kvs {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], printable(kv[1], false))
	}
	for i, b := range kp.first {
		label := ""
		if i == 0 {
			label = "blocked:"
		}
		fmt.Fprintf(tw, "%s\t%s  %s  %s\n", label, b.ID, printable(b.Topic, false), b.CreatedAt.UTC().Format("2006-01-02 15:04:05"))
	}
	if kp.behind > int64(len(kp.first)) {
		sub := ""
		if m.Subscriber != "" {
			sub = " --subscriber " + m.Subscriber
		}
		fmt.Fprintf(tw, "\t(%d more: oncommit list --state blocked%s --key %q)\n", kp.behind-int64(len(kp.first)), sub, m.Key)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "headers:\n%s\npayload:\n%s\n", printable(pretty(m.Headers), true), printable(pretty(m.Payload), true))
	return nil
}

// showBehind is how many of the messages blocked behind a head show
// lists.
const showBehind = 10

// keyPlace is an ordered message's place in its key, as show tells it.
type keyPlace struct {
	// head: the message is its key's head (pending, processing, or dead
	// halting the key); behind counts the messages blocked behind it,
	// first lists the first of them.
	head   bool
	behind int64
	first  []outbox.MessageInfo
	// waitsOn is the head a blocked message waits behind.
	waitsOn *outbox.MessageInfo
}

// placeInKey reads m's place in its key (a subscriber's copy: in its
// subscriber's order of the key): the messages behind a head, or the head
// a blocked message waits behind. An unordered message has none.
func placeInKey(ctx context.Context, t *target, m outbox.MessageInfo) (keyPlace, error) {
	var kp keyPlace
	if m.KeySeq == 0 || (m.Subscriber != "" && m.Key == "") {
		return kp, nil
	}
	ks, err := t.ob.SubscriberKeyState(ctx, t.odb, m.Subscriber, m.Key)
	if err != nil {
		return kp, err
	}
	switch {
	case m.State == outbox.StateBlocked && !ks.Head.ID.IsZero():
		kp.waitsOn = &ks.Head
	case ks.Head.ID == m.ID:
		kp.head, kp.behind = true, ks.Blocked
	}
	if kp.behind > 0 {
		p, err := t.ob.List(ctx, t.odb, outbox.Filter{Key: m.Key, Subscriber: m.Subscriber, States: []outbox.State{outbox.StateBlocked}}, showBehind)
		kp.first = p.Messages
		return kp, err
	}
	return kp, nil
}

func pretty(b []byte) string {
	if b == nil {
		return "  (none)"
	}
	var v any
	if json.Unmarshal(b, &v) != nil {
		return "  " + string(b)
	}
	p, _ := json.MarshalIndent(v, "  ", "  ")
	return "  " + string(p)
}

var actionsByName = map[string]outbox.Action{"redrive": outbox.ActRedrive, "retry": outbox.ActRetry, "delete": outbox.ActDelete, "skip": outbox.ActSkip}

// defaultActor is who acts when --actor is not given: cli:<the OS user>.
func defaultActor() string {
	name := ""
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if name == "" {
		name = os.Getenv("USER")
	}
	if name == "" {
		return "cli"
	}
	return "cli:" + name
}

// actionLog is the logger of the actions' lines: text on stderr.
func (c *cli) actionLog() *slog.Logger { return slog.New(slog.NewTextHandler(c.stderr, nil)) }

// confirm asks on the terminal; without one, --yes is required.
func (c *cli) confirm(question string, yes bool) error {
	if yes {
		return nil
	}
	if !c.terminal {
		return usageErr("%s: not confirmed; pass --yes (no terminal to ask on) or --dry-run", question)
	}
	fmt.Fprintf(c.stderr, "%s [y/N] ", question)
	line, _ := bufio.NewReader(c.stdin).ReadString('\n')
	if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
		return fmt.Errorf("not confirmed")
	}
	return nil
}

func runAct(name string) func(ctx context.Context, c *cli, args []string) error {
	return func(ctx context.Context, c *cli, args []string) error {
		var ff filterFlags
		var yes, dry bool
		var actor string
		t, g, rest, err := connect(ctx, c, name, args, func(fs *flag.FlagSet) {
			ff.register(fs)
			fs.BoolVar(&yes, "yes", false, "do not ask for confirmation")
			fs.BoolVar(&dry, "dry-run", false, "print what would change, change nothing")
			fs.StringVar(&actor, "actor", defaultActor(), "who acts, for the log line")
		})
		if err != nil {
			return err
		}
		defer t.Close()
		a := actionsByName[name]
		f, err := ff.filter(rest)
		if err != nil {
			return err
		}
		if a == outbox.ActSkip && !t.ob.OrdersByKey() {
			if !t.dialect.Capabilities().Ordered {
				return fmt.Errorf("%w: skip needs ordered delivery, which the %s dialect does not have", outbox.ErrUnsupported, t.dialect.Name())
			}
			// See open: a name too long for its keys table.
			return fmt.Errorf("%w: skip needs ordered delivery, which table %s cannot have (its name is too long for its keys table)", outbox.ErrUnsupported, t.table)
		}
		// The messages the action would change now (for retry: pending
		// ones, due or not; for skip: dead ones that halt their key): the
		// count asked about, and all the action may change once confirmed;
		// and those of the selection it leaves alone, with why.
		plan, err := t.ob.Plan(ctx, t.odb, a, f)
		if err != nil {
			return asUsage(err)
		}
		ids, n, what := plan.IDs, len(plan.IDs), opfmt.Filter(f)
		left := leftAlone(plan.Refused)
		if dry {
			out := newOut(c.stdout, g.json, "ACTION", "FILTER", "WOULD CHANGE")
			out.row(map[string]any{"action": name, "filter": what, "dry_run": true, "would_change": n, "left_alone": left}, name, what, n)
			if !g.json {
				c.tellLeft(plan.Refused)
			}
			return out.flush()
		}
		if n == 0 {
			if len(plan.Refused) > 0 {
				return fmt.Errorf("%s changes nothing: %s", name, describeLeft(plan.Refused, "; "))
			}
			return fmt.Errorf("%w: no message matching %s is in a state %s changes", errNothing, what, name)
		}
		c.tellLeft(plan.Refused)
		if err := c.confirm(fmt.Sprintf("%s %d message(s) matching %s?", name, n, what), yes); err != nil {
			return err
		}
		changed, err := t.ob.ActOn(ctx, t.odb, a, f, ids, &outbox.ActOptions{Actor: actor, Logger: c.actionLog()})
		if err != nil {
			return asUsage(err)
		}
		out := newOut(c.stdout, g.json, "ACTION", "FILTER", "CHANGED")
		out.row(map[string]any{"action": name, "filter": what, "changed": changed, "left_alone": left}, name, what, changed)
		if err := out.flush(); err != nil {
			return err
		}
		if changed == 0 {
			return fmt.Errorf("%w: the %d message(s) counted changed state meanwhile (a relay or another operator took them)", errNothing, n)
		}
		return nil
	}
}

// leftAlone returns the refusals of a plan for --json: one object per
// reason, with its ids.
func leftAlone(rs []outbox.Refusal) []map[string]any {
	out := []map[string]any{}
	for _, r := range rs {
		ids := make([]string, len(r.IDs))
		for i, id := range r.IDs {
			ids[i] = id.String()
		}
		out = append(out, map[string]any{"reason": r.Reason, "ids": ids})
	}
	return out
}

// describeLeft says, for each reason, which messages an action leaves
// alone and why: "message ID halts its ordered key: ..." or "3 messages
// (ID, ID, ID) each hold...", naming at most a few ids.
func describeLeft(rs []outbox.Refusal, sep string) string {
	var b []string
	for _, r := range rs {
		if len(r.IDs) == 1 {
			b = append(b, fmt.Sprintf("message %s %s", r.IDs[0], r.Reason))
			continue
		}
		ids := make([]string, 0, 3)
		for _, id := range r.IDs[:min(3, len(r.IDs))] {
			ids = append(ids, id.String())
		}
		more := ""
		if len(r.IDs) > 3 {
			more = fmt.Sprintf(" and %d more", len(r.IDs)-3)
		}
		b = append(b, fmt.Sprintf("%d messages (%s%s), each: %s", len(r.IDs), strings.Join(ids, ", "), more, r.Reason))
	}
	return strings.Join(b, sep)
}

// tellLeft writes on stderr, one line per reason, the messages an action
// leaves alone and why.
func (c *cli) tellLeft(rs []outbox.Refusal) {
	if len(rs) > 0 {
		fmt.Fprintf(c.stderr, "left alone: %s\n", describeLeft(rs, "\nleft alone: "))
	}
}

func runPurge(ctx context.Context, c *cli, args []string) error {
	var olderThan time.Duration
	var states string
	var yes, dry bool
	var actor string
	t, g, rest, err := connect(ctx, c, "purge", args, func(fs *flag.FlagSet) {
		fs.DurationVar(&olderThan, "older-than", 7*24*time.Hour, "keep messages settled more recently")
		fs.StringVar(&states, "states", "dead,delivered", "terminal states to purge")
		fs.BoolVar(&yes, "yes", false, "do not ask for confirmation")
		fs.BoolVar(&dry, "dry-run", false, "print how many would be deleted, delete nothing")
		fs.StringVar(&actor, "actor", defaultActor(), "who acts, for the log line")
	})
	if err != nil {
		return err
	}
	defer t.Close()
	if len(rest) > 0 {
		return usageErr("purge takes no arguments")
	}
	if olderThan < 0 {
		return usageErr("--older-than %v: must not be negative", olderThan)
	}
	var ss []outbox.State
	for _, s := range strings.Split(states, ",") {
		ss = append(ss, outbox.State(strings.TrimSpace(s)))
	}
	asOf := time.Now()
	f := outbox.Filter{States: ss, SettledTo: asOf.Add(-olderThan)}
	n, err := t.ob.Count(ctx, t.odb, f)
	if err != nil {
		return asUsage(err)
	}
	what := opfmt.Purge(ss, olderThan)
	if dry {
		out := newOut(c.stdout, g.json, "ACTION", "FILTER", "WOULD CHANGE")
		out.row(map[string]any{"action": "purge", "filter": what, "dry_run": true, "would_change": n}, "purge", what, n)
		return out.flush()
	}
	if err := c.confirm(fmt.Sprintf("purge %d message(s), %s?", n, what), yes); err != nil {
		return err
	}
	// The messages counted: settled before asOf less the age, rounded up
	// (none that grew old enough while the question was asked).
	olderThan = (olderThan + time.Since(asOf) + time.Millisecond - 1).Truncate(time.Millisecond)
	deleted, err := t.ob.Purge(ctx, t.odb, outbox.PurgeOptions{States: ss, OlderThan: olderThan,
		Operator: &outbox.ActOptions{Actor: actor, Logger: c.actionLog()}})
	if err != nil {
		var ce *outbox.ConfigError
		if errors.As(err, &ce) {
			return usageErr("%v", err)
		}
		return err
	}
	out := newOut(c.stdout, g.json, "ACTION", "FILTER", "CHANGED")
	out.row(map[string]any{"action": "purge", "filter": what, "changed": deleted}, "purge", what, deleted)
	if err := out.flush(); err != nil {
		return err
	}
	if deleted == 0 {
		return errNothing
	}
	return nil
}

// splitList returns the comma-separated items of s, trimmed, without
// empty ones.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

func runServe(ctx context.Context, c *cli, args []string) error {
	var addr, title, hosts string
	var actions, remote bool
	t, _, rest, err := connect(ctx, c, "serve", args, func(fs *flag.FlagSet) {
		fs.StringVar(&addr, "addr", "127.0.0.1:8080", "listen address (the dashboard has no authentication of its own: keep it on localhost or behind a proxy that has)")
		fs.BoolVar(&actions, "actions", false, "enable the redrive, retry, delete, skip and purge buttons (on a loopback address only, unless --remote-actions)")
		fs.BoolVar(&remote, "remote-actions", false, "allow --actions on an address that is not a loopback one: only behind a proxy that authenticates every request")
		fs.StringVar(&hosts, "allowed-hosts", "", "host names the dashboard is reached by, comma-separated, beyond localhost, the loopback addresses, the address it serves on and the host of --addr (\"*\": any, when a proxy checks the Host)")
		fs.StringVar(&title, "title", "", "page title (default: Outbox)")
	})
	if err != nil {
		return err
	}
	defer t.Close()
	if len(rest) > 0 {
		return usageErr("serve takes no arguments")
	}
	allowed := splitList(hosts)
	if h, _, err := net.SplitHostPort(addr); err == nil && h != "" {
		allowed = append(allowed, h) // the name (or address) of --addr
	}
	log := slog.New(slog.NewTextHandler(c.stderr, nil))
	dash, err := dashboard.New(dashboard.Config{Outbox: t.ob, DB: t.odb, Actions: actions, AllowedHosts: allowed, Logger: log, Title: title,
		Actor: func(r *http.Request) string { return "dashboard " + r.RemoteAddr }})
	if err != nil {
		var ce *outbox.ConfigError
		if errors.As(err, &ce) {
			return usageErr("--allowed-hosts: %v", err)
		}
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if ip := ln.Addr().(*net.TCPAddr).IP; actions && !ip.IsLoopback() {
		if !remote {
			ln.Close()
			return usageErr("--actions on %s, not a loopback address: the dashboard has no authentication of its own, so whoever reaches it could redrive, delete and purge messages; serve it on 127.0.0.1 (reach it through an SSH tunnel), or pass --remote-actions when a proxy in front authenticates every request", ln.Addr())
		}
		log.Warn("oncommit: dashboard actions served on a non-loopback address without authentication of their own (--remote-actions): only a proxy in front that authenticates every request keeps others out", "addr", ln.Addr().String())
	}
	mux := http.NewServeMux()
	mux.Handle("/", dash)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(c.stderr, "oncommit: dashboard of %s on http://%s/ (%s)\n", t.table, ln.Addr(), map[bool]string{true: "actions enabled", false: "read-only"}[actions])
	go func() {
		tick := time.NewTicker(dashboard.DefaultSampleEvery)
		defer tick.Stop()
		for {
			_ = dash.Sample(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
