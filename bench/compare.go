package main

// -only compare: oncommit beside River, gue and the raw-SQL reference, in
// one process against one server, systems alternating within each round.

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	_ "github.com/oncommit/oncommit/dialect/postgres" // fills in pgsql
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

var (
	compareOnly = flag.String("scenarios", "", "compare: comma-separated scenarios to run (default all): "+strings.Join(compareScenarios, ","))
	chartPath   = flag.String("chart", "", "compare: write a PNG chart of the throughput scenarios to this file (e.g. ../docs/bench-compare.png)")
	notifyEvery = flag.Duration("notify-interval", outbox.DefaultNotifyInterval, "compare: Config.NotifyInterval of the oncommit-best system (the default's, 5ms, unless set)")
	systemsOnly = flag.String("systems", "", "compare: comma-separated systems to run (default all; raw always runs)")
	latencyN    = flag.Int("latency-n", 300, "compare: messages per latency measurement (at 100 msg/s)")
	latency8N   = flag.Int("latency8-n", 1500, "compare: messages per latency8 measurement (at 500 msg/s from 8 producers)")
)

var compareScenarios = []string{"publish-1", "publish-8", "publish-100", "publish-100-8", "drain-1", "drain-4", "latency", "latency8", "claim", "skew", "skew-3", "notify", "wal-bytes", "held"}

// series is one scenario's figures for one system, one per round.
type series struct {
	scenario, system, unit string
	higherIsBetter         bool
	vals                   []float64
}

type results struct {
	order []string
	by    map[string]*series
}

func (r *results) add(scenario, system, unit string, higher bool, v float64) {
	k := scenario + "\x00" + system
	s, ok := r.by[k]
	if !ok {
		s = &series{scenario: scenario, system: system, unit: unit, higherIsBetter: higher}
		r.by[k] = s
		r.order = append(r.order, k)
	}
	s.vals = append(s.vals, v)
	fmt.Printf("  %-12s %-20s %10.6g %s\n", scenario, system, v, unit)
}

func (r *results) get(scenario, system string) *series { return r.by[scenario+"\x00"+system] }

// ratio is the ratio of medians to the raw reference, oriented so that
// above 1 is better than raw; 0 when there is no reference.
func (r *results) ratio(s *series) float64 {
	raw := r.get(s.scenario, "raw")
	if raw == nil || s.system == "raw" {
		return 0
	}
	if s.higherIsBetter {
		return median(s.vals) / median(raw.vals)
	}
	return median(raw.vals) / median(s.vals)
}

// pairedRatio is the median over rounds of the round's ratio to the raw
// reference of the same round, oriented as ratio; 0 when there is no
// reference. Rounds alternate the systems, so a round's two figures were
// taken seconds apart: when the host's speed swings from round to round
// (here by up to 1.6x), this is the steadier estimate of the two.
func (r *results) pairedRatio(s *series) float64 {
	raw := r.get(s.scenario, "raw")
	if raw == nil || s.system == "raw" || len(raw.vals) != len(s.vals) {
		return 0
	}
	per := make([]float64, len(s.vals))
	for i, v := range s.vals {
		if s.higherIsBetter {
			per[i] = v / raw.vals[i]
		} else {
			per[i] = raw.vals[i] / v
		}
	}
	return median(per)
}

func compare(ctx context.Context, admin *pgxpool.Pool) {
	want := func(s string) bool {
		return *compareOnly == "" || slices.Contains(strings.Split(*compareOnly, ","), s)
	}
	printEnvironment(ctx, admin)
	set := newSystems(ctx, admin)
	raw, onc, oncOff, oncEvery, oncBest, oncAsync, riv, rivBest, gu, guBest := set.raw, set.onc, set.oncOff, set.oncEvery, set.oncBest, set.oncAsync, set.riv, set.rivBest, set.gu, set.guBest
	wal := set.oncWAL

	fmt.Println("\nsystems:")
	for _, s := range []*system{raw, onc, oncOff, oncEvery, oncBest, oncAsync, riv, rivBest, gu, guBest, wal} {
		if s == nil {
			continue
		}
		fmt.Printf("  %-20s %s\n", s.name, s.settings)
	}

	pick := func(ss ...*system) []*system {
		var out []*system
		for _, s := range ss {
			if s != nil && systemWanted(s.name) {
				out = append(out, s)
			}
		}
		return out
	}
	publishers := pick(raw, onc, oncOff, oncBest, riv, gu, wal)
	consumers := pick(raw, onc, oncAsync, riv, rivBest, gu, guBest, wal)
	res := &results{by: map[string]*series{}}
	for round := 1; round <= *rounds; round++ {
		fmt.Printf("\n== compare round %d of %d\n", round, *rounds)
		// rotate starts each round's alternation at another system
		rotate := func(ss []*system) []*system {
			k := (round - 1) % len(ss)
			return append(append([]*system(nil), ss[k:]...), ss[:k]...)
		}
		for _, p := range []struct {
			name                  string
			producers, txs, perTx int
		}{{"publish-1", 1, 8000, 1}, {"publish-8", 8, 8000, 1}, {"publish-100", 1, 400, 100}, {"publish-100-8", 8, 800, 100}} {
			if !want(p.name) {
				continue
			}
			// Each system's transactions run in publishChunks parts that
			// alternate with the other systems' (in a rotated order each
			// time), so a slow spell of the host's fsync, which moves a
			// one-producer publish by 20% from one second to the next,
			// falls on every system alike. A system's rate is its messages
			// over the sum of its parts' times. Client CPU per message:
			// getrusage of this process over the timed transactions (no
			// consumer runs meanwhile), which does not depend on how
			// loaded the host is as throughput does.
			order := rotate(publishers)
			secs, cpu := make([]float64, len(order)), make([]time.Duration, len(order))
			part := p.txs / publishChunks
			msgs := float64(part / p.producers * p.producers * p.perTx)
			for c := range publishChunks {
				for j := range order {
					i := (j + c) % len(order)
					var cpu0 time.Duration
					rate := publishRun(ctx, order[i], p.producers, part, p.perTx, func() { cpu0 = processCPU() })
					cpu[i] += processCPU() - cpu0
					secs[i] += msgs / rate
				}
			}
			for i, s := range order {
				res.add(p.name, s.name, "msg/s", true, msgs*publishChunks/secs[i])
			}
			for i, s := range order {
				res.add(p.name+"-cpu", s.name, "us/msg", false, float64(cpu[i].Nanoseconds())/1e3/(msgs*publishChunks))
			}
		}
		for _, procs := range []int{1, 4} {
			name := fmt.Sprintf("drain-%d", procs)
			if !want(name) {
				continue
			}
			for _, s := range rotate(consumers) {
				// Client CPU per delivered message: getrusage of this
				// process from the start of the drain (consumers built) to
				// its end.
				var cpu0 time.Duration
				res.add(name, s.name, "msg/s", true, drainRun(ctx, s, procs, *n, func() { cpu0 = processCPU() }))
				res.add(name+"-cpu", s.name, "us/msg", false, float64((processCPU()-cpu0).Nanoseconds())/1e3/float64(*n))
			}
		}
		if want("latency") {
			for _, s := range rotate(pick(onc, oncBest, oncAsync, riv, rivBest, gu, guBest, wal)) { // raw has no consumer
				p50, p99 := latencyRun(ctx, s, *latencyN)
				res.add("latency-p50", s.name, "ms", false, p50)
				res.add("latency-p99", s.name, "ms", false, p99)
			}
		}
		if want("latency8") {
			// oncommit only: open-loop transactions need connections that the
			// other systems' pools, kept open for the whole run, would take
			// past max_connections (100 here).
			for _, s := range rotate(pick(onc, oncBest, oncEvery, oncAsync)) { // raw has no consumer
				p50, p99 := latency8Run(ctx, s, *latency8N)
				res.add("latency8-p50", s.name, "ms", false, p50)
				res.add("latency8-p99", s.name, "ms", false, p99)
			}
		}
		if *compareOnly != "" && want("held") { // minutes: only when named
			for _, s := range pick(onc, wal) {
				heldRun(ctx, s)
			}
		}
		if want("wal-bytes") {
			// oncommit's table and the WAL transport only: the WAL a
			// message costs over its whole life.
			for _, s := range rotate(pick(onc, wal)) {
				res.add("wal-bytes", s.name, "B/msg", false, walBytesRun(ctx, s, *walBytesN))
			}
		}
		if want("claim") {
			for _, backlog := range []int{10_000, 1_000_000} {
				claimRun(ctx, res, backlog)
			}
		}
		if want("skew") {
			for _, s := range rotate(pick(raw, onc, rivBest, guBest)) {
				res.add("skew", s.name, "ms", false, skewRun(ctx, s))
			}
		}
		if want("skew-3") {
			// A relay of three topics: "bench" and two with no messages.
			for _, s := range rotate(pick(onc)) {
				s.also = []string{"bench.b", "bench.c"}
				res.add("skew-3", s.name, "ms", false, skewRun(ctx, s))
				s.also = nil
			}
		}
		if want("notify") {
			for _, producers := range []int{1, 4, 16} {
				name := fmt.Sprintf("notify-%d", producers)
				for _, s := range rotate(pick(raw, onc, oncOff, oncEvery, oncBest)) {
					res.add(name, s.name, "msg/s", true, publishRun(ctx, s, producers, 1600, 1, nil))
				}
			}
		}
	}
	printSummary(res)
	if *chartPath != "" {
		var charted []string
		for _, sc := range []string{"publish-1", "publish-8", "publish-100", "drain-1", "drain-4"} {
			if res.get(sc, "raw") != nil {
				charted = append(charted, sc)
			}
		}
		check(writeChart(*chartPath, res, charted))
		fmt.Printf("\nchart written to %s\n", *chartPath)
	}
}

// publishRun commits txs transactions of perTx messages from producers
// goroutines (BEGIN, publish, COMMIT each) and returns messages per second.
// mark, if not nil, is called just before the first transaction.
// publishChunks is how many alternating parts a compare round splits each
// system's publish transactions into.
const publishChunks = 8

func publishRun(ctx context.Context, s *system, producers, txs, perTx int, mark func()) float64 {
	s.reset(ctx)
	if mark != nil {
		mark()
	}
	var wg sync.WaitGroup
	t0 := time.Now()
	for range producers {
		wg.Go(func() {
			for range txs / producers {
				tx, err := s.pool.Begin(ctx)
				check(err)
				check(s.publish(ctx, tx, perTx, 0))
				check(tx.Commit(ctx))
			}
		})
	}
	wg.Wait()
	return float64(txs/producers*producers*perTx) / time.Since(t0).Seconds()
}

// drainRun fills a backlog of n messages, then times procs consumer
// processes (or raw loops) from their start until every message (n/share
// for a slow system) is delivered and every outcome written. Every
// delivered message must be gone from the backlog, and no other. mark, if
// not nil, is called once the backlog is in place, just before the drain.
func drainRun(ctx context.Context, s *system, procs, n int, mark func()) float64 {
	s.reset(ctx)
	s.fill(ctx, n, "bench")
	if mark == nil {
		mark = func() {}
	}
	var secs float64
	want, delivered := n, int64(n)
	if s.rawDrain != nil {
		mark()
		t0 := time.Now()
		s.rawDrain(ctx, procs)
		secs = time.Since(t0).Seconds()
	} else {
		want = n / max(1, s.share)
		var k atomic.Int64
		onMsg, done := untilHandled(want, func(int64) { k.Add(1) })
		start, stop := s.consume(ctx, procs, onMsg)
		mark()
		t0 := time.Now()
		start()
		<-done
		stop()
		secs = time.Since(t0).Seconds()
		closePools()
		delivered = k.Load()
	}
	if left := s.left(ctx); int64(left)+delivered != int64(n) {
		check(fmt.Errorf("%s: drain delivered %d of %d messages and left %d", s.name, delivered, n, left))
	}
	return float64(want) / secs
}

// latencyRun publishes k messages at 100 a second, one per transaction,
// while one consumer runs, and returns p50 and p99 of the time from the
// return of COMMIT to the start of the handler, in milliseconds. A handler
// may start before the producer sees COMMIT return; that counts as 0.
func latencyRun(ctx context.Context, s *system, k int) (p50, p99 float64) {
	s.reset(ctx)
	committed := make([]atomic.Int64, k+1)
	handled := make([]atomic.Int64, k+1)
	onMsg, done := untilHandled(k, func(seq int64) {
		if seq > 0 && seq <= int64(k) {
			handled[seq].Store(time.Now().UnixNano())
		}
	})
	start, stop := s.consume(ctx, 1, onMsg)
	start()
	time.Sleep(500 * time.Millisecond) // listeners up
	tick := time.NewTicker(10 * time.Millisecond)
	for seq := 1; seq <= k; seq++ {
		<-tick.C
		tx, err := s.pool.Begin(ctx)
		check(err)
		check(s.publish(ctx, tx, 1, int64(seq)))
		check(tx.Commit(ctx))
		committed[seq].Store(time.Now().UnixNano())
	}
	tick.Stop()
	return latencies(s, "latency", done, stop, committed, handled)
}

// latency8Run publishes k messages, one per transaction, from 8 producers
// at 62.5 transactions a second each (500 msg/s in all, the producers'
// schedules staggered), while one consumer runs. Each transaction starts
// on schedule in a goroutine of its own (open loop: a slow commit delays
// no other) and stays open 0-50 ms (uniform) after the publish before its
// COMMIT, so commits come in another order than publishes: with coalesced
// NOTIFY, publishes made silent may commit long after the notifying one.
// It returns p50 and p99 of the time from the return of COMMIT to the
// start of the handler, in milliseconds (a handler that starts before the
// producer sees COMMIT return counts as 0).
func latency8Run(ctx context.Context, s *system, k int) (p50, p99 float64) {
	const producers, perSecond, maxHold = 8, 500, 50 * time.Millisecond
	s.reset(ctx)
	committed := make([]atomic.Int64, k+1)
	handled := make([]atomic.Int64, k+1)
	onMsg, done := untilHandled(k, func(seq int64) {
		if seq > 0 && seq <= int64(k) {
			handled[seq].Store(time.Now().UnixNano())
		}
	})
	// The producers' transactions overlap (up to 50 ms each at 500 a
	// second): open the pool's connections first, as in a service that has
	// been running, so the first round does not time a burst of backend
	// starts.
	warm(ctx, s.pool)
	start, stop := s.consume(ctx, 1, onMsg)
	start()
	time.Sleep(500 * time.Millisecond) // listeners up
	every := time.Second * producers / perSecond
	var txs sync.WaitGroup
	var producing sync.WaitGroup
	for p := range producers {
		producing.Go(func() {
			time.Sleep(every * time.Duration(p) / producers)
			tick := time.NewTicker(every)
			defer tick.Stop()
			for seq := p + 1; seq <= k; seq += producers {
				<-tick.C
				hold := rand.N(maxHold)
				txs.Go(func() {
					tx, err := s.pool.Begin(ctx)
					check(err)
					check(s.publish(ctx, tx, 1, int64(seq)))
					time.Sleep(hold)
					check(tx.Commit(ctx))
					committed[seq].Store(time.Now().UnixNano())
				})
			}
		})
	}
	producing.Wait()
	txs.Wait()
	return latencies(s, "latency8", done, stop, committed, handled)
}

// warm opens every connection of pool (acquires them all at once, then
// releases them).
func warm(ctx context.Context, pool *pgxpool.Pool) {
	n := int(pool.Config().MaxConns)
	conns := make([]*pgxpool.Conn, 0, n)
	for range n {
		c, err := pool.Acquire(ctx)
		check(err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
}

// latencies waits (30 s at most) for every message to be handled, stops the
// consumer and returns p50 and p99 of commit-to-handler times in ms.
func latencies(s *system, scenario string, done <-chan struct{}, stop func(), committed, handled []atomic.Int64) (p50, p99 float64) {
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		check(fmt.Errorf("%s: %s: not every message delivered within 30s", s.name, scenario))
	}
	stop()
	closePools()
	k := len(committed) - 1
	lat := make([]float64, 0, k)
	for i := 1; i <= k; i++ {
		if handled[i].Load() == 0 {
			check(fmt.Errorf("%s: %s: message %d delivered without its sequence number", s.name, scenario, i))
		}
		lat = append(lat, max(0, float64(handled[i].Load()-committed[i].Load())/1e6))
	}
	return percentile(lat, 0.50), percentile(lat, 0.99)
}

func percentile(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1))]
}

// claimRun times the claim statements of one oncommit relay (defaults)
// draining claimDrain messages from a backlog of due messages, and samples
// the process's heap meanwhile.
func claimRun(ctx context.Context, res *results, backlog int) {
	const claimDrain = 20_000
	pool := newPool(ctx, 4, "")
	defer pool.Close()
	ob := table(ctx, pool, "cmp_claim")
	tbl := pgsql.QuoteTable(ob.Table())
	mustExec(ctx, pool, fmt.Sprintf(`INSERT INTO %s (id, topic, payload, available_at)
		SELECT gen_random_uuid(), 'bench', '{"seq":0,"order_id":"0193a1f2","email":"someone@example.com","total_cents":4200}', now() - make_interval(secs => g)
		FROM generate_series(1, %d) g`, tbl, backlog))
	mustExec(ctx, pool, `VACUUM ANALYZE `+tbl)
	drainN := min(claimDrain, backlog/2)
	timer := &claimTimer{}
	r, err := ob.Relay(claimTimerDB{pgxtx.FromPool(pool), timer}, outbox.RelayConfig{Logger: quiet})
	check(err)
	onMsg, done := untilHandled(drainN, nil)
	check(r.Handle("bench", func(context.Context, outbox.Delivery) error { onMsg(0); return nil }))
	runtime.GC()
	heap := sampleHeap()
	rctx, cancel := context.WithCancel(ctx)
	t0 := time.Now()
	go func() { <-done; cancel() }()
	check(r.Run(rctx))
	secs := time.Since(t0).Seconds()
	peak := heap()
	name := fmt.Sprintf("claim-%s", rowsLabel(backlog))
	timer.mu.Lock()
	samples := timer.d
	timer.mu.Unlock()
	res.add(name+"-p50", "oncommit", "ms", false, percentile(samples, 0.50))
	res.add(name+"-p99", "oncommit", "ms", false, percentile(samples, 0.99))
	res.add(name+"-rate", "oncommit", "msg/s", true, float64(drainN)/secs)
	res.add(name+"-heap", "oncommit", "MiB", false, peak)
}

func rowsLabel(n int) string {
	if n >= 1_000_000 {
		return fmt.Sprintf("%dM", n/1_000_000)
	}
	return fmt.Sprintf("%dk", n/1000)
}

// sampleHeap samples HeapInuse every 20 ms until the returned function is
// called, which returns the peak in MiB.
func sampleHeap() func() float64 {
	var peak atomic.Uint64
	stop := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() float64 {
		close(stop)
		<-finished
		return float64(peak.Load()) / (1 << 20)
	}
}

// claimTimer collects the duration of every claim statement, in ms.
type claimTimer struct {
	mu sync.Mutex
	d  []float64
}

type claimTimerDB struct {
	outbox.DB
	t *claimTimer
}

type claimTimerRows struct {
	outboxdriver.Rows
	start time.Time
	t     *claimTimer
}

func (r claimTimerRows) Close() error {
	err := r.Rows.Close()
	ms := float64(time.Since(r.start).Microseconds()) / 1000
	r.t.mu.Lock()
	r.t.d = append(r.t.d, ms)
	r.t.mu.Unlock()
	return err
}

func (d claimTimerDB) QueryDB(ctx context.Context, q string, args ...any) (outboxdriver.Rows, error) {
	start := time.Now()
	rows, err := d.DB.QueryDB(ctx, q, args...)
	if err != nil || !strings.Contains(q, "SKIP LOCKED") {
		return rows, err
	}
	return claimTimerRows{rows, start, d.t}, nil
}

// skewRun puts 50 due messages of topic "bench" behind 200,000 older due
// messages of topic "other" and returns, in milliseconds, how long one
// consumer of "bench" (and of s.also) takes to deliver the 50: a consumer
// that has been running (started 500 ms before, its first claims made and
// its listener up), timed from the COMMIT of the transaction that publishes
// the 50 (one transaction, sent after the backlog) to the 50th delivery.
// The raw reference is one raw loop started after the 50 are committed,
// timed until they are claimed and deleted.
func skewRun(ctx context.Context, s *system) float64 {
	const behind, due = 200_000, 50
	s.reset(ctx)
	s.fill(ctx, behind, "other")
	var ms float64
	if s.rawDrain != nil {
		s.fill(ctx, due, "bench")
		t0 := time.Now()
		s.rawDrain(ctx, 1)
		ms = float64(time.Since(t0).Microseconds()) / 1000
	} else {
		onMsg, done := untilHandled(due, nil)
		start, stop := s.consume(ctx, 1, onMsg)
		start()
		time.Sleep(500 * time.Millisecond)
		tx, err := s.pool.Begin(ctx)
		check(err)
		check(s.publish(ctx, tx, due, 0))
		t0 := time.Now()
		check(tx.Commit(ctx))
		<-done
		ms = float64(time.Since(t0).Microseconds()) / 1000
		stop()
		closePools()
	}
	if left := s.left(ctx); left != 0 {
		check(fmt.Errorf("%s: skew left %d messages", s.name, left))
	}
	return ms
}

func printSummary(res *results) {
	fmt.Printf("\n== compare summary: medians of %d rounds, spread min-max; x raw = ratio of medians to the raw reference (above 1: better than raw); paired = median of the rounds' own ratios to raw\n", *rounds)
	fmt.Printf("%-18s %-20s %12s %25s %8s %8s\n", "scenario", "system", "median", "min-max", "x raw", "paired")
	times := func(r float64) string {
		if r > 0 {
			return fmt.Sprintf("%.2fx", r)
		}
		return "-"
	}
	for _, k := range res.order {
		s := res.by[k]
		fmt.Printf("%-18s %-20s %12s %25s %8s %8s\n", s.scenario, s.system, num(median(s.vals))+" "+s.unit,
			num(slices.Min(s.vals))+"-"+num(slices.Max(s.vals)), times(res.ratio(s)), times(res.pairedRatio(s)))
	}
}

func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// printEnvironment writes the machine, the versions and the server's
// settings that matter for these figures.
func printEnvironment(ctx context.Context, admin *pgxpool.Pool) {
	fmt.Println("\n== environment")
	cpu, mem := "", ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(l[strings.Index(l, ":")+1:])
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		mem = strings.Join(strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1:], " ")
	}
	fmt.Printf("machine: %s, %d CPUs, GOMAXPROCS=%d, MemTotal %s, %s/%s\n", cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0), mem, runtime.GOOS, runtime.GOARCH)
	fmt.Printf("go: %s; oncommit %s\n", runtime.Version(), buildRevision())
	if bi, ok := debug.ReadBuildInfo(); ok {
		var mods []string
		for _, d := range bi.Deps {
			for _, p := range []string{"github.com/riverqueue/river", "github.com/riverqueue/river/riverdriver/riverpgxv5", "github.com/vgarvardt/gue/v5", "github.com/jackc/pgx/v5"} {
				if d.Path == p {
					mods = append(mods, d.Path+" "+d.Version)
				}
			}
		}
		fmt.Printf("modules: %s\n", strings.Join(mods, ", "))
	}
	var version string
	check(admin.QueryRow(ctx, `SELECT version()`).Scan(&version))
	fmt.Printf("server: %s\n", version)
	var settings []string
	for _, name := range []string{"fsync", "synchronous_commit", "shared_buffers", "wal_level", "max_wal_size", "work_mem", "autovacuum"} {
		var v string
		check(admin.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v))
		settings = append(settings, name+"="+v)
	}
	fmt.Printf("server settings: %s\n", strings.Join(settings, " "))
	fmt.Printf("run: rounds=%d n=%d latency-n=%d latency8-n=%d, started %s\n", *rounds, *n, *latencyN, *latency8N, time.Now().UTC().Format(time.RFC3339))
}

// buildRevision is the commit the binary was built from, as go build
// stamped it (so it is right wherever the binary runs), "+ modified" when
// the work tree had changes; else what git says in the working directory.
func buildRevision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, modified := "", false
		for _, st := range bi.Settings {
			switch st.Key {
			case "vcs.revision":
				rev = st.Value
			case "vcs.modified":
				modified = st.Value == "true"
			}
		}
		if rev != "" {
			if len(rev) > 7 {
				rev = rev[:7]
			}
			if modified {
				rev += " + modified"
			}
			return rev
		}
	}
	out, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	return strings.TrimSpace(string(out))
}
