package main

// The systems the compare and cost scenarios run side by side: oncommit, the
// raw-SQL reference on oncommit's own table, River (riverpgxv5) and gue (its
// pgx v5 adapter), each in its own schema of the same database, each with
// its defaults and with its best settings.

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/outbox"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/vgarvardt/gue/v5"
	"github.com/vgarvardt/gue/v5/adapter/pgxv5"
)

// system is one queue under test. Topics are "bench" (the consumers' topic,
// River queue, gue queue) and "other" (rows nobody consumes).
type system struct {
	name     string
	settings string
	pool     *pgxpool.Pool // the producers' pool
	reset    func(ctx context.Context)
	// publish inserts k messages carrying seq in the transaction tx.
	publish func(ctx context.Context, tx pgx.Tx, k int, seq int64) error
	fill    func(ctx context.Context, n int, topic string)
	// rawDrain drains topic "bench" with procs loops (the raw reference,
	// which has no consumer to start and stop).
	rawDrain func(ctx context.Context, procs int)
	// consume prepares procs consumer processes (each with its own pool)
	// that call onMsg for each message of topic "bench"; start starts them
	// without blocking, stop stops them once every outcome is written.
	consume func(ctx context.Context, procs int, onMsg func(seq int64)) (start, stop func())
	left    func(ctx context.Context) int // messages not yet delivered
	table   string                        // oncommit's systems: the table, as in outbox.Config.Table
	// also: oncommit's systems: more topics the consumers' relays handle
	// beside "bench" (no message is published to them): the skew-3
	// scenario's relay of three topics.
	also []string
	// share divides the drain: a system this slow delivers n/share
	// messages of the n-message backlog (its rate is per message delivered;
	// the whole backlog would take minutes a round).
	share int
}

// payload is the message body of every system (River encodes the same
// fields from its args struct): a 90-byte JSON document with a sequence
// number the latency scenario reads back.
func payload(seq int64) []byte {
	return fmt.Appendf(nil, `{"seq":%d,"order_id":"0193a1f2","email":"someone@example.com","total_cents":4200}`, seq)
}

// seqOf reads the sequence number back from a payload without decoding it
// (jsonb gives the document back as {"seq": 1, ...}).
func seqOf(p []byte) int64 {
	i := bytes.Index(p, []byte(`"seq":`))
	if i < 0 {
		return 0
	}
	var s int64
	for _, c := range bytes.TrimLeft(p[i+len(`"seq":`):], " ") {
		if c < '0' || c > '9' {
			break
		}
		s = s*10 + int64(c-'0')
	}
	return s
}

// newPool opens a pool whose statements the round-trip counter sees;
// maxConns 0 keeps pgxpool's default, searchPath "" the server's.
func newPool(ctx context.Context, maxConns int32, searchPath string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(*url)
	check(err)
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if searchPath != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = searchPath
	}
	cfg.ConnConfig.Tracer = wire
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	check(err)
	check(p.Ping(ctx))
	return p
}

func mustExec(ctx context.Context, pool *pgxpool.Pool, q string, args ...any) {
	_, err := pool.Exec(ctx, q, args...)
	check(err)
}

func count(ctx context.Context, pool *pgxpool.Pool, q string) int {
	var k int
	check(pool.QueryRow(ctx, q).Scan(&k))
	return k
}

// untilHandled wraps onMsg: done is closed at the n-th message.
func untilHandled(n int, onMsg func(int64)) (func(int64), <-chan struct{}) {
	var k atomic.Int64
	done := make(chan struct{})
	return func(seq int64) {
		if onMsg != nil {
			onMsg(seq)
		}
		if k.Add(1) == int64(n) {
			close(done)
		}
	}, done
}

// runners starts each Run(ctx) in its own goroutine; stop cancels their
// context, waits for them to return and closes their pools.
func runners[R interface{ Run(context.Context) error }](ctx context.Context, pools []*pgxpool.Pool, rs []R) (start, stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	return func() {
			for _, r := range rs {
				wg.Go(func() { check(r.Run(rctx)) })
			}
		}, func() {
			cancel()
			wg.Wait()
			closeLater(pools)
		}
}

// closing holds the consumers' pools, closed by closePools after the
// clock stopped: closing a pool waits for its connections to be torn
// down, which the raw loops (whose pool stays open) never pay inside
// their timing either.
var closing []*pgxpool.Pool

func closeLater(pools []*pgxpool.Pool) { closing = append(closing, pools...) }

func closePools() {
	for _, p := range closing {
		p.Close()
	}
	closing = nil
}

// systemSet is every system and configuration the compare and cost
// scenarios run, with the settings they print. A system the -systems flag
// leaves out is nil: it is never built, so its pools, tables and clients
// do not sit in the process while the others are measured.
type systemSet struct {
	raw, onc, oncOff, oncEvery, oncBest, oncAsync, riv, rivBest, gu, guBest *system
	// oncWAL: the WAL transport, built only when asked for by -systems
	// (its server needs wal_level = logical).
	oncWAL *system
}

// systemWanted reports whether the -systems flag asks for the system name
// (every system when the flag is empty; raw always).
func systemWanted(name string) bool {
	return name == "raw" || *systemsOnly == "" || slices.Contains(strings.Split(*systemsOnly, ","), name)
}

func newSystems(ctx context.Context, admin *pgxpool.Pool) *systemSet {
	onc := func(name, settings string, cfg outbox.Config) *system {
		if !systemWanted(name) {
			return nil
		}
		return oncommitSystem(ctx, name, settings, cfg, outbox.RelayConfig{})
	}
	riv := func(name, settings string, rc riverConfig) *system {
		if !systemWanted(name) {
			return nil
		}
		return riverSystem(ctx, name, settings, rc)
	}
	gu := func(name, settings string, gc gueConfig) *system {
		if !systemWanted(name) {
			return nil
		}
		return gueSystem(ctx, name, settings, gc)
	}
	if systemWanted("river") || systemWanted("river-best") {
		riverSetUp(ctx, admin)
	}
	if systemWanted("gue") || systemWanted("gue-best") {
		gueSetUp(ctx, admin)
	}
	ss := &systemSet{
		raw: rawSystem(ctx),
		onc: onc("oncommit", "defaults: Config{} (NOTIFY coalesced: at most one per DefaultNotifyInterval, 5ms, per Outbox; woken relays follow up), RelayConfig{} (batch 100, 200 handler slots, LISTEN on), pgxpool default per relay",
			outbox.Config{}),
		oncOff:   onc("oncommit-notify-off", "Config{Notify: NotifyOff} (publish only)", outbox.Config{Notify: outbox.NotifyOff}),
		oncEvery: onc("oncommit-notify-every", "Config{NotifyInterval: NotifyEvery} (NOTIFY on every publish, the default before issue 14; notify scenario only)", outbox.Config{NotifyInterval: outbox.NotifyEvery}),
		oncBest: onc("oncommit-best", fmt.Sprintf("Config{NotifyInterval: %v} (at most one NOTIFY per %[1]v per Outbox; relays follow up), RelayConfig{} (publish, latency and notify scenarios; its drain is the defaults')", *notifyEvery),
			outbox.Config{NotifyInterval: *notifyEvery}),
		oncAsync: func() *system {
			if !systemWanted("oncommit-async") {
				return nil
			}
			return oncommitSystem(ctx, "oncommit-async", "defaults but RelayConfig{AsyncCommit: true} (the relay's claims and settles commit without waiting for the WAL flush); drain and latency scenarios only",
				outbox.Config{}, outbox.RelayConfig{AsyncCommit: true})
		}(),
		riv: riv("river", "defaults: MaxWorkers 100 (River requires a value; its examples use 100), FetchCooldown 100ms, FetchPollInterval 1s, pgxpool default per client; publish InsertTx / InsertManyFastTx (COPY); drains n/10 of the backlog",
			riverConfig{maxWorkers: 100}),
		rivBest: riv("river-best", "MaxWorkers 1000, FetchCooldown 10ms, FetchPollInterval 100ms, pgxpool 20 conns per client (the best of 1ms/5ms/10ms cooldowns, 10ms/100ms/1s polls, 1000/2000 workers in single-round trials)",
			riverConfig{maxWorkers: 1000, fetchCooldown: 10 * time.Millisecond, fetchInterval: 100 * time.Millisecond, poolConns: 20}),
		gu: gu("gue", "defaults: WorkerPool of 2 (gue's README), poll interval 5s, priority poll strategy, pgxpool default per process; publish EnqueueTx / EnqueueBatchTx; drains n/10 of the backlog",
			gueConfig{workers: 2}),
		guBest: gu("gue-best", "WorkerPool of 16, RunAtPollStrategy (ORDER BY run_at, priority: served by gue's index), poll interval 10ms, pgxpool 20 conns per process",
			gueConfig{workers: 16, poll: 10 * time.Millisecond, poolConns: 20, runAt: true}),
	}
	if *systemsOnly != "" && systemWanted("oncommit-wal") {
		ss.oncWAL = walSystem(ctx)
	}
	if ss.riv != nil {
		ss.riv.share = 10
	}
	if ss.gu != nil {
		ss.gu.share = 10
	}
	return ss
}

// ---- oncommit and the raw reference (both on oncommit's table) ----

// oncommitSystem returns oncommit with the given publish and relay
// configurations, on a table of its own.
func oncommitSystem(ctx context.Context, name, settings string, cfg outbox.Config, rc outbox.RelayConfig) *system {
	return oncommitSystemOn(ctx, postgres.Dialect(), name, settings, cfg, rc)
}

// oncommitSystemOn is oncommitSystem with dialect d.
func oncommitSystemOn(ctx context.Context, d outbox.Dialect, name, settings string, cfg outbox.Config, rc outbox.RelayConfig) *system {
	pool := newPool(ctx, 20, "")
	base := table(ctx, pool, "cmp_"+strings.ReplaceAll(name, "-", "_"))
	cfg.Table = base.Table().String()
	ob, err := outbox.New(d, cfg)
	check(err)
	tbl := pgsql.QuoteTable(ob.Table())
	s := &system{name: name, settings: settings, pool: pool}
	s.table = cfg.Table
	s.reset = func(ctx context.Context) { mustExec(ctx, pool, `TRUNCATE `+tbl) }
	s.publish = func(ctx context.Context, tx pgx.Tx, k int, seq int64) error {
		p := payload(seq)
		msgs := make([]outbox.Message, k)
		for i := range k {
			msgs[i] = outbox.Message{Topic: "bench", Key: "0193a1f2", Payload: p}
		}
		if k == 1 {
			_, err := ob.Publish(ctx, pgxtx.From(tx), msgs[0])
			return err
		}
		_, err := ob.PublishBatch(ctx, pgxtx.From(tx), msgs[:k])
		return err
	}
	s.fill = func(ctx context.Context, n int, topic string) { fillTopic(ctx, pool, ob, n, topic) }
	s.left = func(ctx context.Context) int {
		return count(ctx, pool, `SELECT count(*) FROM `+tbl+` WHERE topic = 'bench'`)
	}
	rc.Logger = quiet
	s.consume = func(ctx context.Context, procs int, onMsg func(int64)) (start, stop func()) {
		var rs []*outbox.Relay
		var pools []*pgxpool.Pool
		for range procs {
			p := newPool(ctx, 0, "")
			pools = append(pools, p)
			r, err := ob.Relay(pgxtx.FromPool(p), rc)
			check(err)
			check(r.Handle("bench", func(_ context.Context, d outbox.Delivery) error {
				onMsg(seqOf(d.Payload))
				return nil
			}))
			for _, topic := range s.also {
				check(r.Handle(topic, func(context.Context, outbox.Delivery) error { return nil }))
			}
			rs = append(rs, r)
		}
		return runners(ctx, pools, rs)
	}
	return s
}

// fillTopic makes a backlog of n due messages of topic, older than any
// published later: fill's batches of 1,000 published with PublishBatch.
func fillTopic(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, n int, topic string) {
	if n > 0 {
		fill(ctx, pool, ob, n, topic)
	}
}

// rawSystem is the reference: hand-written SQL on a table of oncommit's
// schema. Publish is one INSERT of the columns oncommit writes (id, topic,
// message_key, payload), n rows in one statement; drain is rawLoop.
func rawSystem(ctx context.Context) *system {
	pool := newPool(ctx, 20, "")
	ob := table(ctx, pool, "cmp_raw")
	tbl := pgsql.QuoteTable(ob.Table())
	s := &system{name: "raw", settings: "hand-written pgx: INSERT (id, topic, message_key, payload) VALUES ... ; drain: rawLoop (claim 100 SKIP LOCKED returning id, topic, payload; DELETE by ids)", pool: pool}
	s.reset = func(ctx context.Context) { mustExec(ctx, pool, `TRUNCATE `+tbl) }
	var queries sync.Map // rows per statement -> statement text
	s.publish = func(ctx context.Context, tx pgx.Tx, k int, seq int64) error {
		q, ok := queries.Load(k)
		if !ok {
			text := `INSERT INTO ` + tbl + ` (id, topic, message_key, payload) VALUES `
			for i := range k {
				if i > 0 {
					text += ", "
				}
				text += fmt.Sprintf("($%d, $%d, $%d, $%d)", 4*i+1, 4*i+2, 4*i+3, 4*i+4)
			}
			q = text
			queries.Store(k, q)
		}
		p := string(payload(seq))
		args := make([]any, 4*k)
		for i := range k {
			args[4*i], args[4*i+1], args[4*i+2], args[4*i+3] = outbox.NewID().String(), "bench", "0193a1f2", p
		}
		_, err := tx.Exec(ctx, q.(string), args...)
		return err
	}
	s.fill = func(ctx context.Context, n int, topic string) { fillTopic(ctx, pool, ob, n, topic) }
	s.left = func(ctx context.Context) int {
		return count(ctx, pool, `SELECT count(*) FROM `+tbl+` WHERE topic = 'bench'`)
	}
	s.rawDrain = func(ctx context.Context, procs int) { rawLoop(ctx, pool, ob, procs) }
	return s
}

// ---- River ----

type benchArgs struct {
	Seq        int64  `json:"seq"`
	OrderID    string `json:"order_id"`
	Email      string `json:"email"`
	TotalCents int    `json:"total_cents"`
}

func (benchArgs) Kind() string { return "bench" }

type benchWorker struct {
	river.WorkerDefaults[benchArgs]
	onMsg func(int64)
}

func (w *benchWorker) Work(_ context.Context, job *river.Job[benchArgs]) error {
	w.onMsg(job.Args.Seq)
	return nil
}

const riverSchema = "bench_river"

// riverSetUp creates River's schema with rivermigrate, once per run.
func riverSetUp(ctx context.Context, pool *pgxpool.Pool) {
	mustExec(ctx, pool, `DROP SCHEMA IF EXISTS `+riverSchema+` CASCADE`)
	mustExec(ctx, pool, `CREATE SCHEMA `+riverSchema)
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: riverSchema, Logger: quiet})
	check(err)
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	check(err)
}

// riverConfig is River's client configuration: queue "bench" with
// maxWorkers, and the fetch settings (zero: River's defaults).
type riverConfig struct {
	maxWorkers                   int
	fetchCooldown, fetchInterval time.Duration
	poolConns                    int32
}

func (c riverConfig) client(pool *pgxpool.Pool, onMsg func(int64)) *river.Client[pgx.Tx] {
	workers := river.NewWorkers()
	river.AddWorker(workers, &benchWorker{onMsg: onMsg})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:            riverSchema,
		Logger:            quiet,
		Workers:           workers,
		FetchCooldown:     c.fetchCooldown,
		FetchPollInterval: c.fetchInterval,
		Queues:            map[string]river.QueueConfig{"bench": {MaxWorkers: c.maxWorkers}},
	})
	check(err)
	return client
}

func riverSystem(ctx context.Context, name, settings string, c riverConfig) *system {
	pool := newPool(ctx, 20, "")
	s := &system{name: name, settings: settings, pool: pool}
	client := c.client(pool, func(int64) {})
	jobs := riverSchema + ".river_job"
	s.reset = func(ctx context.Context) { mustExec(ctx, pool, `TRUNCATE `+jobs) }
	s.publish = func(ctx context.Context, tx pgx.Tx, k int, seq int64) error {
		args := benchArgs{Seq: seq, OrderID: "0193a1f2", Email: "someone@example.com", TotalCents: 4200}
		if k == 1 {
			_, err := client.InsertTx(ctx, tx, args, &river.InsertOpts{Queue: "bench"})
			return err
		}
		params := make([]river.InsertManyParams, k)
		for i := range k {
			params[i] = river.InsertManyParams{Args: args, InsertOpts: &river.InsertOpts{Queue: "bench"}}
		}
		_, err := client.InsertManyFastTx(ctx, tx, params[:k])
		return err
	}
	s.fill = func(ctx context.Context, n int, topic string) {
		params := make([]river.InsertManyParams, 1000)
		for left := n; left > 0; left -= 1000 {
			k := min(left, 1000)
			for i := range k {
				params[i] = river.InsertManyParams{Args: benchArgs{OrderID: "0193a1f2", Email: "someone@example.com", TotalCents: 4200}, InsertOpts: &river.InsertOpts{Queue: topic}}
			}
			tx, err := pool.Begin(ctx)
			check(err)
			_, err = client.InsertManyFastTx(ctx, tx, params[:k])
			check(err)
			check(tx.Commit(ctx))
		}
		mustExec(ctx, pool, `ANALYZE `+jobs)
	}
	s.left = func(ctx context.Context) int {
		return count(ctx, pool, `SELECT count(*) FROM `+jobs+` WHERE queue = 'bench' AND state <> 'completed'`)
	}
	s.consume = func(ctx context.Context, procs int, onMsg func(int64)) (start, stop func()) {
		var clients []*river.Client[pgx.Tx]
		var pools []*pgxpool.Pool
		for range procs {
			p := newPool(ctx, c.poolConns, "")
			pools = append(pools, p)
			clients = append(clients, c.client(p, onMsg))
		}
		return func() {
				for _, cl := range clients {
					check(cl.Start(ctx))
				}
			}, func() {
				for _, cl := range clients {
					check(cl.Stop(ctx))
				}
				closeLater(pools)
			}
	}
	return s
}

// ---- gue ----

const gueSchema = "bench_gue"

// gueSetUp creates gue's table (gue ships it as migrations/schema.sql and
// leaves applying it to the user) in its own schema.
func gueSetUp(ctx context.Context, pool *pgxpool.Pool) {
	mustExec(ctx, pool, `DROP SCHEMA IF EXISTS `+gueSchema+` CASCADE`)
	mustExec(ctx, pool, `CREATE SCHEMA `+gueSchema)
	mustExec(ctx, pool, `CREATE TABLE `+gueSchema+`.gue_jobs (
		job_id text NOT NULL PRIMARY KEY, priority smallint NOT NULL, run_at timestamptz NOT NULL,
		job_type text NOT NULL, args bytea NOT NULL, error_count integer NOT NULL DEFAULT 0,
		last_error text, queue text NOT NULL, created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL)`)
	mustExec(ctx, pool, `CREATE INDEX idx_gue_jobs_selector ON `+gueSchema+`.gue_jobs (queue, run_at, priority)`)
}

// gueConfig: workers per pool (gue's WorkerPool size), poll interval (zero:
// gue's default, 5 s) and connections of each process's pgx pool (zero:
// pgxpool's default).
type gueConfig struct {
	workers   int
	poll      time.Duration
	poolConns int32
	runAt     bool // gue.RunAtPollStrategy (ORDER BY run_at, priority) instead of the default priority order
}

func gueSystem(ctx context.Context, name, settings string, c gueConfig) *system {
	pool := newPool(ctx, 20, gueSchema)
	client, err := gue.NewClient(pgxv5.NewConnPool(pool))
	check(err)
	s := &system{name: name, settings: settings, pool: pool}
	s.reset = func(ctx context.Context) { mustExec(ctx, pool, `TRUNCATE gue_jobs`) }
	s.publish = func(ctx context.Context, tx pgx.Tx, k int, seq int64) error {
		p := payload(seq)
		if k == 1 {
			return client.EnqueueTx(ctx, &gue.Job{Type: "bench", Queue: "bench", Args: p}, pgxv5.NewTx(tx))
		}
		jobs := make([]*gue.Job, k)
		for i := range k {
			jobs[i] = &gue.Job{Type: "bench", Queue: "bench", Args: p}
		}
		return client.EnqueueBatchTx(ctx, jobs[:k], pgxv5.NewTx(tx))
	}
	s.fill = func(ctx context.Context, n int, topic string) {
		p := payload(0)
		jobs := make([]*gue.Job, 1000)
		for left := n; left > 0; left -= 1000 {
			k := min(left, 1000)
			for i := range k {
				jobs[i] = &gue.Job{Type: "bench", Queue: topic, Args: p}
			}
			check(client.EnqueueBatch(ctx, jobs[:k]))
		}
		mustExec(ctx, pool, `ANALYZE gue_jobs`)
	}
	s.left = func(ctx context.Context) int {
		return count(ctx, pool, `SELECT count(*) FROM gue_jobs WHERE queue = 'bench'`)
	}
	s.consume = func(ctx context.Context, procs int, onMsg func(int64)) (start, stop func()) {
		var wps []*gue.WorkerPool
		var pools []*pgxpool.Pool
		// In-flight jobs finish with their own context when the pool stops,
		// so the last job's delete commits.
		opts := []gue.WorkerPoolOption{gue.WithPoolQueue("bench"), gue.WithPoolGracefulShutdown(context.Background)}
		if c.poll > 0 {
			opts = append(opts, gue.WithPoolPollInterval(c.poll))
		}
		if c.runAt {
			opts = append(opts, gue.WithPoolPollStrategy(gue.RunAtPollStrategy))
		}
		for range procs {
			p := newPool(ctx, c.poolConns, gueSchema)
			pools = append(pools, p)
			gc, err := gue.NewClient(pgxv5.NewConnPool(p))
			check(err)
			wp, err := gue.NewWorkerPool(gc, gue.WorkMap{"bench": func(_ context.Context, j *gue.Job) error {
				onMsg(seqOf(j.Args))
				return nil
			}}, c.workers, opts...)
			check(err)
			wps = append(wps, wp)
		}
		return runners(ctx, pools, wps)
	}
	return s
}
