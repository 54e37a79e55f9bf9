package kafka_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/forward/kafka"
	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/internal/fwdtest"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// No Kafka server exists here: every test runs against franz-go's
// in-process cluster (kfake), which speaks the Kafka protocol.

// deliveryTimeout is the kgo.RecordDeliveryTimeout of the
// "delivery-timeout" setting, as a deployment may set it: kgo's smallest,
// so that a backlog, a delay and an outage in a test are each longer than
// it.
const deliveryTimeout = time.Second

// settings are the clients the relay fault tests run with
// (fwdtest.Under): kgo's producer defaults, which is also what
// docs/forwarding.md recommends ("Recommended settings"), and a client
// with kgo.RecordDeliveryTimeout set, as the guide recommended before
// issue 32 and deployments may still do.
var settings = []fwdtest.Setting[[]kgo.Opt]{
	{Name: "defaults"},
	{Name: "delivery-timeout", C: []kgo.Opt{kgo.RecordDeliveryTimeout(deliveryTimeout)}},
}

// env is an outbox table on PostgreSQL and a kfake cluster.
type env struct {
	db      *sql.DB
	table   string
	ob      *outbox.Outbox
	cluster *kfake.Cluster
	client  *kgo.Client
}

// newEnv returns an env whose client has kgo's defaults and opts.
func newEnv(t *testing.T, opts []kgo.Opt, topics ...string) *env {
	t.Helper()
	return newEnvWith(t, outbox.Config{}, opts, topics...)
}

// newEnvWith is newEnv with cfg for the Outbox.
func newEnvWith(t *testing.T, cfg outbox.Config, opts []kgo.Opt, topics ...string) *env {
	t.Helper()
	e := &env{table: pgtest.Schema(t) + ".outbox"}
	if err := postgres.Migrate(context.Background(), pgtest.Admin(t), e.table); err != nil {
		t.Fatal(err)
	}
	e.db = pgtest.Open(t, "pgx")
	cfg.Table = e.table
	ob, err := outbox.New(postgres.Dialect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.ob = ob
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	e.cluster = c
	e.client = e.newClient(t, opts...)
	return e
}

func (e *env) newClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.cluster.ListenAddrs()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// publish publishes msgs in one transaction and returns their ids.
func (e *env) publish(t *testing.T, msgs ...outbox.Message) []outbox.ID {
	t.Helper()
	tx, err := e.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	return dialecttest.PublishCommit(t, tx, e.ob, msgs...)
}

func (e *env) count(t *testing.T, where string) int {
	t.Helper()
	q := `SELECT count(*) FROM ` + e.table
	if where != "" {
		q += ` WHERE ` + where
	}
	var n int
	if err := e.db.QueryRow(q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// relay runs a relay with h as the catch-all until the test ends (or stop),
// logging warnings to the test's output unless cfg has a Logger.
func (e *env) relay(t *testing.T, cfg outbox.RelayConfig, h outbox.BatchHandler) (stop func()) {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	r, err := e.ob.Relay(sqltx.FromDB(e.db), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.HandleBatch(outbox.AllTopics, h); err != nil {
		t.Fatal(err)
	}
	return dialecttest.StartRelay(t, r)
}

func (e *env) forwarder(t *testing.T, cfg kafka.Config) *kafka.Forwarder {
	t.Helper()
	f, err := kafka.New(e.client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// consume reads records of topics until it has n or within passes.
func (e *env) consume(t *testing.T, n int, within time.Duration, topics ...string) []*kgo.Record {
	t.Helper()
	cl := e.newClient(t, kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		fs.EachError(func(topic string, p int32, err error) { t.Errorf("fetch %s/%d: %v", topic, p, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// headerKeys returns r's header names in order, space-separated.
func headerKeys(r *kgo.Record) string {
	ks := make([]string, len(r.Headers))
	for i, h := range r.Headers {
		ks[i] = h.Key
	}
	return strings.Join(ks, " ")
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	dialecttest.Eventually(t, within, what, cond)
}

// TestForwardEveryMessage: every message arrives once, on its mapped
// topic, with its key, payload and headers and the oncommit-id header;
// with ordered delivery (Config.OrderByKey), a key's messages are in
// publish order in their partition; the table is empty after.
func TestForwardEveryMessage(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, outbox.Config{OrderByKey: true}, nil, "orders", "payments.out")
	const n = 300
	want := map[outbox.ID]outbox.Message{}
	var order []outbox.ID
	for i := 0; i < n; i += 30 {
		var msgs []outbox.Message
		for j := i; j < i+30; j++ {
			msgs = append(msgs, outbox.Message{Topic: []string{"orders", "payments"}[j%2], Key: fmt.Sprintf("k%d", j%7),
				Payload: fmt.Appendf(nil, `{"n": %d}`, j), Headers: map[string]string{"trace": fmt.Sprint("t", j), "z": "last"}})
		}
		for k, id := range e.publish(t, msgs...) {
			want[id] = msgs[k]
			order = append(order, id)
		}
	}
	f := e.forwarder(t, kafka.Config{Topic: func(topic string) string {
		if topic == "payments" {
			return "payments.out"
		}
		return topic
	}})
	e.relay(t, outbox.RelayConfig{BatchSize: 50}, f.Handler())
	waitFor(t, 30*time.Second, "the table drained", func() bool { return e.count(t, "") == 0 })
	recs := e.consume(t, n, 10*time.Second, "orders", "payments.out")
	if len(recs) != n {
		t.Fatalf("consumed %d records, want %d", len(recs), n)
	}
	seen := map[outbox.ID]bool{}
	pos := map[outbox.ID]int{}
	for i, id := range order {
		pos[id] = i
	}
	last := map[string]int{} // key -> position of its last record seen, per partition
	for _, r := range recs {
		s, ok := header(r, kafka.IDHeader)
		id, err := outbox.ParseID(s)
		if !ok || err != nil {
			t.Fatalf("record without a valid %s header: %v %v", kafka.IDHeader, s, err)
		}
		m, ok := want[id]
		if !ok || seen[id] {
			t.Fatalf("record %s unknown or seen twice", id)
		}
		seen[id] = true
		topic := map[string]string{"orders": "orders", "payments": "payments.out"}[m.Topic]
		if r.Topic != topic || string(r.Key) != m.Key || strings.ReplaceAll(string(r.Value), " ", "") != strings.ReplaceAll(string(m.Payload), " ", "") {
			t.Errorf("record %s: topic %s key %s value %s, want %s %s %s", id, r.Topic, r.Key, r.Value, topic, m.Key, m.Payload)
		}
		if got, want := headerKeys(r), "oncommit-id id content-type oncommit-type oncommit-source oncommit-created-at trace z"; got != want {
			t.Errorf("record %s headers %s, want %s", id, got, want)
		}
		for k, want := range map[string]string{"id": id.String(), "content-type": "application/json", kafka.TypeHeader: m.Topic,
			kafka.SourceHeader: "oncommit", "trace": m.Headers["trace"], "z": "last"} {
			if h, _ := header(r, k); h != want {
				t.Errorf("record %s: header %s %q, want %q", id, k, h, want)
			}
		}
		// One key, one topic, one partition: the publish order.
		k := r.Topic + "/" + m.Key
		if p, ok := last[k]; ok && pos[id] < p {
			t.Errorf("key %s: record %s after a later message", k, id)
		}
		last[k] = pos[id]
	}
}

// TestRedeliveryRepeatsID: a relay whose outcomes are never written after
// Kafka acknowledged the records (its settle blocked past its lease, as a
// relay killed there would) has the messages delivered again by another
// relay: each record is produced twice with the same oncommit-id, which
// is what consumers deduplicate by.
func TestRedeliveryRepeatsID(t *testing.T) {
	fwdtest.Under(t, settings, func(t *testing.T, set fwdtest.Setting[[]kgo.Opt]) {
		e := newEnv(t, set.C, "orders")
		ids := e.publish(t, outbox.Message{Topic: "orders", Key: "a"}, outbox.Message{Topic: "orders", Key: "b"}, outbox.Message{Topic: "orders", Key: "a"})
		f := e.forwarder(t, kafka.Config{})
		acked := make(chan []error, 1)
		var once sync.Once
		// Concurrency 3: A's blocked batch holds its slots, so A does not
		// claim the messages again itself when its lease lapses.
		stopA := e.relay(t, outbox.RelayConfig{Lease: time.Second, DisableLeaseRenewal: true, ShutdownGrace: 50 * time.Millisecond, Concurrency: 3},
			func(ctx context.Context, ds []outbox.Delivery) []error {
				errs := f.Handler()(ctx, ds)
				once.Do(func() { acked <- errs })
				<-ctx.Done() // "killed": the outcomes wait until the relay stops
				return errs
			})
		if errs := <-acked; len(errs) != 3 || errors.Join(errs...) != nil {
			t.Fatalf("first produce: %v", errs)
		}
		e.relay(t, outbox.RelayConfig{}, f.Handler()) // after A's lease lapses
		waitFor(t, 20*time.Second, "the messages delivered again", func() bool { return e.count(t, "") == 0 })
		stopA() // its outcomes are fenced off now
		recs := e.consume(t, 6, 10*time.Second, "orders")
		times := map[string]int{}
		for _, r := range recs {
			s, _ := header(r, kafka.IDHeader)
			times[s]++
		}
		for _, id := range ids {
			if times[id.String()] != 2 {
				t.Errorf("message %s produced %d times, want 2 with the same %s", id, times[id.String()], kafka.IDHeader)
			}
		}
		if len(recs) != 6 {
			t.Errorf("%d records, want 6", len(recs))
		}
	})
}

// TestProduceErrorRetries: while Kafka refuses the produce requests, the
// messages are retried with backoff and never settled done; once it
// accepts them they are delivered.
func TestProduceErrorRetries(t *testing.T) {
	fwdtest.Under(t, settings, func(t *testing.T, set fwdtest.Setting[[]kgo.Opt]) {
		e := newEnv(t, set.C, "orders")
		var refusing atomic.Bool
		refusing.Store(true)
		var refused atomic.Int32
		e.cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
			e.cluster.KeepControl()
			if !refusing.Load() {
				return nil, nil, false
			}
			refused.Add(1)
			req := kreq.(*kmsg.ProduceRequest)
			resp := req.ResponseKind().(*kmsg.ProduceResponse)
			for _, rt := range req.Topics {
				st := kmsg.NewProduceResponseTopic()
				st.Topic, st.TopicID = rt.Topic, rt.TopicID
				for _, rp := range rt.Partitions {
					sp := kmsg.NewProduceResponseTopicPartition()
					sp.Partition, sp.ErrorCode = rp.Partition, kerr.InvalidRecord.Code
					st.Partitions = append(st.Partitions, sp)
				}
				resp.Topics = append(resp.Topics, st)
			}
			return resp, nil, true
		})
		ids := e.publish(t, outbox.Message{Topic: "orders", Key: "a"}, outbox.Message{Topic: "orders", Key: "b"}, outbox.Message{Topic: "orders"})
		f := e.forwarder(t, kafka.Config{})
		e.relay(t, outbox.RelayConfig{MaxAttempts: outbox.UnlimitedAttempts, RetryBase: 20 * time.Millisecond, RetryCap: 50 * time.Millisecond}, f.Handler())
		waitFor(t, 20*time.Second, "the messages failing twice", func() bool {
			return e.count(t, `attempts >= 2 AND last_error LIKE '%INVALID_RECORD%'`) == 3
		})
		if n := e.count(t, ""); n != 3 || refused.Load() == 0 {
			t.Fatalf("%d messages left while Kafka refused them (%d requests refused), want all 3", n, refused.Load())
		}
		refusing.Store(false)
		waitFor(t, 20*time.Second, "the messages delivered", func() bool { return e.count(t, "") == 0 })
		got := map[string]bool{}
		for _, r := range e.consume(t, 3, 10*time.Second, "orders") {
			s, _ := header(r, kafka.IDHeader)
			got[s] = true
		}
		for _, id := range ids {
			if !got[id.String()] {
				t.Errorf("message %s not in Kafka", id)
			}
		}
	})
}

// TestNewRefusesNonDurableClient: a client with acks other than all, or
// without idempotent writes, is refused.
func TestNewRefusesNonDurableClient(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for name, opts := range map[string][]kgo.Opt{
		"leader ack":     {kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite()},
		"no idempotency": {kgo.DisableIdempotentWrite()},
	} {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kafka.New(cl, kafka.Config{}); !errors.Is(err, kafka.ErrNotDurable) {
			t.Errorf("%s: %v, want ErrNotDurable", name, err)
		}
		cl.Close()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kafka.New(cl, kafka.Config{}); err != nil {
		t.Errorf("a client with kgo's defaults: %v", err)
	}
}

// TestContextEndsBatch: when the batch's context ends before Kafka
// answers (a lost lease, the end of the shutdown grace), the handler
// returns at once, every unacknowledged message failed (not done).
func TestContextEndsBatch(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, nil, true // no answer: the records stay in flight
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	f, err := kafka.New(cl, kafka.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := f.Handler()(ctx, []outbox.Delivery{{ID: outbox.NewID(), Topic: "orders"}, {ID: outbox.NewID(), Topic: "orders", Key: "k"}})
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the handler returned %v after its context ended", d-300*time.Millisecond)
	}
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("outcome %d: %v, want an error wrapping the context's", i, err)
		}
	}
}

// TestKeyFailureStopsItsKey: when a record of a key fails, the later
// records of that key in the batch are not produced (they fail too), so a
// key's later message never reaches Kafka before an earlier one; other
// keys, and messages without a key, are produced.
func TestKeyFailureStopsItsKey(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// Topic "bad" maps to no Kafka topic: its record fails before it is sent.
	f, err := kafka.New(cl, kafka.Config{Topic: func(topic string) string {
		if topic == "bad" {
			return ""
		}
		return topic
	}})
	if err != nil {
		t.Fatal(err)
	}
	ds := []outbox.Delivery{
		{ID: outbox.NewID(), Topic: "orders", Key: "a"}, // 0: produced
		{ID: outbox.NewID(), Topic: "bad", Key: "a"},    // 1: fails
		{ID: outbox.NewID(), Topic: "orders", Key: "b"}, // 2: produced
		{ID: outbox.NewID(), Topic: "orders", Key: "a"}, // 3: after a failed record of a: not produced
		{ID: outbox.NewID(), Topic: "orders"},           // 4: no key: produced
		{ID: outbox.NewID(), Topic: "orders", Key: "b"}, // 5: produced, after 2
	}
	errs := f.Handler()(context.Background(), ds)
	for i, want := range []bool{true, false, true, false, true, true} {
		if ok := errs[i] == nil; ok != want {
			t.Errorf("outcome %d: %v, want success %v", i, errs[i], want)
		}
	}
	consumer, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	got := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for len(got) < 4 && ctx.Err() == nil {
		for _, r := range consumer.PollFetches(ctx).Records() {
			s, _ := header(r, kafka.IDHeader)
			got[s] = true
		}
	}
	time.Sleep(300 * time.Millisecond)
	for _, r := range consumer.PollFetches(ctx).Records() {
		s, _ := header(r, kafka.IDHeader)
		got[s] = true
	}
	for i, want := range []bool{true, false, true, false, true, true} {
		if got[ds[i].ID.String()] != want {
			t.Errorf("record %d in Kafka: %v, want %v", i, got[ds[i].ID.String()], want)
		}
	}
}
