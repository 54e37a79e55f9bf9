package kafka_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncommit/oncommit/forward/kafka"
	"github.com/oncommit/oncommit/outbox"
)

// logged is a slog.Handler that keeps every record's level, message and
// header attribute.
type logged struct {
	mu   sync.Mutex
	recs []loggedRecord
}

type loggedRecord struct {
	level  slog.Level
	msg    string
	header string
}

func (l *logged) Enabled(context.Context, slog.Level) bool { return true }
func (l *logged) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logged) WithGroup(string) slog.Handler            { return l }
func (l *logged) Handle(_ context.Context, r slog.Record) error {
	x := loggedRecord{level: r.Level, msg: r.Message}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "header" {
			x.header = a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	l.recs = append(l.recs, x)
	l.mu.Unlock()
	return nil
}

// drops returns the header names of the drop lines at level, sorted.
func (l *logged) drops(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.recs {
		if r.level == level && strings.Contains(r.msg, "dropped a message header") {
			out = append(out, r.header)
		}
	}
	slices.Sort(out)
	return out
}

// spoofs are message headers whose names the envelope takes in one mode
// or the other: every one must be dropped, in either mode. The others of
// envelopeMessages must be kept.
var spoofs = map[string]string{
	"ID": "spoof", "Content-Type": "text/plain", "Oncommit-Id": "spoof", "oncommit-type": "spoof",
	"ce_id": "spoof", "CE_Type": "spoof", "oncommit-source": "spoof", "ce_source": "spoof",
	"ce_partitionkey": "spoof", "oncommit-created-at": "spoof", "ce_time": "spoof", "ce_specversion": "0.3",
}

// envelopeMessages returns the messages of the envelope tests (payloads
// as PostgreSQL's jsonb gives them back): with key
// and payload, with payload and no key, with key and no payload, and the
// first again (its dropped headers logged at debug level), each with the
// headers to keep and spoofs.
func envelopeMessages() []outbox.Message {
	with := func(keep map[string]string) map[string]string {
		h := map[string]string{}
		for k, v := range spoofs {
			h[k] = v
		}
		for k, v := range keep {
			h[k] = v
		}
		return h
	}
	return []outbox.Message{
		{Topic: "orders", Key: "A-1", Payload: []byte(`{"n": 0}`), Headers: with(map[string]string{"trace": "t0", "z": "last", "ce-id": "kept", "identity": "kept"})},
		{Topic: "payments", Payload: []byte(`{"n": 1}`), Headers: with(map[string]string{"trace": "t1"})},
		{Topic: "orders", Key: "B-2"},
		{Topic: "orders", Key: "A-1", Payload: []byte(`{"n": 3}`), Headers: with(map[string]string{"trace": "t3"})},
	}
}

// envelopeRun publishes envelopeMessages, forwards them through a relay
// with a forwarder of cfg (logging to the returned logged), and returns
// the messages, their ids, their created_at as the table has them, and
// the records consumed, by oncommit-id.
func envelopeRun(t *testing.T, cfg kafka.Config) ([]outbox.Message, []outbox.ID, map[outbox.ID]time.Time, map[string]*kgo.Record, *logged) {
	t.Helper()
	e := newEnv(t, nil, "orders", "payments", "payments.out")
	msgs := envelopeMessages()
	ids := e.publish(t, msgs...)
	created := map[outbox.ID]time.Time{}
	rows, err := e.db.Query(`SELECT id::text, created_at FROM ` + e.table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		var at time.Time
		if err := rows.Scan(&s, &at); err != nil {
			t.Fatal(err)
		}
		id, err := outbox.ParseID(s)
		if err != nil {
			t.Fatal(err)
		}
		created[id] = at
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if len(created) != len(msgs) {
		t.Fatalf("%d rows in the table, want %d", len(created), len(msgs))
	}
	log := &logged{}
	cfg.Logger = slog.New(log)
	e.relay(t, outbox.RelayConfig{}, e.forwarder(t, cfg).Handler())
	waitFor(t, 20*time.Second, "the table drained", func() bool { return e.count(t, "") == 0 })
	recs := e.consume(t, len(msgs), 10*time.Second, "orders", "payments", "payments.out")
	if len(recs) != len(msgs) {
		t.Fatalf("consumed %d records, want %d", len(recs), len(msgs))
	}
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		id, _ := header(r, kafka.IDHeader)
		byID[id] = r
	}
	return msgs, ids, created, byID, log
}

// checkRecord checks r against the message m with id: its key and value,
// and its headers, names and values in order, against want (the
// envelope) followed by m's headers other than spoofs, sorted.
func checkRecord(t *testing.T, r *kgo.Record, id outbox.ID, m outbox.Message, want [][2]string) {
	t.Helper()
	if r == nil {
		t.Errorf("message %s: no record with its %s", id, kafka.IDHeader)
		return
	}
	if string(r.Key) != m.Key || (m.Key == "") != (r.Key == nil) {
		t.Errorf("message %s: record key %q (nil %v), want %q", id, r.Key, r.Key == nil, m.Key)
	}
	if string(r.Value) != string(m.Payload) {
		t.Errorf("message %s: record value %s, want %s", id, r.Value, m.Payload)
	}
	var keep []string
	for k := range m.Headers {
		if _, ok := spoofs[k]; !ok {
			keep = append(keep, k)
		}
	}
	slices.Sort(keep)
	for _, k := range keep {
		want = append(want, [2]string{k, m.Headers[k]})
	}
	var got [][2]string
	for _, h := range r.Headers {
		got = append(got, [2]string{h.Key, string(h.Value)})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("message %s: headers\n%v\nwant\n%v", id, got, want)
	}
}

// checkTime checks that v, a ce_time or oncommit-created-at value, is RFC
// 3339 in UTC and is at, the message's created_at, to the microsecond.
func checkTime(t *testing.T, id outbox.ID, name, v string, at time.Time) {
	t.Helper()
	p, err := time.Parse(time.RFC3339, v)
	if err != nil || !strings.HasSuffix(v, "Z") {
		t.Errorf("message %s: %s %q is not RFC 3339 in UTC: %v", id, name, v, err)
		return
	}
	if at.IsZero() || !p.Equal(at) || !p.Truncate(time.Microsecond).Equal(at.Truncate(time.Microsecond)) {
		t.Errorf("message %s: %s %s, want its created_at %s", id, name, p, at)
	}
}

// checkDrops checks that every spoof name was logged as dropped once at
// warning level, and again at debug level for the repeated message.
func checkDrops(t *testing.T, log *logged) {
	t.Helper()
	var names []string
	for k := range spoofs {
		names = append(names, k)
	}
	slices.Sort(names)
	if got := log.drops(slog.LevelWarn); fmt.Sprint(got) != fmt.Sprint(names) {
		t.Errorf("drops logged at warning level: %v, want each of %v once", got, names)
	}
	// Messages 1 and 3 repeat message 0's spoofs (the relay may hand them
	// over in any order: one of the three warns, two log at debug level).
	if got := log.drops(slog.LevelDebug); len(got) != 2*len(names) {
		t.Errorf("drops logged at debug level: %v, want each of %v twice", got, names)
	}
}

// TestEnvelopePlain: in plain mode (the default) every record carries
// its key, oncommit-id and id (the outbox id), content-type (only with a
// payload), oncommit-type (the outbox topic), oncommit-source
// (Config.Source, or the default) and oncommit-created-at (the message's created_at),
// then the message's headers but those whose names the envelope takes
// (dropped and logged, once at warning level).
func TestEnvelopePlain(t *testing.T) {
	t.Parallel()
	for _, source := range []string{"", "urn:example:orders"} {
		t.Run("source="+source, func(t *testing.T) {
			t.Parallel()
			testEnvelopePlain(t, source)
		})
	}
}

func testEnvelopePlain(t *testing.T, source string) {
	msgs, ids, created, recs, log := envelopeRun(t, kafka.Config{Source: source})
	wantSource := cmp.Or(source, "oncommit")
	for i, m := range msgs {
		id := ids[i]
		r := recs[id.String()]
		at := created[id].UTC().Format(time.RFC3339Nano)
		want := [][2]string{{"oncommit-id", id.String()}, {"id", id.String()}}
		if m.Payload != nil {
			want = append(want, [2]string{"content-type", "application/json"})
		}
		want = append(want, [][2]string{{"oncommit-type", m.Topic}, {"oncommit-source", wantSource}, {"oncommit-created-at", at}}...)
		checkRecord(t, r, id, m, want)
		if r != nil {
			v, _ := header(r, kafka.CreatedAtHeader)
			checkTime(t, id, kafka.CreatedAtHeader, v, created[id])
			if r.Topic != m.Topic {
				t.Errorf("message %s: Kafka topic %s, want %s", id, r.Topic, m.Topic)
			}
		}
	}
	checkDrops(t, log)
}

// TestEnvelopeCloudEvents: in CloudEvents mode every record is a
// CloudEvent in binary content mode: its key, oncommit-id, ce_id (the
// outbox id), ce_source (Config.Source, or the default), ce_specversion
// 1.0, ce_type (the outbox topic, not the Kafka topic Config.Topic maps
// it to), ce_time (the message's created_at), ce_partitionkey (only with
// a key) and content-type (only with a payload), then the message's
// headers but those whose names the envelope takes.
func TestEnvelopeCloudEvents(t *testing.T) {
	t.Parallel()
	for _, source := range []string{"", "/orders-service"} {
		t.Run("source="+source, func(t *testing.T) {
			t.Parallel()
			testEnvelopeCloudEvents(t, source)
		})
	}
}

func testEnvelopeCloudEvents(t *testing.T, source string) {
	msgs, ids, created, recs, log := envelopeRun(t, kafka.Config{CloudEvents: true, Source: source,
		Topic: func(topic string) string {
			if topic == "payments" {
				return "payments.out"
			}
			return topic
		}})
	wantSource := cmp.Or(source, "oncommit")
	for i, m := range msgs {
		id := ids[i]
		r := recs[id.String()]
		at := created[id].UTC().Format(time.RFC3339Nano)
		want := [][2]string{{"oncommit-id", id.String()}, {"ce_id", id.String()}, {"ce_source", wantSource},
			{"ce_specversion", "1.0"}, {"ce_type", m.Topic}, {"ce_time", at}}
		if m.Key != "" {
			want = append(want, [2]string{"ce_partitionkey", m.Key})
		}
		if m.Payload != nil {
			want = append(want, [2]string{"content-type", "application/json"})
		}
		checkRecord(t, r, id, m, want)
		if r == nil {
			continue
		}
		v, _ := header(r, "ce_time")
		checkTime(t, id, "ce_time", v, created[id])
		if ct, ok := header(r, "content-type"); ok && strings.HasPrefix(ct, "application/cloudevents") {
			t.Errorf("message %s: content-type %s: structured mode, want binary", id, ct)
		}
		if wantTopic := map[string]string{"orders": "orders", "payments": "payments.out"}[m.Topic]; r.Topic != wantTopic {
			t.Errorf("message %s: Kafka topic %s, want %s", id, r.Topic, wantTopic)
		}
	}
	checkDrops(t, log)
}

// TestConsumeCloudEventsID: Consume deduplicates a record without an
// oncommit-id header by its ce_id header (a CloudEvent of another
// producer), and one without either by its id header; oncommit-id comes
// first, then ce_id.
func TestConsumeCloudEventsID(t *testing.T) {
	e := newConsumeEnv(t)
	ce := func(id string) []kgo.RecordHeader {
		return []kgo.RecordHeader{{Key: "ce_specversion", Value: []byte("1.0")}, {Key: "ce_id", Value: []byte(id)},
			{Key: "ce_source", Value: []byte("/elsewhere")}, {Key: "ce_type", Value: []byte("order.placed")}}
	}
	for _, r := range []struct {
		label string
		hs    []kgo.RecordHeader
	}{
		{"r1", ce("ce-1")},
		{"r2", ce("ce-1")}, // the same event again: a repeat
		{"r3", []kgo.RecordHeader{{Key: "id", Value: []byte("cdc-1")}}},
		{"r4", append(ce("ce-1"), kgo.RecordHeader{Key: "id", Value: []byte("cdc-1")}, kgo.RecordHeader{Key: kafka.IDHeader, Value: []byte("oc-1")})},
		{"r5", append([]kgo.RecordHeader{{Key: "id", Value: []byte("cdc-1")}}, ce("ce-2")...)},
		{"r6", []kgo.RecordHeader{{Key: "id", Value: []byte("cdc-1")}}}, // a repeat
	} {
		rec := &kgo.Record{Topic: "orders", Key: []byte("k"), Value: []byte(r.label), Headers: r.hs}
		if err := e.client.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var got outcomes
	stop := e.run(e.member(t, "g"), kafka.ConsumeConfig{Name: "ledger", DeadLetterTopic: "dead", RetryDelay: 20 * time.Millisecond, OnOutcome: got.add},
		func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+e.ledger+` VALUES ($1)`, string(r.Value))
			return err
		})
	// The group exists once a record was attempted.
	waitFor(t, 20*time.Second, "6 outcomes", func() bool { return len(got.get()) >= 6 })
	waitFor(t, 20*time.Second, "6 offsets committed", func() bool { return e.committed(t, "g") == 6 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows := e.ledgerRows(t); fmt.Sprint(rows) != "[r1 r3 r4 r5]" {
		t.Errorf("ledger %v, want [r1 r3 r4 r5]", rows)
	}
	for id, want := range map[string]string{"ce-1": "applied repeat", "cdc-1": "applied repeat", "oc-1": "applied", "ce-2": "applied"} {
		var s []string
		for _, o := range got.of(id) {
			switch {
			case o.Applied:
				s = append(s, "applied")
			case o.Repeat:
				s = append(s, "repeat")
			default:
				s = append(s, fmt.Sprintf("failed(%v, dead %v)", o.Err, o.Dead))
			}
		}
		if strings.Join(s, " ") != want {
			t.Errorf("id %s: outcomes %v, want %s", id, s, want)
		}
	}
	if n := len(got.get()); n != 6 {
		t.Errorf("%d outcomes, want 6: %+v", n, got.get())
	}
}
