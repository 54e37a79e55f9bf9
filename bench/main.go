// Command bench measures the oncommit relay against hand-written SQL on the
// same PostgreSQL server, in one process, and prints ratios.
//
//	cd bench && go run . -rounds 3            # all scenarios
//	cd bench && go run . -only drain -n 50000
//
// Scenarios:
//
//   - drain: 50,000 messages drained with a no-op handler by 1 relay and by
//     4 relays, beside the raw-SQL loop (claim 100 with SKIP LOCKED, delete by
//     ids) with 1 and 4 workers; rounds are interleaved.
//   - latency: commit-to-handler latency with NOTIFY, one publish every 5 ms.
//   - memory: the relay's heap while it drains 10,000 messages from a backlog
//     of 10k, 100k and 1M rows.
//   - sqlite: on a SQLite file (WAL, synchronous=NORMAL), publish beside a raw
//     INSERT, and one relay draining 50,000 messages beside a raw-SQL loop.
//
// Run only when named with -only:
//
//   - compare: oncommit beside River, gue and the raw-SQL reference, every
//     scenario of issue 6 (compare.go; docs/benchmarks.md).
//   - cost: round trips, statements, WAL bytes and transaction ids per
//     published and delivered message (cost.go; docs/internals.md).
//   - stmt: the relay's claim statements alone, sequentially, beside the raw
//     loop (the SQL cost without the relay's goroutines).
//   - variants: the claim statement with narrower RETURNING lists or without
//     its CASE expressions, each followed by the raw delete.
//   - forward: a backlog forwarded to NATS JetStream and to RabbitMQ by the
//     forwarders (forward/nats, forward/rabbitmq) beside a hand-written
//     claim-publish-await-delete loop (forward.go; docs/benchmarks.md).
//   - inspect: a page of 50 dead messages out of 1,000,000 rows through
//     outbox.List, with its plan (inspect.go; docs/operations.md).
//   - held-mysql, held-sqlite: the held-snapshot scenario (compare's held on
//     PostgreSQL) on MariaDB/MySQL and on a SQLite file: 800 msg/s, a
//     snapshot held for minutes, the history list length or the WAL's size
//     per window (held.go, held_sql.go; docs/benchmarks.md). With
//     -held-for 0, compare's held is a steady soak of -held-steady.
//
// The server comes from OUTBOX_TEST_POSTGRES_URL, else the local default.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

var concurrency = 0 // RelayConfig default

var (
	url            = flag.String("url", envOr("OUTBOX_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL URL")
	only           = flag.String("only", "", "run only this scenario: drain, latency or memory (or one of those only run alone: sqlite, stmt, mysql, mysql-ordered, held-mysql, held-sqlite, sqlite-stmt, compare, cost, vacuum, variants, obs, ordered, forward, inbox, fanout)")
	rounds         = flag.Int("rounds", 3, "interleaved rounds of the drain scenario")
	n              = flag.Int("n", 50000, "messages per drain")
	cpuprofile     = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (with -only drain or obs: of each timed drain, to this file plus .<case>.r<round>)")
	memprofile     = flag.String("memprofile", "", "write an allocation profile of the whole run to this file (with -only drain or obs: of each timed drain, as in -cpuprofile, beside a .base profile taken just before it for -diff_base)")
	drainCases     = flag.String("cases", "", "drain scenario: run only these cases (comma-separated, e.g. raw-loop-4,relay-4); ordered scenario: keys-1, keys-4, hot, publish-keys, publish-one, and claim-1m, publish-wal, publish-cpu (only when named)")
	rawIDs         = flag.Bool("raw-ids", false, "the raw loops claim ids only instead of id, topic, payload")
	claimRandomIDs = flag.Bool("claim-random-ids", false, "ordered claim-1m: seed random ids (gen_random_uuid) instead of ids that grow in insertion order like the relay's ULIDs")
	countDB        = flag.Bool("counters", true, "relays count and time their claims and settles (a tracer and a DB wrapper, part of their client CPU) for the drain lines")
	quiet          = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: func() slog.Level {
		if os.Getenv("OC_DEBUG") != "" {
			return slog.LevelDebug
		}
		return slog.LevelError
	}()}))
)

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func main() {
	flag.Parse()
	if *cpuprofile != "" && !perDrainProfiles() {
		f, err := os.Create(*cpuprofile)
		check(err)
		check(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	if *memprofile != "" && !perDrainProfiles() {
		defer func() {
			f, err := os.Create(*memprofile)
			check(err)
			check(pprof.Lookup("allocs").WriteTo(f, 0))
			f.Close()
		}()
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *url)
	check(err)
	defer pool.Close()
	fmt.Printf("oncommit bench: %s, GOMAXPROCS=%d, %s\n", time.Now().UTC().Format(time.RFC3339), runtime.GOMAXPROCS(0), serverVersion(ctx, pool))
	if *only == "" || *only == "drain" {
		drain(ctx, pool)
	}
	if *only == "" || *only == "sqlite" {
		sqliteBench(ctx)
	}
	if *only == "stmt" {
		stmts(ctx, pool)
	}
	if *only == "mysql-ordered" {
		mysqlOrderedBench(ctx)
		return
	}
	if *only == "mysql" {
		mysqlBench(ctx)
	}
	if *only == "held-mysql" {
		heldMySQL(ctx)
	}
	if *only == "held-sqlite" {
		heldSQLite(ctx)
	}
	if *only == "sqlite-stmt" {
		sqliteStmts(ctx)
	}
	if *only == "compare" {
		compare(ctx, pool)
	}
	if *only == "cost" {
		cost(ctx, pool)
	}
	if *only == "vacuum" {
		vacuumBench(ctx, pool)
	}
	if *only == "obs" {
		obsBench(ctx, pool)
	}
	if *only == "inspect" {
		inspectBench(ctx, pool)
	}
	if *only == "variants" {
		variants(ctx, pool)
	}
	if *only == "ordered" {
		orderedBench(ctx, pool)
	}
	if *only == "forward" {
		forwardBench(ctx, pool)
	}
	if *only == "inbox" {
		inboxBench(ctx, pool)
	}
	if *only == "fanout" {
		fanoutBench(ctx, pool)
	}
	if *only == "" || *only == "latency" {
		latency(ctx, pool)
	}
	if *only == "" || *only == "memory" {
		memory(ctx, pool)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func serverVersion(ctx context.Context, pool *pgxpool.Pool) string {
	var v string
	check(pool.QueryRow(ctx, `SHOW server_version`).Scan(&v))
	return "PostgreSQL " + v
}

// table creates a fresh outbox table in its own schema and returns its Outbox.
func table(ctx context.Context, pool *pgxpool.Pool, name string) *outbox.Outbox {
	schema := "bench_" + name
	_, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	check(err)
	db := openDB(pool)
	check(postgres.Migrate(ctx, db, schema+".outbox"))
	db.Close()
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: schema + ".outbox"})
	check(err)
	return ob
}

// fill publishes n messages in transactions of 1,000.
func fill(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, n int, topic string) {
	batch := make([]outbox.Message, 1000)
	for i := range batch {
		batch[i] = outbox.Message{Topic: topic, Payload: []byte(`{"order_id":"0193a1f2","total_cents":4200}`)}
	}
	for left := n; left > 0; left -= len(batch) {
		k := min(left, len(batch))
		tx, err := pool.Begin(ctx)
		check(err)
		_, err = ob.PublishBatch(ctx, pgxtx.From(tx), batch[:k])
		check(err)
		check(tx.Commit(ctx))
	}
	_, err := pool.Exec(ctx, `ANALYZE `+pgsql.QuoteTable(ob.Table()))
	check(err)
}

func openDB(pool *pgxpool.Pool) *sql.DB { return stdlib.OpenDBFromPool(pool) }

func remaining(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox) int {
	var k int
	check(pool.QueryRow(ctx, `SELECT count(*) FROM `+pgsql.QuoteTable(ob.Table())).Scan(&k))
	return k
}

// rawLoop drains the table with hand-written SQL: claim 100 with SKIP
// LOCKED (the same lease update a relay makes), reading what a loop that
// delivers messages must read (id, topic, payload), then delete by ids.
// With -raw-ids the claim returns ids only, as a loop that never looks at
// its messages would (the stricter, less realistic reference).
func rawLoop(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, workers int) {
	tbl := pgsql.QuoteTable(ob.Table())
	claim := `WITH due AS MATERIALIZED (SELECT id FROM ` + tbl + ` WHERE state IN ('pending','processing') AND available_at <= now() AND topic = 'bench'
		ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED)
		UPDATE ` + tbl + ` AS o SET state = 'processing', attempts = o.attempts + 1, available_at = now() + interval '30 seconds'
		FROM due WHERE o.id = due.id RETURNING o.id, o.topic, o.payload`
	if *rawIDs {
		claim = strings.TrimSuffix(claim, ", o.topic, o.payload")
	}
	del := `DELETE FROM ` + tbl + ` WHERE id = ANY($1)`
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				rows, err := pool.Query(ctx, claim)
				check(err)
				var ids [][16]byte
				for rows.Next() {
					var id [16]byte
					var topic string
					var payload []byte
					if *rawIDs {
						check(rows.Scan(&id))
					} else {
						check(rows.Scan(&id, &topic, &payload))
					}
					ids = append(ids, id)
				}
				check(rows.Err())
				if len(ids) == 0 {
					return
				}
				_, err = pool.Exec(ctx, del, ids)
				check(err)
			}
		}()
	}
	wg.Wait()
}

// relays prepares k relays on the table, each on its own pool with a
// connection already open (as in a service that has been running), and
// returns the drain to time: run them until every message is handled, then
// stop them (Run drains: every outcome is written before it returns).
func relays(ctx context.Context, ob *outbox.Outbox, k, total int, observer ...outbox.RelayObserver) (run func()) {
	var done atomic.Int64
	finished := make(chan struct{})
	var rs []*outbox.Relay
	var pools []*pgxpool.Pool
	for range k {
		p, err := pgxpool.New(ctx, *url)
		check(err)
		check(p.Ping(ctx))
		pools = append(pools, p)
		cfg := outbox.RelayConfig{Logger: quiet, PollInterval: 20 * time.Millisecond, Listen: outbox.ListenOff, Concurrency: concurrency, BatchSize: batchSize}
		if len(observer) > 0 {
			cfg.Observer = observer[0]
		}
		var db outbox.DB = pgxtx.FromPool(p)
		if *countDB {
			db, cfg.Tracer = timedDB{db}, stats
		}
		r, err := ob.Relay(db, cfg)
		check(err)
		check(r.Handle("bench", func(ctx context.Context, d outbox.Delivery) error {
			if done.Add(1) == int64(total) {
				close(finished)
			}
			return nil
		}))
		rs = append(rs, r)
	}
	return func() {
		ctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for _, r := range rs {
			wg.Add(1)
			go func() { defer wg.Done(); check(r.Run(ctx)) }()
		}
		<-finished
		cancel()
		wg.Wait()
		for _, p := range pools {
			p.Close()
		}
	}
}

func drain(ctx context.Context, pool *pgxpool.Pool) {
	fmt.Printf("\n== drain: %d messages, no-op handler, %d interleaved rounds (seconds, lower is better)\n", *n, *rounds)
	cases := []struct {
		name string
		prep func(ob *outbox.Outbox) (run func())
	}{
		{"raw-loop-1", func(ob *outbox.Outbox) func() { return func() { rawLoop(ctx, pool, ob, 1) } }},
		{"relay-1", func(ob *outbox.Outbox) func() { return relays(ctx, ob, 1, *n) }},
		{"raw-loop-4", func(ob *outbox.Outbox) func() { return func() { rawLoop(ctx, pool, ob, 4) } }},
		{"relay-4", func(ob *outbox.Outbox) func() { return relays(ctx, ob, 4, *n) }},
	}
	if *drainCases != "" {
		want := strings.Split(*drainCases, ",")
		cases = slices.DeleteFunc(cases, func(c struct {
			name string
			prep func(ob *outbox.Outbox) (run func())
		}) bool {
			return !slices.Contains(want, c.name)
		})
	}
	// Per case: seconds, client CPU (µs per message) and allocations per
	// message of each round.
	secs, cpus, allocs := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for round := 1; round <= *rounds; round++ {
		for _, c := range cases {
			ob := table(ctx, pool, "drain")
			fill(ctx, pool, ob, *n, "bench")
			run := c.prep(ob)
			stopProfiles := drainProfiles(fmt.Sprintf(".%s.r%d", c.name, round))
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			cpu0, srv0 := processCPU(), serverCPU()
			t0 := time.Now()
			run()
			s := time.Since(t0).Seconds()
			cpu, srv := processCPU()-cpu0, serverCPU()-srv0
			runtime.ReadMemStats(&m1)
			stopProfiles()
			if left := remaining(ctx, pool, ob); left != 0 {
				check(fmt.Errorf("%s left %d rows", c.name, left))
			}
			perCPU, perAlloc := float64(cpu.Nanoseconds())/1e3/float64(*n), float64(m1.Mallocs-m0.Mallocs)/float64(*n)
			secs[c.name] = append(secs[c.name], s)
			cpus[c.name] = append(cpus[c.name], perCPU)
			allocs[c.name] = append(allocs[c.name], perAlloc)
			fmt.Printf("round %d %-11s %6.2fs  %8.0f msg/s  client CPU %4.1f µs/msg  server CPU %4.1f µs/msg  %4.1f allocs/msg  %s\n", round, c.name, s, float64(*n)/s, perCPU, float64(srv.Nanoseconds())/1e3/float64(*n), perAlloc, stats)
		}
	}
	for _, w := range []string{"1", "4"} {
		raw, rel := "raw-loop-"+w, "relay-"+w
		if len(secs[raw]) == 0 || len(secs[rel]) == 0 {
			continue
		}
		fmt.Printf("median: relay-%s %.0f msg/s, raw-loop-%s %.0f msg/s; relay/raw throughput = %.2fx\n",
			w, float64(*n)/median(secs[rel]), w, float64(*n)/median(secs[raw]), median(secs[raw])/median(secs[rel]))
		fmt.Printf("median: relay-%s client CPU %.2f µs/msg (%.2f-%.2f), %.1f allocs/msg; raw-loop-%s %.2f µs/msg (%.2f-%.2f), %.1f allocs/msg; relay/raw CPU = %.2fx\n",
			w, median(cpus[rel]), slices.Min(cpus[rel]), slices.Max(cpus[rel]), median(allocs[rel]),
			w, median(cpus[raw]), slices.Min(cpus[raw]), slices.Max(cpus[raw]), median(allocs[raw]), median(cpus[rel])/median(cpus[raw]))
	}
}

// perDrainProfiles reports whether -cpuprofile and -memprofile profile
// each timed drain (-only drain and -only obs) rather than the whole run.
func perDrainProfiles() bool { return *only == "drain" || *only == "obs" }

// drainProfiles starts the CPU profile of one timed drain (-cpuprofile
// plus suffix) and writes an allocation profile just before it (-memprofile
// plus suffix plus .base), and returns what stops them, writing the
// allocation profile after it: compare the two with go tool pprof
// -diff_base. Without -only drain or obs, the profiles cover the whole
// run instead (see main).
func drainProfiles(suffix string) (stop func()) {
	if !perDrainProfiles() {
		return func() {}
	}
	writeAllocs := func(name string) {
		runtime.GC() // the allocation profile is as of the last GC
		f, err := os.Create(name)
		check(err)
		check(pprof.Lookup("allocs").WriteTo(f, 0))
		check(f.Close())
	}
	if *memprofile != "" {
		writeAllocs(*memprofile + suffix + ".base")
	}
	var cpuFile *os.File
	if *cpuprofile != "" {
		var err error
		cpuFile, err = os.Create(*cpuprofile + suffix)
		check(err)
		check(pprof.StartCPUProfile(cpuFile))
	}
	return func() {
		if cpuFile != nil {
			pprof.StopCPUProfile()
			check(cpuFile.Close())
		}
		if *memprofile != "" {
			writeAllocs(*memprofile + suffix)
		}
	}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func latency(ctx context.Context, pool *pgxpool.Pool) {
	const samples = 1000
	fmt.Printf("\n== latency: commit to handler start with NOTIFY, %d messages, one every 5 ms, poll interval 10s\n", samples)
	ob := table(ctx, pool, "latency")
	var mu sync.Mutex
	var lat []time.Duration
	committed := map[outbox.ID]time.Time{}
	got := make(chan struct{}, samples)
	r, err := ob.Relay(pgxtx.FromPool(pool), outbox.RelayConfig{Logger: quiet, PollInterval: 10 * time.Second})
	check(err)
	check(r.Handle("lat", func(ctx context.Context, d outbox.Delivery) error {
		now := time.Now()
		mu.Lock()
		if c, ok := committed[d.ID]; ok {
			lat = append(lat, now.Sub(c))
		}
		mu.Unlock()
		got <- struct{}{}
		return nil
	}))
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { check(r.Run(rctx)); close(done) }()
	time.Sleep(500 * time.Millisecond) // listener up
	for range samples {
		tx, err := pool.Begin(ctx)
		check(err)
		res, err := ob.Publish(ctx, pgxtx.From(tx), outbox.Message{Topic: "lat"})
		check(err)
		mu.Lock() // the handler may run as soon as COMMIT returns
		check(tx.Commit(ctx))
		committed[res.ID] = time.Now()
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	for range samples {
		<-got
	}
	cancel()
	<-done
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
	fmt.Printf("samples %d: p50 %v, p90 %v, p99 %v, max %v\n", len(lat), pct(0.50).Round(10*time.Microsecond), pct(0.90).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond))
}

func memory(ctx context.Context, pool *pgxpool.Pool) {
	const drainN = 10000
	fmt.Printf("\n== memory: relay heap while draining %d messages from a backlog of N rows\n", drainN)
	for _, backlog := range []int{10000, 100000, 1000000} {
		ob := table(ctx, pool, "memory")
		tbl := pgsql.QuoteTable(ob.Table())
		// The backlog: N due rows of the relay's topic; the relay drains
		// the first drainN of them.
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (id, topic, payload, available_at)
			SELECT gen_random_uuid(), 'bench', '{"order_id":"0193a1f2","total_cents":4200}', now() - make_interval(secs => g)
			FROM generate_series(1, %d) g`, tbl, backlog))
		check(err)
		_, err = pool.Exec(ctx, `ANALYZE `+tbl)
		check(err)
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		var peak atomic.Uint64
		stop := make(chan struct{})
		sampler := make(chan struct{})
		go func() {
			defer close(sampler)
			var m runtime.MemStats
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				runtime.ReadMemStats(&m)
				if m.HeapInuse > peak.Load() {
					peak.Store(m.HeapInuse)
				}
			}
		}()
		t0 := time.Now()
		relays(ctx, ob, 1, drainN)() // stops after drainN deliveries
		secs := time.Since(t0).Seconds()
		close(stop)
		<-sampler
		fmt.Printf("backlog %8d rows: peak heap in use %6.1f MiB (%.1f MiB before), drained %d in %.2fs\n",
			backlog, float64(peak.Load())/(1<<20), float64(before.HeapInuse)/(1<<20), drainN, secs)
	}
}

var batchSize int

func init() {
	flag.IntVar(&concurrency, "concurrency", 0, "RelayConfig.Concurrency of each relay (0: the default)")
	flag.IntVar(&batchSize, "batch", 0, "RelayConfig.BatchSize of each relay (0: the default)")
}

// counters observe claims and settles, for -v.
type counters struct {
	claims, claimed, settles, settled atomic.Int64
}

var stats = &counters{}

func (c *counters) TraceClaim(_ context.Context, cs []outboxdriver.Claimed, _ error) {
	c.claims.Add(1)
	c.claimed.Add(int64(len(cs)))
}

func (c *counters) TraceSettle(_ context.Context, s []outboxdriver.Settlement, _ []outboxdriver.Fence, _ error) {
	c.settles.Add(1)
	c.settled.Add(int64(len(s)))
}

func (c *counters) String() string {
	s := fmt.Sprintf("claims %d (avg %.1f rows), settles %d (avg %.1f rows)", c.claims.Load(), float64(c.claimed.Load())/float64(max(1, c.claims.Load())),
		c.settles.Load(), float64(c.settled.Load())/float64(max(1, c.settles.Load())))
	s += fmt.Sprintf(", claim time %.2fs, settle time %.2fs", time.Duration(claimTime.Swap(0)).Seconds(), time.Duration(settleTime.Swap(0)).Seconds())
	c.claims.Store(0)
	c.claimed.Store(0)
	c.settles.Store(0)
	c.settled.Store(0)
	return s
}

// timedDB measures the time of claim and settle statements, for the
// counters line.
type timedDB struct{ outbox.DB }

type timedRows struct {
	outboxdriver.Rows
	start time.Time
	acc   *atomic.Int64
}

func (t timedRows) Close() error {
	err := t.Rows.Close()
	t.acc.Add(int64(time.Since(t.start)))
	return err
}

var claimTime, settleTime atomic.Int64

func (d timedDB) QueryDB(ctx context.Context, q string, args ...any) (outboxdriver.Rows, error) {
	start := time.Now()
	rows, err := d.DB.QueryDB(ctx, q, args...)
	if err != nil {
		return rows, err
	}
	acc := &settleTime
	if strings.Contains(q, "SKIP LOCKED") {
		acc = &claimTime
	}
	return timedRows{rows, start, acc}, nil
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	check(syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU is the CPU time of the local PostgreSQL server's processes, or
// 0 when none is visible in /proc: the live ones' user and system time plus
// the children's time of each (the postmaster's includes the backends that
// have exited). Meaningful only with the server on this host.
func serverCPU() time.Duration {
	dirs, _ := os.ReadDir("/proc")
	var ticks int64
	for _, d := range dirs {
		if d.Name()[0] < '0' || d.Name()[0] > '9' {
			continue
		}
		if comm, f := procStat(d.Name()); comm == "postgres" {
			// utime, stime, cutime, cstime are fields 14-17 of stat(5).
			ticks += statTicks(f, 14, 15, 16, 17)
		}
	}
	return time.Duration(ticks) * time.Second / 100
}

// procStat returns the command of process pid and the fields of its
// /proc/pid/stat after the command (f[0] is field 3 of stat(5), the
// state), or "" when it cannot be read.
func procStat(pid string) (comm string, f []string) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", nil
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", nil
	}
	f = strings.Fields(s[end+1:])
	if len(f) < 15 {
		return "", nil
	}
	return s[open+1 : end], f
}

// statTicks sums fields (numbered as in stat(5)) of procStat's f.
func statTicks(f []string, fields ...int) int64 {
	var ticks int64
	for _, k := range fields {
		v, _ := strconv.ParseInt(f[k-3], 10, 64)
		ticks += v
	}
	return ticks
}
