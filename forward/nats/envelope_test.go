package natsfwd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsfwd "github.com/oncommit/oncommit/forward/nats"
	"github.com/oncommit/oncommit/internal/fwdtest"
	"github.com/oncommit/oncommit/outbox"
)

const (
	// A topic, a source and a key that the CloudEvents binding percent-
	// encodes, with their encodings written out (not computed).
	oddTopic     = "order placed €"
	oddTopicEnc  = "order%20placed%20%E2%82%AC"
	oddSource    = "/shop/Zürich orders"
	oddSourceEnc = "/shop/Z%C3%BCrich%20orders"
	oddKey       = "Kunde Ä"
	oddKeyEnc    = "Kunde%20%C3%84"
	traceparent  = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
)

// colliding are message headers named as envelope headers (in one mode or
// the other, in any case): the forwarder drops each of them, in both
// modes.
var colliding = map[string]string{
	"Content-Type": "text/plain", "content-type": "text/html",
	"Oncommit-Type": "spoofed", "oncommit-source": "spoofed", "ONCOMMIT-TIME": "1999-01-01T00:00:00Z",
	"Oncommit-Key": "spoofed", "Oncommit-Anything": "spoofed",
	"ce-id": "spoofed", "CE-Type": "spoofed", "Ce-Source": "spoofed", "ce-specversion": "0.3",
	"ce-time": "1999-01-01T00:00:00Z", "ce-partitionkey": "spoofed", "ce-datacontenttype": "text/plain",
	"ce-extension": "spoofed",
}

// kept are message headers close to the envelope's names that are not
// among them: they reach the stream.
var kept = map[string]string{
	"traceparent": traceparent, "Content-Language": "de", "Content-Type-Options": "nosniff",
	"Oncommit": "x", "OncommitType": "x", "cetera": "x", "ce_id": "x",
}

// envelopeCase is one forwarder configuration of TestEnvelope.
type envelopeCase struct {
	name        string
	cloudEvents bool
	source      string // Config.Source
}

// TestEnvelope forwards three messages (a key and colliding headers; an
// odd topic and an odd key; neither a key nor a payload) in plain and in
// CloudEvents mode, with the default and an odd source, and checks every
// header of each message as stored in the stream: the envelope's values,
// the user headers kept and the colliding ones dropped (and warned about
// once each).
func TestEnvelope(t *testing.T) {
	for _, c := range []envelopeCase{
		{"plain", false, ""},
		{"plain-source", false, oddSource},
		{"cloudevents", true, ""},
		{"cloudevents-source", true, oddSource},
	} {
		t.Run(c.name, func(t *testing.T) { testEnvelope(t, c) })
	}
}

func testEnvelope(t *testing.T, c envelopeCase) {
	t.Parallel()
	url := natsURL(t)
	env := fwdtest.New(t, false)
	_, js := connect(t, url)
	s, subj := stream(t, js, 20*time.Minute)
	var log fwdtest.Log
	f, err := natsfwd.New(js, natsfwd.Config{
		Subject: func(outbox.Delivery) string { return subj("env") }, // the odd topic is no subject
		Source:  c.source, CloudEvents: c.cloudEvents, Logger: log.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}

	msgs := []outbox.Message{
		{Topic: "orders", Key: "A-1", Payload: []byte(`{"n":0}`), Headers: map[string]string{"n": "0"}},
		{Topic: oddTopic, Key: oddKey, Payload: []byte(`{"n":1}`), Headers: map[string]string{"n": "1", "CE-Type": "spoofed", "Oncommit-Type": "spoofed"}},
		{Topic: "orders", Headers: map[string]string{"n": "2", "traceparent": traceparent}},
	}
	maps.Copy(msgs[0].Headers, colliding)
	maps.Copy(msgs[0].Headers, kept)
	ids := env.Publish(t, msgs...)
	created := env.CreatedAt(t)
	env.Drain(t, outbox.RelayConfig{}, outbox.AllTopics, f.Handler(), time.Minute)

	got := read(t, s)
	checkOnce(t, got, ids)
	source, sourceEnc := defaultSource, defaultSource
	if c.source != "" {
		source, sourceEnc = oddSource, oddSourceEnc
	}
	index := map[string]int{}
	for i, id := range ids {
		index[id.String()] = i
	}
	for _, m := range got {
		i, ok := index[m.id]
		if !ok {
			continue // checkOnce said so
		}
		msg, id := msgs[i], ids[i].String()
		at, ok := created[id]
		if !ok {
			t.Fatalf("message %d: no created_at read for %s", i, id)
		}

		// Every header, as the rule says it must be.
		want := nats.Header{jetstream.MsgIDHeader: {id}}
		for k, v := range msg.Headers {
			if _, drop := colliding[k]; !drop {
				want[k] = []string{v}
			}
		}
		if msg.Payload != nil {
			want["Content-Type"] = []string{"application/json"}
		}
		stamp := at.UTC().Format(time.RFC3339Nano)
		if c.cloudEvents {
			typ, key := msg.Topic, msg.Key
			if typ == oddTopic {
				typ = oddTopicEnc
			}
			if key == oddKey {
				key = oddKeyEnc
			}
			want["ce-id"] = []string{id}
			want["ce-source"] = []string{sourceEnc}
			want["ce-specversion"] = []string{"1.0"}
			want["ce-type"] = []string{typ}
			want["ce-time"] = []string{stamp}
			if key != "" {
				want["ce-partitionkey"] = []string{key}
			}
			if msg.Payload != nil {
				want["ce-datacontenttype"] = []string{"application/json"}
			}
		} else {
			want["Oncommit-Type"] = []string{msg.Topic}
			want["Oncommit-Source"] = []string{source}
			want["Oncommit-Time"] = []string{stamp}
			if msg.Key != "" {
				want["Oncommit-Key"] = []string{msg.Key}
			}
		}
		if !reflect.DeepEqual(m.header, want) {
			t.Errorf("message %d: headers\n%v\nwant\n%v", i, m.header, want)
			for k := range m.header {
				if _, ok := want[k]; !ok {
					t.Errorf("message %d: unexpected header %s=%q", i, k, m.header[k])
				}
			}
		}

		// The envelope's properties, each on its own.
		timeName, idName := "Oncommit-Time", jetstream.MsgIDHeader
		if c.cloudEvents {
			timeName, idName = "ce-time", "ce-id"
		}
		if m.header.Get(idName) != m.id || m.id != id {
			t.Errorf("message %d: %s %q, Nats-Msg-Id %q, want both %s", i, idName, m.header.Get(idName), m.id, id)
		}
		ts := m.header.Get(timeName)
		parsed, err := time.Parse(time.RFC3339, ts)
		if err != nil || !strings.HasSuffix(ts, "Z") || !parsed.Equal(at) || !parsed.Equal(at.Truncate(time.Microsecond)) {
			t.Errorf("message %d: %s %q (%v), want created_at %v in UTC to the microsecond", i, timeName, ts, err, at)
		}
		if ct := m.header.Get("Content-Type"); strings.HasPrefix(ct, "application/cloudevents") {
			t.Errorf("message %d: Content-Type %q means the structured mode", i, ct)
		}
		var data bytes.Buffer // PostgreSQL's jsonb respaces the payload
		if m.data != "" {
			if err := json.Compact(&data, []byte(m.data)); err != nil {
				t.Errorf("message %d: data %q: %v", i, m.data, err)
			}
		}
		if data.String() != string(msg.Payload) {
			t.Errorf("message %d: data %q, want %q", i, m.data, msg.Payload)
		}
		if i < 2 { // for docs/forwarding.md
			var b strings.Builder
			for _, k := range slices.Sorted(maps.Keys(m.header)) {
				fmt.Fprintf(&b, "\n  %s: %s", k, m.header.Get(k))
			}
			t.Logf("message %d on %s, data %s:%s", i, m.subject, m.data, b.String())
		}
	}

	// Each dropped name warned about once (messages 0 and 1 both carry
	// CE-Type and Oncommit-Type).
	out := log.String()
	for name := range colliding {
		if n := strings.Count(out, "header="+name+" "); n != 1 {
			t.Errorf("%d warnings about header %s, want 1", n, name)
		}
	}
	if n := strings.Count(out, "level=WARN"); n != len(colliding) {
		t.Errorf("%d warnings, want %d (log %q)", n, len(colliding), out)
	}
}

// defaultSource is fwd.DefaultSource, written out: the default the docs
// promise.
const defaultSource = "oncommit"

// TestEnsureStream: EnsureStream raises a short duplicate window (on an
// existing stream and on new ones) to the relay's lease plus its retry
// cap plus the AckTimeout, keeps a longer one (the server's default
// included), is idempotent, and Check then finds the window long enough.
func TestEnsureStream(t *testing.T) {
	t.Parallel()
	url := natsURL(t)
	_, js := connect(t, url)
	ctx := context.Background()
	var log fwdtest.Log
	check := func(subj func(string) string, fcfg natsfwd.Config) string {
		t.Helper()
		log.Reset()
		fcfg.Logger = log.Logger()
		if err := forwarder(t, js, subj, fcfg).Check(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		return log.String()
	}
	ensure := func(cfg jetstream.StreamConfig, fcfg natsfwd.Config, want time.Duration) {
		t.Helper()
		var infos []*jetstream.StreamInfo
		for range 2 {
			s, err := natsfwd.EnsureStream(ctx, js, cfg, fcfg)
			if err != nil {
				t.Fatalf("EnsureStream(%s): %v", cfg.Name, err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			infos = append(infos, info)
		}
		if d := infos[0].Config.Duplicates; d != want {
			t.Errorf("%s: duplicate window %v, want %v", cfg.Name, d, want)
		}
		if !reflect.DeepEqual(infos[0].Config, infos[1].Config) || !infos[0].Created.Equal(infos[1].Created) {
			t.Errorf("%s: the second call changed the stream:\n%+v (created %v)\n%+v (created %v)", cfg.Name, infos[0].Config, infos[0].Created, infos[1].Config, infos[1].Created)
		}
		names := js.StreamNames(ctx, jetstream.WithStreamListSubject(cfg.Subjects[0]))
		var n []string
		for name := range names.Name() {
			n = append(n, name)
		}
		if names.Err() != nil || len(n) != 1 || n[0] != cfg.Name {
			t.Errorf("%s: streams of its subjects %v (%v), want just it", cfg.Name, n, names.Err())
		}
	}

	// An existing stream with a 1m window, which Check warns about: raised
	// to the defaults' 30s + 10m + 10s, and Check is content.
	short, subj := stream(t, js, time.Minute)
	if out := check(subj, natsfwd.Config{}); strings.Count(out, "level=WARN") != 1 {
		t.Fatalf("Check on a 1m window: log %q, want one warning", out)
	}
	cfg := short.CachedInfo().Config
	ensure(cfg, natsfwd.Config{}, outbox.DefaultLease+outbox.DefaultRetryCap+natsfwd.DefaultAckTimeout)
	if out := check(subj, natsfwd.Config{}); out != "" {
		t.Errorf("Check after EnsureStream: log %q, want none", out)
	}

	// A longer window is kept.
	cfg.Duplicates = time.Hour
	ensure(cfg, natsfwd.Config{}, time.Hour)

	// New streams, the server's default window (2m): raised to the
	// defaults' 10m40s; kept with the settings of the fault tests (5s +
	// 1s + 2s), as is a 5s window raised to their 8s.
	fault := natsfwd.Config{AckTimeout: 2 * time.Second, Lease: fwdtest.OutageRelay().Lease, RetryCap: fwdtest.OutageRelay().RetryCap}
	for i, c := range []struct {
		dup  time.Duration
		fcfg natsfwd.Config
		want time.Duration
	}{
		{0, natsfwd.Config{}, outbox.DefaultLease + outbox.DefaultRetryCap + natsfwd.DefaultAckTimeout},
		{0, fault, 2 * time.Minute},
		{5 * time.Second, fault, fault.Lease + fault.RetryCap + fault.AckTimeout},
	} {
		name := fmt.Sprintf("OCFWD_ENSURE%d_%s", i, strings.TrimPrefix(cfg.Name, "OCFWD_"))
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
		ensure(jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Duplicates: c.dup}, c.fcfg, c.want)
		if out := check(func(topic string) string { return name + "." + topic }, c.fcfg); out != "" {
			t.Errorf("Check after EnsureStream of new stream %d: log %q, want none", i, out)
		}
	}

	var ce *natsfwd.ConfigError
	if _, err := natsfwd.EnsureStream(ctx, js, cfg, natsfwd.Config{Lease: -1}); !errors.As(err, &ce) || ce.Field != "Lease" {
		t.Errorf("negative Lease: err %v, want a *ConfigError for Lease", err)
	}
	if _, err := natsfwd.EnsureStream(ctx, nil, cfg, natsfwd.Config{}); !errors.As(err, &ce) || ce.Field != "js" {
		t.Errorf("nil JetStream: err %v, want a *ConfigError for js", err)
	}
}
