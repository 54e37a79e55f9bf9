package chaostest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

// This file is the checker of ordered delivery (issue 15): relays in child
// processes deliver messages published with Config.OrderByKey by
// concurrent producers whose transactions on one key overlap; a few keys
// have a poison message that is dead-lettered under the Halt policy. The
// checker reads a ledger the handlers write on their own connections and
// asserts, per key: successful deliveries in commit order with no gap,
// never two deliveries in flight at once (but a killed relay's), nothing
// lost, nothing delivered that was rolled back, Halt blocking exactly its
// keys, and the order restored by a redrive.
//
// The commit order comes from the business side, independently of the
// outbox: each transaction publishes its messages, then increments its
// keys' versions in an aggregate table (UPDATE ... RETURNING, whose row
// lock orders same-key transactions by commit) and records each message's
// version.

// OrderedOptions shape one run of the ordered checker.
type OrderedOptions struct {
	Keys, PerKey int // messages: Keys x PerKey
	Producers    int // goroutines publishing in this process
	Relays       int // relay processes
	// Kill SIGKILLs a random relay every 200-800 ms while producers run,
	// and restarts it.
	Kill bool
	// ErrorRate is the share of handler calls that fail (and are retried).
	ErrorRate float64
	// HaltKeys are keys whose fifth message is dead-lettered until the
	// run heals, under the Halt policy.
	HaltKeys int
	// RollbackRate is the share of producer transactions rolled back.
	RollbackRate float64
	Seed         uint64
	Mode         string
}

// OrderedRuns are the checker's runs for the environment: the default
// run (OrderedFromEnv without OUTBOX_RELIABILITY), and under
// OUTBOX_RELIABILITY=long that run first and then the long one, so that a
// long run (CI's) checks both variants.
func OrderedRuns() []OrderedOptions {
	o := OrderedFromEnv()
	if !o.Kill {
		return []OrderedOptions{o}
	}
	short := o
	short.Kill, short.Mode = false, "short"
	return []OrderedOptions{short, o}
}

// OrderedFromEnv is the default run (2,000 keys x 10 messages, 8
// producers, 4 relays, 5% handler errors, no kills), or under
// OUTBOX_RELIABILITY=long the same with a relay SIGKILLed every 200-800
// ms; OUTBOX_CHAOS_SEED replays a seed, OUTBOX_ORDERED_KEYS changes the
// number of keys.
func OrderedFromEnv() OrderedOptions {
	o := OrderedOptions{Keys: 2000, PerKey: 10, Producers: 8, Relays: 4, ErrorRate: 0.05, HaltKeys: 5, RollbackRate: 0.03, Mode: "short"}
	if os.Getenv("OUTBOX_RELIABILITY") == "long" {
		o.Kill, o.Mode = true, "long"
	}
	if s := os.Getenv("OUTBOX_CHAOS_SEED"); s != "" {
		o.Seed, _ = strconv.ParseUint(s, 10, 64)
	}
	if n, err := strconv.Atoi(os.Getenv("OUTBOX_ORDERED_KEYS")); err == nil && n > 0 {
		o.Keys, o.Mode = n, "custom"
	}
	return o
}

// Topics of the ordered checker: a key's messages go to all of them.
var orderedTopics = []string{"ordered.a", "ordered.b", "ordered.c"}

// Environment of an ordered relay child.
const (
	envErrorRate = "OUTBOX_ORDERED_ERRORS"
)

// orderedTables are the checker's tables, beside the business table.
type orderedTables struct{ agg, msg, ledger, healed string }

func tablesOf(c *Conn) orderedTables {
	return orderedTables{agg: c.Business + "_agg", msg: c.Business + "_msg", ledger: c.Ledger + "_ordered", healed: c.Business + "_healed"}
}

// OrderedReport are the figures of one run.
type OrderedReport struct {
	Name, Dialect, Mode                  string
	Seed                                 uint64
	Keys, Messages, Transactions         int
	Rollbacks, PublishErrors, RelayKills int
	RelayErrors                          int
	Deliveries, Failures, Redeliveries   int
	RunS, HealS                          float64
}

// RunOrdered runs the ordered checker on b (or, in a child process, plays
// a relay). The ledger and business tables are written in b's dialect
// (orderedDDL).
func RunOrdered(t *testing.T, b Backend, o OrderedOptions) {
	if b.Lease == 0 {
		// Longer than the process-kill test's 3s: a lease that lapses
		// under a relay starved of CPU (2 cores, 4 relays, the producers
		// and the server) lets a second run of the key start beside the
		// first, which the checker reports; a crashed relay's keys come
		// back after it.
		b.Lease = 6 * time.Second
	}
	if role := os.Getenv(envRole); role != "" {
		runChild(t, b, role)
		return
	}
	if o.Seed == 0 {
		o.Seed = rand.Uint64() >> 1
	}
	t.Logf("seed %d (replay with OUTBOX_CHAOS_SEED=%d)", o.Seed, o.Seed)
	writeReport(t, runOrderedParent(t, b, o))
}

// runOrderedRelay is an ordered relay child: it handles the checker's
// topics until its parent closes its standard input.
func runOrderedRelay(ctx context.Context, t *testing.T, b Backend, c *Conn, serial int, lease time.Duration) {
	ob, err := outbox.New(b.Dialect, outbox.Config{Table: c.Table, OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	rate, _ := strconv.ParseFloat(os.Getenv(envErrorRate), 64)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := runOrderedRelayOn(ctx, c, ob, serial, lease, rate, logger); err != nil {
		t.Fatal(err)
	}
}

func runOrderedRelayOn(ctx context.Context, c *Conn, ob *outbox.Outbox, proc int, lease time.Duration, rate float64, logger *slog.Logger) error {
	cfg := relayConfig(lease, logger)
	// Four relays' handlers, each holding a ledger connection, must stay
	// under the server's max_connections (100 by default): past it, the
	// ledger writes fail and retry, handlers stall, and leases lapse.
	cfg.Concurrency = 32
	c.ledger().SetMaxOpenConns(12)
	r, err := ob.Relay(c.Relay, cfg)
	if err != nil {
		return err
	}
	h := orderedHandler(c, proc, rate)
	for _, topic := range orderedTopics {
		if err := r.Handle(topic, h); err != nil {
			return err
		}
	}
	return r.Run(ctx)
}

// failing says whether the handler fails this attempt of message id: a
// hash, so that every process agrees and a replay fails the same calls.
func failing(id string, attempt int, rate float64) bool {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", id, attempt)
	return float64(h.Sum64()%10000) < rate*10000
}

// orderedHandler records S when a delivery starts, then F (success), E
// (a failure, retried) or D (the poison message of a halt key,
// dead-lettered until the run heals).
func orderedHandler(c *Conn, proc int, rate float64) outbox.Handler {
	tb := tablesOf(c)
	poison := c.q(`SELECT (SELECT version FROM ` + tb.msg + ` WHERE id = ?) = 5 AND NOT EXISTS (SELECT 1 FROM ` + tb.healed + `)`)
	record := recorder(c, tb.ledger, proc)
	return func(ctx context.Context, d outbox.Delivery) error {
		if err := record(ctx, d, "S"); err != nil {
			return err
		}
		if strings.HasPrefix(d.Key, "halt") {
			var dead bool
			if err := c.SQL.QueryRowContext(ctx, poison, d.ID.String()).Scan(&dead); err != nil {
				return err // retried
			}
			if dead {
				if err := record(ctx, d, "D"); err != nil {
					return err
				}
				return outbox.DeadLetter(errors.New("poison"))
			}
		}
		if failing(d.ID.String(), d.Attempt, rate) {
			if err := record(ctx, d, "E"); err != nil {
				return err
			}
			return errors.New("injected failure")
		}
		return record(ctx, d, "F")
	}
}

// orderedDDL is the spelling, in dialect's SQL, of the checker's key
// column and of the ledger's auto-incremented primary key (its order is
// the order of the ledger's commits).
func orderedDDL(dialect string) (key, serial string) {
	switch dialect {
	case "postgres":
		return "text", "bigserial PRIMARY KEY"
	case "sqlite":
		return "TEXT", "INTEGER PRIMARY KEY"
	}
	return "VARCHAR(64)", "BIGINT AUTO_INCREMENT PRIMARY KEY" // MySQL, MariaDB
}

func createOrderedTables(ctx context.Context, c *Conn, dialect string, keys []string) error {
	tb := tablesOf(c)
	key, serial := orderedDDL(dialect)
	for _, q := range []string{
		`CREATE TABLE ` + tb.agg + ` (k ` + key + ` PRIMARY KEY, version integer NOT NULL)`,
		`CREATE TABLE ` + tb.msg + ` (id ` + key + ` PRIMARY KEY, k ` + key + ` NOT NULL, version integer NOT NULL)`,
		`CREATE TABLE ` + tb.healed + ` (x integer)`,
	} {
		if _, err := c.SQL.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	if _, err := c.ledger().ExecContext(ctx, `CREATE TABLE `+tb.ledger+` (n `+serial+`, id `+key+` NOT NULL, bkey `+key+` NOT NULL,
		attempt integer NOT NULL, kind char(1) NOT NULL, proc integer NOT NULL, at_ns bigint NOT NULL)`); err != nil {
		return err
	}
	// The aggregates, a few hundred per statement (placeholders: one per
	// key, under every database's limit).
	for len(keys) > 0 {
		n := min(len(keys), 500)
		args := make([]any, n)
		for i := range n {
			args[i] = keys[i]
		}
		q := `INSERT INTO ` + tb.agg + ` (k, version) VALUES ` + strings.TrimSuffix(strings.Repeat("(?, 0), ", n), ", ")
		if _, err := c.SQL.ExecContext(ctx, c.q(q), args...); err != nil {
			return err
		}
		keys = keys[n:]
	}
	return nil
}

// producers publish every key's PerKey messages from o.Producers
// goroutines. Each transaction takes one or two keys among the first few
// with messages left (so that transactions on one key overlap), publishes
// one or two messages for each, waits a little, increments the keys'
// versions and records each message's version; a few roll back.
type producers struct {
	c                      *Conn
	ob                     *outbox.Outbox
	o                      OrderedOptions
	mu                     sync.Mutex
	left                   map[string]int
	keys                   []string // with messages left, in order
	txs, rollbacks, failed atomic.Int64
	errSample              atomic.Value
}

func (p *producers) reserve(rng *rand.Rand) map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.keys) == 0 {
		return nil
	}
	window := min(len(p.keys), 2*p.o.Producers)
	got := map[string]int{}
	for range 1 + rng.IntN(2) {
		k := p.keys[rng.IntN(window)]
		n := min(1+rng.IntN(2), p.left[k]-got[k])
		if n > 0 {
			got[k] += n
		}
	}
	for k, n := range got {
		p.left[k] -= n
	}
	p.keys = slices.DeleteFunc(p.keys, func(k string) bool { return p.left[k] == 0 })
	return got
}

func (p *producers) giveBack(got map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, n := range got {
		if p.left[k] == 0 {
			p.keys = append(p.keys, k)
		}
		p.left[k] += n
	}
	sort.Strings(p.keys)
}

func (p *producers) run(ctx context.Context, seed uint64, idx int) {
	rng := rand.New(rand.NewPCG(seed, uint64(1000+idx)))
	tb := tablesOf(p.c)
	bump := p.c.q(`UPDATE ` + tb.agg + ` SET version = version + ? WHERE k = ?`)
	// The transaction sees its own increment: message j of n gets
	// version - (n - 1 - j).
	rec := p.c.q(`INSERT INTO ` + tb.msg + ` (id, k, version) SELECT ?, k, version - ? FROM ` + tb.agg + ` WHERE k = ?`)
	for {
		got := p.reserve(rng)
		if got == nil {
			return
		}
		keys := make([]string, 0, len(got))
		for k := range got {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var msgs []outbox.Message
		for _, k := range keys {
			for range got[k] {
				msgs = append(msgs, outbox.Message{Topic: orderedTopics[rng.IntN(len(orderedTopics))], Key: k})
			}
		}
		rollback := rng.Float64() < p.o.RollbackRate
		err := func() error {
			tx, err := p.c.Begin(ctx)
			if err != nil {
				return err
			}
			res, err := p.ob.PublishBatch(ctx, tx.Tx, msgs)
			if err != nil {
				_ = tx.Rollback()
				return err
			}
			time.Sleep(time.Duration(rng.Int64N(int64(2 * time.Millisecond))))
			i := 0
			for _, k := range keys {
				if err := tx.Exec(ctx, bump, got[k], k); err != nil {
					_ = tx.Rollback()
					return err
				}
				for j := range got[k] {
					if err := tx.Exec(ctx, rec, res[i].ID.String(), got[k]-1-j, k); err != nil {
						_ = tx.Rollback()
						return err
					}
					i++
				}
			}
			if rollback {
				return tx.Rollback()
			}
			return tx.Commit()
		}()
		switch {
		case err != nil:
			p.failed.Add(1)
			p.errSample.CompareAndSwap(nil, err.Error())
			p.giveBack(got)
		case rollback:
			p.rollbacks.Add(1)
			p.giveBack(got)
		default:
			p.txs.Add(1)
		}
	}
}

func runOrderedParent(t *testing.T, b Backend, o OrderedOptions) *OrderedReport {
	ctx := context.Background()
	target := b.Setup(t)
	tj, _ := json.Marshal(target) // for the relays
	// This process's connections serve the producers: a pool as large as
	// they are many ("pool", for backends with a pool of their own).
	mine := Target{"pool": strconv.Itoa(o.Producers + 2)}
	for k, v := range target {
		mine[k] = v
	}
	c, err := b.Open(ctx, mine)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	keys := make([]string, o.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%05d", i)
		if i < o.HaltKeys {
			keys[i] = fmt.Sprintf("halt%03d", i)
		}
	}
	sort.Strings(keys)
	if err := createOrderedTables(ctx, c, b.Dialect.Name(), keys); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(b.Dialect, outbox.Config{Table: c.Table, OrderByKey: true})
	if err != nil {
		t.Fatal(err)
	}
	rep := &OrderedReport{Name: t.Name(), Dialect: b.Dialect.Name(), Mode: o.Mode, Seed: o.Seed, Keys: o.Keys, Messages: o.Keys * o.PerKey}
	t.Setenv(envErrorRate, strconv.FormatFloat(o.ErrorRate, 'f', -1, 64))
	p := &parent{t: t, b: b, o: Options{Duration: time.Second, Messages: 1, Publishers: 1, Seed: o.Seed}, target: string(tj), pattern: runPattern(t),
		rng: rand.New(rand.NewPCG(o.Seed, 0)), exits: make(chan *child, 4096), killedRelays: map[int]bool{}}
	relays := make([]*child, o.Relays)
	for i := range relays {
		relays[i] = p.start("ordered-relay", i)
	}
	t.Cleanup(func() {
		for _, ch := range relays {
			select {
			case <-ch.exited:
			default:
				p.kill(ch)
			}
		}
	})
	started := time.Now()
	prod := &producers{c: c, ob: ob, o: o, left: map[string]int{}, keys: slices.Clone(keys)}
	for _, k := range keys {
		prod.left[k] = o.PerKey
	}
	var wg sync.WaitGroup
	for i := range o.Producers {
		wg.Go(func() { prod.run(ctx, o.Seed, i) })
	}
	published := make(chan struct{})
	go func() { wg.Wait(); close(published) }()

	// While producers run (and until nothing is pending), kill relays in
	// the long variant; relays that exit on their own are failures.
	kill := time.NewTimer(p.uniform(200*time.Millisecond, 800*time.Millisecond))
	if !o.Kill {
		kill.Stop()
	}
	poll := time.NewTicker(200 * time.Millisecond)
	defer poll.Stop()
	deadline := time.Now().Add(10 * time.Minute)
	done := false
	for !done {
		select {
		case <-kill.C:
			i := p.rng.IntN(len(relays))
			p.kill(relays[i])
			p.killedRelays[relays[i].serial] = true
			rep.RelayKills++
			relays[i] = p.start("ordered-relay", i)
			kill.Reset(p.uniform(200*time.Millisecond, 800*time.Millisecond))
		case ch := <-p.exits:
			if !ch.killed.Load() {
				p.failures = append(p.failures, fmt.Sprintf("relay %d exited by itself: %v:\n%s", ch.idx, ch.err, ch.out))
				if relays[ch.idx] == ch {
					relays[ch.idx] = p.start("ordered-relay", ch.idx)
				}
			}
		case <-poll.C:
			select {
			case <-published:
			default:
				continue
			}
			kill.Stop()
			var n int
			if err := c.SQL.QueryRow(`SELECT count(*) FROM ` + c.Table + ` WHERE state IN ('pending', 'processing')`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			done = n == 0
			if !done && time.Now().After(deadline) {
				t.Fatalf("%d messages still pending or processing after 10 minutes", n)
			}
		}
	}
	rep.RunS = time.Since(started).Seconds()
	p.stop(relays, 20*time.Second)
	if os.Getenv("OUTBOX_ORDERED_DEBUG") != "" {
		for _, ch := range relays {
			t.Logf("DEBUG relay %d output:\n%s", ch.idx, ch.out)
		}
	}
	for _, f := range p.failures {
		t.Error(f)
	}
	rep.Transactions, rep.Rollbacks, rep.PublishErrors = int(prod.txs.Load()), int(prod.rollbacks.Load()), int(prod.failed.Load())
	rep.RelayErrors = int(p.relayErrors.Load())
	if s, ok := p.errSample.Load().(string); ok {
		t.Logf("%d ERROR lines from relays, e.g. %s", rep.RelayErrors, s)
	}
	if s, ok := prod.errSample.Load().(string); ok {
		t.Logf("%d failed producer transactions, e.g. %s", rep.PublishErrors, s)
	}

	// Before healing: every key but the halt keys delivered in full; each
	// halt key up to its poison message, which is dead, with the rest
	// blocked behind it.
	v := verdict(t, c, p.killedRelays, o, false)
	st, err := ob.Stats(ctx, c.Relay)
	if err != nil {
		t.Fatal(err)
	}
	var blockedKeys int64
	for _, s := range st {
		blockedKeys += s.BlockedKeys
	}
	if blockedKeys != int64(o.HaltKeys) {
		t.Errorf("Stats: %d blocked keys, want the %d halt keys", blockedKeys, o.HaltKeys)
	}

	// Heal: redrive, and one relay here delivers the halt keys' rest.
	healStart := time.Now()
	if _, err := c.SQL.ExecContext(ctx, `INSERT INTO `+tablesOf(c).healed+` VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if n, err := ob.Redrive(ctx, c.Relay, ""); err != nil || n != int64(o.HaltKeys) {
		t.Errorf("redrive: %d %v, want the %d poison messages", n, err, o.HaltKeys)
	}
	rctx, cancel := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() {
		relayDone <- runOrderedRelayOn(rctx, c, ob, -1, b.Lease, 0, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})))
	}()
	healBy := time.Now().Add(time.Minute)
	for {
		var n int
		if err := c.SQL.QueryRow(`SELECT count(*) FROM ` + c.Table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(healBy) {
			t.Errorf("healing: %d messages left", n)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-relayDone; err != nil {
		t.Error(err)
	}
	rep.HealS = time.Since(healStart).Seconds()
	v = verdict(t, c, p.killedRelays, o, true)
	rep.Deliveries, rep.Failures, rep.Redeliveries = v.deliveries, v.failures, v.redeliveries
	return rep
}

type ledgerRow struct {
	id, kind   string
	attempt    int
	proc       int
	version, n int
}

type verdictFigures struct{ deliveries, failures, redeliveries int }

// verdict checks the ledger against the business rows. healed: after the
// redrive, every message of every key must have been delivered.
func verdict(t *testing.T, c *Conn, killed map[int]bool, o OrderedOptions, healed bool) verdictFigures {
	t.Helper()
	tb := tablesOf(c)
	version := map[string]int{}
	perKey := map[string]int{}
	rows, err := c.SQL.Query(`SELECT id, k, version FROM ` + tb.msg)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, k string
		var v int
		if err := rows.Scan(&id, &k, &v); err != nil {
			t.Fatal(err)
		}
		version[id] = v
		perKey[k] = max(perKey[k], v)
	}
	rows.Close()
	if len(version) != o.Keys*o.PerKey {
		t.Errorf("%d messages committed, want %d", len(version), o.Keys*o.PerKey)
	}
	byKey := map[string][]ledgerRow{}
	lr, err := c.ledger().Query(`SELECT n, id, bkey, attempt, kind, proc FROM ` + tb.ledger + ` ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	var f verdictFigures
	for lr.Next() {
		var r ledgerRow
		var k string
		if err := lr.Scan(&r.n, &r.id, &k, &r.attempt, &r.kind, &r.proc); err != nil {
			t.Fatal(err)
		}
		v, ok := version[r.id]
		if !ok {
			t.Errorf("unexpected: message %s of key %s delivered but never committed", r.id, k)
			continue
		}
		r.version = v
		byKey[k] = append(byKey[k], r)
	}
	lr.Close()
	bad := 0
	dumped := false
	report := func(format string, args ...any) {
		if bad++; bad <= 20 {
			t.Errorf(format, args...)
		}
	}
	for k, n := range perKey {
		maxDone := 0
		var open *ledgerRow
		halt := strings.HasPrefix(k, "halt")
		for i := range byKey[k] {
			r := &byKey[k][i]
			switch r.kind {
			case "S":
				if open != nil && !killed[open.proc] {
					report("key %s: version %d started (proc %d) while version %d was in flight (proc %d)", k, r.version, r.proc, open.version, open.proc)
				}
				open = r
			case "F":
				f.deliveries++
				if r.version > maxDone+1 {
					report("key %s: version %d delivered before version %d", k, r.version, maxDone+1)
				}
				if r.version <= maxDone {
					f.redeliveries++
				}
				maxDone = max(maxDone, r.version)
				open = nil
			case "E", "D":
				f.failures++
				open = nil
			}
		}
		want := n
		if halt && !healed {
			want = 4
		}
		if bad > 0 && os.Getenv("OUTBOX_ORDERED_DEBUG") != "" && !dumped {
			dumped = true
			for _, r := range byKey[k] {
				t.Logf("DEBUG %s n=%d v=%d %s att=%d proc=%d id=%s", k, r.n, r.version, r.kind, r.attempt, r.proc, r.id)
			}
		}
		if maxDone != want {
			report("key %s: delivered up to version %d, want %d", k, maxDone, want)
		}
	}
	if bad > 20 {
		t.Errorf("... %d violations in all", bad)
	}
	return f
}
