package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/forward/kafka"
	"github.com/oncommit/oncommit/internal/fwdtest"
	"github.com/oncommit/oncommit/internal/receive"
	"github.com/oncommit/oncommit/outbox"
)

// proxied returns a client of the broker behind the proxy at addr: every
// connection it opens goes to addr, whatever broker address the metadata
// advertises (kfake's own port), so that the proxy's cuts and stalls hit
// all of its traffic.
func proxied(t testing.TB, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	d := &net.Dialer{Timeout: 2 * time.Second}
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.Dialer(dial)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// createTopics creates topics of partitions partitions on the broker at
// addr.
func createTopics(t testing.TB, addr string, partitions int32, topics ...string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 10000
	for _, name := range topics {
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, partitions, 1
		req.Topics = append(req.Topics, rt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil {
			t.Fatalf("create topic %s: %v", rt.Topic, err)
		}
	}
}

// e2e is Kafka's part in fwdtest.RunE2E: a kfake cluster in the parent
// (the children reach it through the proxy only), a topic "<run>" and a
// dead-letter topic "<run>-dead" of 4 partitions, and a consumer group
// "<run>" whose members commit offsets after each poll.
func e2e(t testing.TB) fwdtest.E2E {
	var broker string
	if !fwdtest.IsE2EChild() {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		broker = c.ListenAddrs()[0] // the port it listens on for its life
	}
	return fwdtest.E2E{
		Broker: broker,
		Setup: func(t testing.TB, run, addr string) {
			createTopics(t, addr, 4, run, run+"-dead")
		},
		Forward: func(ctx context.Context, t testing.TB, run, addr string) fwdtest.BatchHandler {
			// AckTimeout above the harness's stalls: one CI run with a
			// timeout shorter than the stalls stopped applying part way,
			// with the outbox empty and no error in the children's logs
			// (docs/forwarding.md, "The receiving side"). Until that is
			// understood, stalls here do not make the forwarder give up on
			// records in flight (TestLateRecordsArrive covers that path
			// against an unreachable broker).
			f, err := kafka.New(proxied(t, addr), kafka.Config{Topic: func(string) string { return run }, AckTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return f.Handler()
		},
		Consume: func(ctx context.Context, t testing.TB, run, addr string, ib *outbox.Inbox, b pgxtx.Beginner, apply fwdtest.Apply, seen func(string)) error {
			cl := proxied(t, addr, kgo.ConsumerGroup(run), kgo.ConsumeTopics(run), kgo.DisableAutoCommit(),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(500*time.Millisecond),
				kgo.SessionTimeout(3*time.Second), kgo.HeartbeatInterval(300*time.Millisecond), kgo.RebalanceTimeout(3*time.Second))
			return kafka.Consume(ctx, cl, ib, b, kafka.ConsumeConfig{
				Name: "ledger", DeadLetterTopic: run + "-dead", RetryDelay: 50 * time.Millisecond,
				OnOutcome: func(o kafka.Outcome) {
					if o.Repeat {
						seen(o.ID)
					}
				},
			}, func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error { return apply(ctx, tx, r.Value) })
		},
	}
}

// TestE2E: 5,000 messages from a producing service's outbox, forwarded to
// Kafka by relays and applied to a ledger by group members with the inbox,
// while relays and members are SIGKILLed and the broker's connections cut
// and stalled: each is applied exactly once.
func TestE2E(t *testing.T) {
	fwdtest.RunE2E(t, "TestHelperE2E", e2e(t), fwdtest.DefaultE2E)
}

func TestHelperE2E(t *testing.T) {
	if !fwdtest.IsE2EChild() {
		t.Skip("helper process of TestE2E")
	}
	fwdtest.E2EChild(t, e2e(t))
}

// consumeEnv is a kfake cluster with a one-partition topic "orders" and a
// topic "dead", and an inbox and a ledger in a fresh schema.
type consumeEnv struct {
	cluster *kfake.Cluster
	client  *kgo.Client // producing, and reading the dead letters
	ib      *outbox.Inbox
	b       pgxtx.Beginner
	ledger  string
}

func newConsumeEnv(t *testing.T) consumeEnv {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "dead"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	l := fwdtest.NewLedger(t)
	e := consumeEnv{cluster: c, ib: l.Inbox, b: l.Begin, ledger: l.Table}
	e.client = e.newClient(t)
	return e
}

func (e consumeEnv) newClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.cluster.ListenAddrs()...), kgo.FetchMaxWait(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// member returns a member of group consuming "orders", as Consume wants
// it (auto-commit disabled).
func (e consumeEnv) member(t *testing.T, group string) *kgo.Client {
	return e.newClient(t, kgo.ConsumerGroup(group), kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
}

// produce produces a record to "orders" with id as its oncommit-id (none
// when "").
func (e consumeEnv) produce(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		r := &kgo.Record{Topic: "orders", Key: []byte("k-" + id), Value: fmt.Appendf(nil, `{"id":%q}`, id)}
		if id != "" {
			r.Headers = []kgo.RecordHeader{{Key: kafka.IDHeader, Value: []byte(id)}, {Key: "trace", Value: []byte("t-" + id)}}
		}
		if err := e.client.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// committed returns group's committed offset of "orders" partition 0 (-1
// for none).
func (e consumeEnv) committed(t *testing.T, group string) int64 {
	t.Helper()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic, rt.Partitions = "orders", []int32{0}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), e.client)
	if err != nil {
		t.Fatal(err)
	}
	topics := resp.Topics
	if len(resp.Groups) > 0 {
		if err := kerr.ErrorForCode(resp.Groups[0].ErrorCode); err != nil {
			t.Fatal(err)
		}
		topics = nil
		for _, gt := range resp.Groups[0].Topics {
			x := kmsg.NewOffsetFetchResponseTopic()
			x.Topic = gt.Topic
			for _, p := range gt.Partitions {
				xp := kmsg.NewOffsetFetchResponseTopicPartition()
				xp.Partition, xp.Offset, xp.ErrorCode = p.Partition, p.Offset, p.ErrorCode
				x.Partitions = append(x.Partitions, xp)
			}
			topics = append(topics, x)
		}
	} else if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		t.Fatal(err)
	}
	for _, rt := range topics {
		for _, p := range rt.Partitions {
			if rt.Topic != "orders" || p.Partition != 0 {
				continue
			}
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				t.Fatal(err)
			}
			return p.Offset
		}
	}
	return -1
}

func (e consumeEnv) ledgerRows(t *testing.T) []string {
	t.Helper()
	return fwdtest.Ledger{Table: e.ledger}.Rows(t)
}

// insert is an fn that adds the record's id to the ledger.
func (e consumeEnv) insert(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
	id, _ := header(r, kafka.IDHeader)
	_, err := tx.Exec(ctx, `INSERT INTO `+e.ledger+` VALUES ($1)`, id)
	return err
}

// run runs Consume with client until stop is called, which returns
// Consume's error.
func (e consumeEnv) run(client *kgo.Client, cfg kafka.ConsumeConfig, fn func(context.Context, pgx.Tx, *kgo.Record) error) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kafka.Consume(ctx, client, e.ib, e.b, cfg, fn) }()
	return func() error { cancel(); return <-done }
}

// outcomes collects a consumer's outcomes.
type outcomes struct {
	mu  sync.Mutex
	all []kafka.Outcome
}

func (o *outcomes) add(x kafka.Outcome) { o.mu.Lock(); o.all = append(o.all, x); o.mu.Unlock() }
func (o *outcomes) get() []kafka.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]kafka.Outcome(nil), o.all...)
}

// of returns the outcomes of the record with id.
func (o *outcomes) of(id string) []kafka.Outcome {
	var out []kafka.Outcome
	for _, x := range o.get() {
		if x.ID == id {
			out = append(out, x)
		}
	}
	return out
}

// TestConsumeOnceAndPoison: a record failing every attempt is
// dead-lettered after MaxAttempts attempts (to a topic, with its reason);
// a record without an id is dead-lettered at once; one failing once is
// applied on its second attempt; every offset is committed.
func TestConsumeOnceAndPoison(t *testing.T) {
	e := newConsumeEnv(t)
	var got outcomes
	var failedOnce atomic.Bool
	stop := e.run(e.member(t, "g"), kafka.ConsumeConfig{Name: "ledger", MaxAttempts: 3, RetryDelay: 20 * time.Millisecond, DeadLetterTopic: "dead", OnOutcome: got.add},
		func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
			switch id, _ := header(r, kafka.IDHeader); {
			case id == "poison":
				return errors.New("cannot apply")
			case id == "flaky" && !failedOnce.Swap(true):
				return errors.New("once")
			}
			return e.insert(ctx, tx, r)
		})
	e.produce(t, "m-1", "poison", "", "flaky")
	waitFor(t, 20*time.Second, "4 offsets committed", func() bool { return e.committed(t, "g") == 4 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows := e.ledgerRows(t); fmt.Sprint(rows) != "[flaky m-1]" {
		t.Fatalf("ledger %v, want [flaky m-1]", rows)
	}
	if p := got.of("poison"); len(p) != 3 || p[2].Attempt != 3 || !p[2].Dead || p[1].Dead {
		t.Fatalf("poison: %+v, want dead on attempt 3", p)
	}
	if n := got.of(""); len(n) != 1 || !n[0].Dead || n[0].Attempt != 1 || !errors.Is(n[0].Err, receive.ErrNoID) {
		t.Fatalf("record without an id: %+v, want dead on attempt 1", n)
	}
	if f := got.of("flaky"); len(f) != 2 || f[0].Applied || !f[1].Applied || f[1].Attempt != 2 {
		t.Fatalf("flaky: %+v, want applied on attempt 2", f)
	}
	recs := e.consumeDead(t, 2)
	if len(recs) != 2 {
		t.Fatalf("%d dead letters, want 2", len(recs))
	}
	for i, want := range []struct{ id, key, reason string }{{"poison/dead", "k-poison", "cannot apply"}, {"", "k-", "no id"}} {
		r := recs[i]
		id, _ := header(r, kafka.IDHeader)
		reason, _ := header(r, kafka.DeadReasonHeader)
		if id != want.id || string(r.Key) != want.key || !strings.Contains(reason, want.reason) {
			t.Errorf("dead letter %d: id %q key %q reason %q, want %q %q %q", i, id, r.Key, reason, want.id, want.key, want.reason)
		}
	}
	if trace, _ := header(recs[0], "trace"); trace != "t-poison" || string(recs[0].Value) != `{"id":"poison"}` {
		t.Errorf("dead letter 0: value %s, trace %q: not the record's", recs[0].Value, trace)
	}
}

// consumeDead reads the dead-letter topic until it has n records, and a
// little longer for any more.
func (e consumeEnv) consumeDead(t *testing.T, n int) []*kgo.Record {
	t.Helper()
	cl := e.newClient(t, kgo.ConsumeTopics("dead"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []*kgo.Record
	for ctx.Err() == nil {
		out = append(out, cl.PollFetches(ctx).Records()...)
		if len(out) >= n {
			ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
			out = append(out, cl.PollFetches(ctx).Records()...)
			cancel()
			break
		}
	}
	return out
}

// TestConsumeRedelivered: a record applied by a member that closed
// without committing its offset (as a process killed between its
// transaction and its commit) is delivered to the next member and found a
// repeat: applied once, and then committed.
func TestConsumeRedelivered(t *testing.T) {
	e := newConsumeEnv(t)
	e.produce(t, "m-1")
	first := e.member(t, "g")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) == 0 && ctx.Err() == nil {
		recs = first.PollFetches(ctx).Records()
	}
	if len(recs) != 1 {
		t.Fatalf("first member got %d records", len(recs))
	}
	if applied, err := outbox.Receive(ctx, e.ib, e.b, "ledger", "m-1", func(ctx context.Context, tx pgx.Tx) error {
		return e.insert(ctx, tx, recs[0])
	}); err != nil || !applied {
		t.Fatalf("first apply: %v %v", applied, err)
	}
	first.Close() // leaves the group without a commit
	if off := e.committed(t, "g"); off != -1 {
		t.Fatalf("committed offset %d before the second member, want none", off)
	}
	var got outcomes
	stop := e.run(e.member(t, "g"), kafka.ConsumeConfig{Name: "ledger", DeadLetter: func(context.Context, *kgo.Record, error) error { return nil }, OnOutcome: got.add}, e.insert)
	waitFor(t, 20*time.Second, "the offset committed", func() bool { return e.committed(t, "g") == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if o := got.get(); len(o) != 1 || !o[0].Repeat || o[0].Applied || o[0].Attempt != 1 {
		t.Fatalf("redelivery: %+v, want one repeat", o)
	}
	if rows := e.ledgerRows(t); fmt.Sprint(rows) != "[m-1]" {
		t.Fatalf("ledger %v, want m-1 once", rows)
	}
}

// TestConsumeStopsMidRetry: when ctx ends while a record is retried, its
// offset is not committed (the records before it are), and a later
// Consume on the same client starts at it.
func TestConsumeStopsMidRetry(t *testing.T) {
	e := newConsumeEnv(t)
	e.produce(t, "m-1", "stuck", "m-3")
	var got outcomes
	client := e.member(t, "g")
	stop := e.run(client, kafka.ConsumeConfig{Name: "ledger", MaxAttempts: -1, RetryDelay: 10 * time.Millisecond, DeadLetterTopic: "dead", OnOutcome: got.add},
		func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
			if id, _ := header(r, kafka.IDHeader); id == "stuck" {
				return errors.New("not yet")
			}
			return e.insert(ctx, tx, r)
		})
	waitFor(t, 20*time.Second, "stuck attempted 10 times", func() bool { return len(got.of("stuck")) >= 10 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if off := e.committed(t, "g"); off != 1 {
		t.Fatalf("committed offset %d, want 1 (m-1 only)", off)
	}
	if rows := e.ledgerRows(t); fmt.Sprint(rows) != "[m-1]" {
		t.Fatalf("ledger %v, want [m-1]", rows)
	}
	for _, o := range got.get() {
		if o.Dead {
			t.Fatalf("dead-lettered with MaxAttempts -1: %+v", o)
		}
	}
	stop = e.run(client, kafka.ConsumeConfig{Name: "ledger", DeadLetterTopic: "dead"}, e.insert)
	waitFor(t, 20*time.Second, "3 offsets committed", func() bool { return e.committed(t, "g") == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows := e.ledgerRows(t); fmt.Sprint(rows) != "[m-1 m-3 stuck]" {
		t.Fatalf("ledger %v, want [m-1 m-3 stuck]", rows)
	}
}

// TestConsumeConfig: a consumer without a name or a dead letter, or a
// client that is not a group member with auto-commit disabled, is refused
// before anything is read.
func TestConsumeConfig(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	client := func(opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	good := client(kgo.ConsumerGroup("g"), kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit())
	ib, err := outbox.NewInbox(postgres.Dialect(), outbox.InboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	fn := func(context.Context, pgx.Tx, *kgo.Record) error { return nil }
	for name, tc := range map[string]struct {
		cl    *kgo.Client
		ib    *outbox.Inbox
		cfg   kafka.ConsumeConfig
		field string
	}{
		"no name":        {good, ib, kafka.ConsumeConfig{DeadLetterTopic: "d"}, "Name"},
		"no dead letter": {good, ib, kafka.ConsumeConfig{Name: "x"}, "DeadLetter"},
		"no client":      {nil, ib, kafka.ConsumeConfig{Name: "x", DeadLetterTopic: "d"}, "client"},
		"no inbox":       {good, nil, kafka.ConsumeConfig{Name: "x", DeadLetterTopic: "d"}, "Inbox"},
		"no group":       {client(kgo.ConsumeTopics("orders")), ib, kafka.ConsumeConfig{Name: "x", DeadLetterTopic: "d"}, "client"},
		"auto-commit":    {client(kgo.ConsumerGroup("g2"), kgo.ConsumeTopics("orders")), ib, kafka.ConsumeConfig{Name: "x", DeadLetterTopic: "d"}, "client"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := kafka.Consume(ctx, tc.cl, tc.ib, pgxtx.Beginner{}, tc.cfg, fn)
		cancel()
		var ce *kafka.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%s: %v, want a ConfigError on %s", name, err, tc.field)
		}
	}
}
