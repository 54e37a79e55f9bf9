package chaostest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

// Publisher states, as last read from its output.
const (
	pubIdle       = iota // between transactions
	pubOpen              // in a transaction, before COMMIT
	pubCommitting        // COMMIT sent, no answer read yet
)

// child is one child process.
type child struct {
	role   string
	idx    int
	serial int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *lines
	opened chan struct{} // a publisher opened a transaction
	killed atomic.Bool
	exited chan struct{}
	err    error // of Wait, once exited is closed
}

// lines splits a child's output into lines: protocol lines go to onLine,
// the others are kept (the last few) for error reports.
type lines struct {
	mu     sync.Mutex
	buf    []byte
	tail   []string
	onLine func(string) bool // true: a protocol line, not kept
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		s := string(l.buf[:i])
		l.buf = l.buf[i+1:]
		if l.onLine != nil && l.onLine(s) {
			continue
		}
		l.tail = append(l.tail, s)
		if len(l.tail) > 30 {
			l.tail = l.tail[1:]
		}
	}
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.tail, "\n") + string(l.buf)
}

// parent is the state of the test process.
type parent struct {
	t       *testing.T
	b       Backend
	o       Options
	target  string
	pattern string
	rng     *rand.Rand
	serial  int
	exits   chan *child

	killedRelays map[int]bool  // serials of relay processes killed (the ordered checker's)
	killedAt     map[int]int64 // the plain checker's: when each was killed (Unix ns, just before the SIGKILL)
	relayErrors  atomic.Int64  // ERROR lines logged by relays
	errSample    atomic.Value  // one of them
	warnMu       sync.Mutex
	warns        map[string]int // WARN lines logged by relays, by message
	// redeliveries: what the relays' WARN lines say they caused (lost
	// leases, fenced-off settles, dropped outcomes, handlers cancelled at
	// shutdown), as counted by the lines (a line without count is one).
	redeliveries int
	warnSample   []string // the first few of them, with their process
	pubErrors    atomic.Int64
	pubErrSample atomic.Value
	txs          atomic.Int64 // transactions seen committed
	published    atomic.Int64 // their messages
	pubState     []atomic.Int32
	failures     []string
}

func (p *parent) start(role string, idx int) *child {
	p.serial++
	c := &child{role: role, idx: idx, serial: p.serial, exited: make(chan struct{}), opened: make(chan struct{}, 1)}
	c.out = &lines{onLine: func(s string) bool {
		if strings.Contains(s, "level=ERROR") {
			p.relayErrors.Add(1)
			p.errSample.CompareAndSwap(nil, s)
		}
		if strings.Contains(s, "level=WARN") {
			p.warned(role, c.serial, s)
		}
		if role != "publisher" {
			return false
		}
		switch {
		case s == "O":
			p.pubState[idx].Store(pubOpen)
			select {
			case c.opened <- struct{}{}:
			default:
			}
		case s == "B":
			p.pubState[idx].Store(pubCommitting)
		case strings.HasPrefix(s, "C "):
			p.pubState[idx].Store(pubIdle)
			p.txs.Add(1)
			n, _ := strconv.Atoi(s[2:])
			p.published.Add(int64(n))
		case strings.HasPrefix(s, "E "):
			p.pubState[idx].Store(pubIdle)
			p.pubErrors.Add(1)
			p.pubErrSample.CompareAndSwap(nil, s)
		default:
			return false
		}
		return true
	}}
	cmd := exec.Command(os.Args[0], "-test.run="+p.pattern, "-test.count=1")
	rate := float64(p.o.Messages) / p.o.Duration.Seconds() / float64(p.o.Publishers) / 2 // two messages a transaction on average
	cmd.Env = append(os.Environ(), envRole+"="+role, envTarget+"="+p.target,
		fmt.Sprintf("%s=%d,%d,%d", envChild, idx, c.serial, p.o.Seed),
		fmt.Sprintf("%s=%g", envRate, rate), envWork+"="+p.o.HandlerWork.String(), envLease+"="+p.b.Lease.String())
	cmd.Stdout, cmd.Stderr = c.out, c.out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		p.t.Fatal(err)
	}
	c.cmd, c.stdin = cmd, stdin
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
		select {
		case p.exits <- c:
		default:
		}
	}()
	return c
}

// warned counts a WARN line of a child's log (line), by its msg field, and
// keeps the first few, for the report.
func (p *parent) warned(role string, serial int, line string) {
	msg := line
	if i := strings.Index(line, "msg="); i >= 0 {
		msg = line[i+len("msg="):]
		if j := strings.Index(msg, `" `); j >= 0 && strings.HasPrefix(msg, `"`) {
			msg = msg[1:j]
		} else if j := strings.IndexByte(msg, ' '); j >= 0 {
			msg = msg[:j]
		}
	}
	p.warnMu.Lock()
	defer p.warnMu.Unlock()
	if p.warns == nil {
		p.warns = map[string]int{}
	}
	p.warns[msg]++
	if redelivers(msg) {
		n := 1
		if i := strings.Index(line, " count="); i >= 0 {
			f := strings.Fields(line[i+len(" count="):])
			if len(f) > 0 {
				if k, err := strconv.Atoi(f[0]); err == nil {
					n = k
				}
			}
		}
		p.redeliveries += n
	}
	if len(p.warnSample) < 10 {
		p.warnSample = append(p.warnSample, fmt.Sprintf("%s %d: %s", role, serial, line))
	}
}

// redelivers reports whether a relay's WARN message (msg) tells of
// messages that will be delivered again though no process died.
func redelivers(msg string) bool {
	for _, m := range []string{"lease lost", "settles fenced off", "outcomes dropped", "shutdown grace period over"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// kill SIGKILLs c and waits for it.
func (p *parent) kill(c *child) {
	c.killed.Store(true)
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

// stop closes c's standard input, which stops it cleanly, and waits for it
// (SIGKILL after wait). It returns how long the children took to stop.
func (p *parent) stop(cs []*child, wait time.Duration) time.Duration {
	t0 := time.Now()
	for _, c := range cs {
		c.stdin.Close()
	}
	deadline := time.After(wait)
	for _, c := range cs {
		select {
		case <-c.exited:
		case <-deadline:
			p.failures = append(p.failures, fmt.Sprintf("%s %d did not stop within %s:\n%s", c.role, c.idx, wait, c.out))
			p.kill(c)
		}
		if !c.killed.Load() && c.err != nil {
			p.failures = append(p.failures, fmt.Sprintf("%s %d stopped with %v:\n%s", c.role, c.idx, c.err, c.out))
		}
	}
	return time.Since(t0)
}

func (p *parent) uniform(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(p.rng.Int64N(int64(hi-lo)+1))
}

func run(t *testing.T, b Backend, o Options) *Report {
	ctx := context.Background()
	target := b.Setup(t)
	tj, _ := json.Marshal(target)
	c, err := b.Open(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := createTables(ctx, c); err != nil {
		t.Fatal(err)
	}
	p := &parent{t: t, b: b, o: o, target: string(tj), pattern: runPattern(t),
		rng: rand.New(rand.NewPCG(o.Seed, 0)), exits: make(chan *child, 4096),
		killedAt: map[int]int64{}, pubState: make([]atomic.Int32, o.Publishers)}
	rep := &Report{Name: o.Name, Dialect: b.Dialect.Name(), Seed: o.Seed, Relays: o.Relays, Publishers: o.Publishers,
		DurationS: o.Duration.Seconds(), LeaseS: b.Lease.Seconds(), Mode: o.Mode}

	relays := make([]*child, o.Relays)
	for i := range relays {
		relays[i] = p.start("relay", i)
	}
	pubs := make([]*child, o.Publishers)
	for i := range pubs {
		pubs[i] = p.start("publisher", i)
	}
	t.Cleanup(func() { // a test that fails half-way leaves no process behind
		for _, c := range append(relays, pubs...) {
			select {
			case <-c.exited:
			default:
				p.kill(c)
			}
		}
	})
	// The run ends after Duration once Messages were published, or after
	// three times Duration (a starved machine publishes slower).
	end := time.NewTimer(o.Duration)
	endBy := time.Now().Add(3 * o.Duration)
	relayKill := time.NewTimer(p.uniform(o.KillMin, o.KillMax))
	pubKill := time.NewTimer(p.uniform(o.PubKillMin, o.PubKillMax))
	started := time.Now()
loop:
	for {
		select {
		case <-end.C:
			if p.published.Load() >= int64(o.Messages) || time.Now().After(endBy) {
				break loop
			}
			end.Reset(100 * time.Millisecond)
		case <-relayKill.C:
			i := p.rng.IntN(len(relays))
			p.killedAt[relays[i].serial] = time.Now().UnixNano()
			p.kill(relays[i])
			rep.RelayKills++
			relays[i] = p.start("relay", i)
			relayKill.Reset(p.uniform(o.KillMin, o.KillMax))
		case <-pubKill.C:
			i := p.rng.IntN(len(pubs))
			if p.rng.IntN(3) > 0 {
				// Aim at a transaction: wait for one to open, then kill
				// within a few milliseconds, before, during or after its
				// COMMIT.
				select {
				case <-pubs[i].opened:
				default:
				}
				select {
				case <-pubs[i].opened:
				case <-time.After(250 * time.Millisecond): // not long: relay kills wait
				}
				time.Sleep(p.uniform(0, 6*time.Millisecond))
			}
			state := p.pubState[i].Load()
			p.kill(pubs[i])
			rep.PublisherKills++
			switch state {
			case pubIdle:
				rep.PubKilledIdle++
			case pubOpen:
				rep.PubKilledInTx++
			case pubCommitting:
				rep.PubKilledCommitting++
			}
			p.pubState[i].Store(pubIdle)
			pubs[i] = p.start("publisher", i)
			pubKill.Reset(p.uniform(o.PubKillMin, o.PubKillMax))
		case ch := <-p.exits:
			if ch.killed.Load() {
				continue
			}
			// A child died on its own: a failure, but the run goes on.
			p.failures = append(p.failures, fmt.Sprintf("%s %d exited by itself: %v:\n%s", ch.role, ch.idx, ch.err, ch.out))
			if ch.role == "relay" && relays[ch.idx] == ch {
				relays[ch.idx] = p.start("relay", ch.idx)
			} else if ch.role == "publisher" && pubs[ch.idx] == ch {
				pubs[ch.idx] = p.start("publisher", ch.idx)
			}
		}
	}
	relayKill.Stop()
	pubKill.Stop()
	rep.RunS = time.Since(started).Seconds()
	// A clean stop takes a relay its shutdown grace (10 s) and a settle;
	// a host starved so that the run overran its schedule (CI's -race
	// children at a load average of 20: 180 s for 60 s) stops slower in
	// proportion, so the bounds grow with the run's slowdown.
	slow := max(1, rep.RunS/o.Duration.Seconds())
	p.stop(pubs, time.Duration(slow*float64(15*time.Second)))
	rep.StopS = p.stop(relays, time.Duration(slow*float64(20*time.Second))).Seconds()
	for _, f := range p.failures {
		t.Error(f)
	}

	// Heal: one relay in this process drains the table (the rows the killed
	// relays held come back when their leases lapse).
	healStart := time.Now()
	if err := heal(t, c, b, o); err != nil {
		t.Error(err)
	}
	rep.HealS = time.Since(healStart).Seconds()
	rep.Transactions = int(p.txs.Load())
	rep.RelayErrors = int(p.relayErrors.Load())
	rep.PublishErrors = int(p.pubErrors.Load())
	p.warnMu.Lock()
	rep.RelayWarnings, rep.WarnSample, rep.Reported = p.warns, p.warnSample, p.redeliveries
	p.warnMu.Unlock()
	if s, ok := p.errSample.Load().(string); ok {
		t.Logf("%d ERROR lines from relays, e.g. %s", rep.RelayErrors, s)
	}
	if s, ok := p.pubErrSample.Load().(string); ok {
		t.Logf("%d failed publisher transactions, e.g. %s", rep.PublishErrors, s)
	}
	stopped := map[int]bool{}
	for _, r := range relays {
		if !r.killed.Load() {
			stopped[r.serial] = true
		}
	}
	if err := classify(ctx, c, p.killedAt, stopped, rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// heal runs one relay here until no message is pending or processing.
func heal(t *testing.T, c *Conn, b Backend, o Options) error {
	ob, err := outbox.New(b.Dialect, outbox.Config{Table: c.Table})
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := ob.Relay(c.Relay, relayConfig(b.Lease, logger))
	if err != nil {
		return err
	}
	if err := r.Handle(Topic, handler(c, -1, o.HandlerWork, rand.New(rand.NewPCG(o.Seed, 1)))); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("healing relay: %v", err)
		}
	}()
	deadline := time.Now().Add(30*time.Second + 2*b.Lease)
	drained := func() (bool, error) { return true, nil }
	if b.StreamDrained != nil {
		if drained, err = b.StreamDrained(ctx, c); err != nil {
			return err
		}
	}
	for {
		var n int
		if err := c.SQL.QueryRow(`SELECT count(*) FROM ` + c.Table + ` WHERE state IN ('pending', 'processing')`).Scan(&n); err != nil {
			return err
		}
		ok, err := drained()
		if err != nil {
			return err
		}
		if n == 0 && ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("healing: %d messages still pending or processing (stream settled: %v)", n, ok)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
