package fwdtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// E2E is one broker's part in [RunE2E]: a producing service forwards
// outbox messages to the broker, a consuming service applies each to a
// ledger through the inbox. Every function gets run (a name unique to
// the run, for streams and queues) and addr (the broker's host:port as the
// children reach it: through a Proxy the parent cuts).
type E2E struct {
	// Broker is the broker's host:port.
	Broker string
	// Setup declares what the run needs on the broker (in the parent).
	Setup func(t testing.TB, run, addr string)
	// Forward returns the relay's handler forwarding to the broker (in a
	// relay child).
	Forward func(ctx context.Context, t testing.TB, run, addr string) BatchHandler
	// Consume runs the broker's consumer until ctx ends (in a consumer
	// child), applying each message with apply in the transaction the
	// consumer began with b, and calling seen for each message the inbox
	// found a repeat.
	Consume func(ctx context.Context, t testing.TB, run, addr string, ib *outbox.Inbox, b pgxtx.Beginner, apply Apply, seen func(id string)) error
}

// Apply applies one message's payload ({"n":i}) to the ledger in tx.
type Apply func(ctx context.Context, tx pgx.Tx, payload []byte) error

// E2EOptions sizes a run.
type E2EOptions struct {
	Messages  int           // published through the outbox
	Relays    int           // relay children (forwarding)
	Consumers int           // consumer children
	Chaos     time.Duration // how long children are killed and the broker cut
	Stall     time.Duration // how long a stall of the broker's connections lasts
	Timeout   time.Duration // for the ledger to hold every message after the chaos
}

// DefaultE2E is the size the acceptance names: 5,000 messages.
var DefaultE2E = E2EOptions{Messages: 5000, Relays: 2, Consumers: 2, Chaos: 12 * time.Second, Stall: 2500 * time.Millisecond, Timeout: 3 * time.Minute}

const (
	e2eRole = "OC_E2E_ROLE"
	e2eRun  = "OC_E2E_RUN"
	e2eAddr = "OC_E2E_ADDR"
)

// E2EReport is what a run saw.
type E2EReport struct {
	Published, Applied, AppliedTwice, Lost  int
	RelayKills, ConsumerKills, Cuts, Stalls int
	InboxRepeats                            int
	StuckRestarts                           int // consumers restarted by the liveness check
	Seconds                                 float64
}

// IsE2EChild reports whether this process is a child of RunE2E.
func IsE2EChild() bool { return os.Getenv(e2eRole) != "" }

// E2EChild plays a child's part (relay or consumer) until its parent
// closes its standard input or kills it. Call it from the test that
// RunE2E names as helper, when IsE2EChild.
func E2EChild(t *testing.T, e E2E) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	schema, run, addr := os.Getenv(childSchema), os.Getenv(e2eRun), os.Getenv(e2eAddr)
	switch os.Getenv(e2eRole) {
	case "relay":
		env := open(t, schema, false)
		h := e.Forward(ctx, t, run, addr)
		r := env.Relay(t, outbox.RelayConfig{Lease: time.Second, MaxAttempts: 1000, RetryBase: 20 * time.Millisecond, RetryCap: 200 * time.Millisecond}, "orders", h)
		if err := r.Run(ctx); err != nil {
			t.Fatal(err)
		}
	case "consumer":
		ib, err := outbox.NewInbox(postgres.Dialect(), outbox.InboxConfig{Table: schema + ".inbox"})
		if err != nil {
			t.Fatal(err)
		}
		ledger := schema + ".ledger"
		apply := func(ctx context.Context, tx pgx.Tx, payload []byte) error {
			var p struct{ N int }
			if err := json.Unmarshal(payload, &p); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` (n) VALUES ($1)`, p.N)
			return err
		}
		var mu sync.Mutex
		seen := func(id string) {
			mu.Lock()
			fmt.Printf("REPEAT %s\n", id)
			mu.Unlock()
		}
		b := pgxtx.NewBeginner(pgtest.Pool(t), pgx.TxOptions{})
		if err := e.Consume(ctx, t, run, addr, ib, b, apply, seen); err != nil && ctx.Err() == nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("unknown role %q", os.Getenv(e2eRole))
	}
}

// child is one running child process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.Closer
	done   chan struct{}
	role   string
	killed atomic.Bool // by the parent (chaos or the end of the run)
	stderr *tailWriter // its last lines, shown when it exits on its own
	err    error       // cmd.Wait's, set before done is closed
}

// RunE2E publishes o.Messages through the outbox while relay children
// forward them to the broker and consumer children apply them to a ledger
// through the inbox; for o.Chaos it SIGKILLs children at random (and
// starts new ones) and cuts the broker's connections. Then it waits until
// the ledger holds every message, and fails t unless each was applied
// exactly once. helper is the test (of this binary) that calls E2EChild.
func RunE2E(t *testing.T, helper string, e E2E, o E2EOptions) E2EReport {
	env := New(t, false)
	ctx := context.Background()
	admin := pgtest.Admin(t)
	if err := postgres.MigrateInbox(ctx, admin, env.Schema+".inbox"); err != nil {
		t.Fatal(err)
	}
	ledger := env.Schema + ".ledger"
	if _, err := admin.Exec(`CREATE TABLE ` + ledger + ` (n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	run := strings.ReplaceAll(env.Schema, "_", "-")
	proxy := NewProxy(t, e.Broker)
	e.Setup(t, run, e.Broker)

	var rep E2EReport
	var repeats atomic.Int64
	start := func(role string) *child {
		cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$", "-test.v")
		cmd.Env = append(os.Environ(), childSchema+"="+env.Schema, e2eRole+"="+role, e2eRun+"="+run, e2eAddr+"="+proxy.Addr())
		tail := &tailWriter{}
		cmd.Stderr = tail
		if testing.Verbose() {
			cmd.Stderr = io.MultiWriter(tail, t.Output())
		}
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := &child{cmd: cmd, stdin: in, done: make(chan struct{}), role: role, stderr: tail}
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "REPEAT ") {
					repeats.Add(1)
				} else {
					_, _ = tail.Write([]byte(sc.Text() + "\n"))
				}
			}
			c.err = cmd.Wait()
			close(c.done)
		}()
		return c
	}
	relays, consumers := make([]*child, o.Relays), make([]*child, o.Consumers)
	for i := range relays {
		relays[i] = start("relay")
	}
	for i := range consumers {
		consumers[i] = start("consumer")
	}
	// A child that exits on its own (an error, a panic, a data race) is
	// reported and started again, as a service's supervisor would, so
	// that the run still drains and the test fails with its last lines.
	var exits []string
	supervise := func() {
		for _, list := range [][]*child{relays, consumers} {
			for i, c := range list {
				select {
				case <-c.done:
					if !c.killed.Load() {
						exits = append(exits, fmt.Sprintf("%s child exited on its own (%v); its last lines:\n%s", c.role, c.err, c.stderr.String()))
						list[i] = start(c.role)
					}
				default:
				}
			}
		}
	}
	kill := func(c *child) {
		c.killed.Store(true)
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	defer func() {
		for _, c := range append(relays, consumers...) {
			c.killed.Store(true)
			_ = c.stdin.Close()
			select {
			case <-c.done:
			case <-time.After(10 * time.Second):
				_ = c.cmd.Process.Kill()
				<-c.done
			}
		}
	}()

	t0 := time.Now()
	msgs := Messages("orders", o.Messages, 0)
	published := make(chan struct{})
	go func() {
		defer close(published)
		const batch = 100
		gap := o.Chaos / 2 / time.Duration(max(1, len(msgs)/batch))
		for i := 0; i < len(msgs); i += batch {
			env.Publish(t, msgs[i:min(i+batch, len(msgs))]...)
			time.Sleep(gap)
		}
	}()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	t.Logf("e2e: chaos seed time %s", t0.Format(time.RFC3339Nano))
	for time.Since(t0) < o.Chaos {
		time.Sleep(time.Duration(200+rng.IntN(600)) * time.Millisecond)
		supervise()
		switch rng.IntN(4) {
		case 0:
			i := rng.IntN(len(relays))
			kill(relays[i])
			relays[i] = start("relay")
			rep.RelayKills++
		case 1:
			i := rng.IntN(len(consumers))
			kill(consumers[i])
			consumers[i] = start("consumer")
			rep.ConsumerKills++
		case 2:
			proxy.Cut()
			time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
			proxy.Restore()
			rep.Cuts++
		default:
			// Longer than a consumer's acknowledgement deadline: the
			// broker delivers again what was applied and not yet acked.
			proxy.Stall()
			time.Sleep(o.Stall)
			proxy.Restore()
			rep.Stalls++
		}
	}
	<-published
	rep.Published = len(msgs)
	deadline := time.Now().Add(o.Timeout)
	last, lastAt := -1, time.Now()
	for {
		var distinct int
		if err := admin.QueryRow(`SELECT count(DISTINCT n) FROM ` + ledger).Scan(&distinct); err != nil {
			t.Fatal(err)
		}
		if distinct == len(msgs) && len(env.Rows(t)) == 0 {
			break
		}
		// A supervisor's liveness check: consumers that apply nothing for
		// 20 s while messages wait are restarted (and counted: the report
		// says how often, and their last lines are logged).
		if distinct != last {
			last, lastAt = distinct, time.Now()
		} else if time.Since(lastAt) > 20*time.Second && len(env.Rows(t)) == 0 {
			for i, c := range consumers {
				t.Logf("no progress for 20 s at %d of %d: restarting a consumer; its last lines:\n%s", distinct, len(msgs), c.stderr.String())
				kill(c)
				consumers[i] = start("consumer")
			}
			rep.StuckRestarts++
			lastAt = time.Now()
		}
		if time.Now().After(deadline) {
			t.Errorf("after %v: %d of %d messages in the ledger, outbox rows %v", o.Timeout, distinct, len(msgs), env.Rows(t))
			for _, c := range append(relays, consumers...) {
				t.Logf("a live %s child's last lines:\n%s", c.role, c.stderr.String())
			}
			break
		}
		supervise()
		time.Sleep(100 * time.Millisecond)
	}
	for _, e := range exits {
		t.Error(e)
	}
	// Late duplicates would show now.
	time.Sleep(time.Second)
	rep.Seconds = time.Since(t0).Seconds()
	if err := admin.QueryRow(`SELECT count(DISTINCT n), coalesce(sum(c) FILTER (WHERE c > 1), 0)
FROM (SELECT n, count(*) AS c FROM `+ledger+` GROUP BY n) AS x`).Scan(&rep.Applied, &rep.AppliedTwice); err != nil {
		t.Fatal(err)
	}
	var outside int
	if err := admin.QueryRow(`SELECT count(*) FROM `+ledger+` WHERE n < 0 OR n >= $1`, len(msgs)).Scan(&outside); err != nil {
		t.Fatal(err)
	}
	rep.Lost = len(msgs) - rep.Applied
	rep.InboxRepeats = int(repeats.Load())
	line := fmt.Sprintf("e2e %s: %d published, %d applied, %d lost, %d extra applications; %d relay kills, %d consumer kills, %d broker cuts, %d stalls; %d redeliveries found repeats by the inbox; %d liveness restarts; %.1fs",
		helper, rep.Published, rep.Applied, rep.Lost, rep.AppliedTwice, rep.RelayKills, rep.ConsumerKills, rep.Cuts, rep.Stalls, rep.InboxRepeats, rep.StuckRestarts, rep.Seconds)
	fmt.Println(line)
	t.Log(line)
	if rep.Lost != 0 || rep.AppliedTwice != 0 || outside != 0 {
		t.Fatalf("not exactly once: %d lost, %d rows of messages applied more than once, %d unknown", rep.Lost, rep.AppliedTwice, outside)
	}
	return rep
}

// tailWriter keeps the last lines written to it.
type tailWriter struct {
	mu    sync.Mutex
	lines []string
	part  string
}

const tailLines = 40

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.part + string(p)
	parts := strings.Split(s, "\n")
	w.part = parts[len(parts)-1]
	w.lines = append(w.lines, parts[:len(parts)-1]...)
	if len(w.lines) > tailLines {
		w.lines = w.lines[len(w.lines)-tailLines:]
	}
	return len(p), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(append(append([]string(nil), w.lines...), w.part), "\n")
}

// Startup retries f, as a service's start-up would, until it succeeds or
// a minute has passed (then t fails with its last error): a child started
// while the parent cuts or stalls the broker's connections cannot reach
// the broker at first, which is the chaos, not a failure.
func Startup[T any](t testing.TB, what string, f func() (T, error)) T {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := f()
		if err == nil {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
