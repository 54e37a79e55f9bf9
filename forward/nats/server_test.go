package natsfwd_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncommit/oncommit/internal/pgtest"
)

// DefaultURL is the local NATS server (with JetStream) tried when
// OUTBOX_TEST_NATS_URL is unset: the one .ci/run starts.
const DefaultURL = "nats://127.0.0.1:4222"

// natsURL returns the URL of a NATS server with JetStream, or skips (fails
// under CI=true, logged to OUTBOX_TEST_SKIPLOG) the test.
func natsURL(t testing.TB) string {
	t.Helper()
	u, from := os.Getenv("OUTBOX_TEST_NATS_URL"), "OUTBOX_TEST_NATS_URL="
	if u == "" {
		u, from = DefaultURL, ""
	}
	nc, err := nats.Connect(u, nats.Timeout(2*time.Second), nats.NoReconnect())
	if err == nil {
		var js jetstream.JetStream
		if js, err = jetstream.New(nc); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err = js.AccountInfo(ctx)
			cancel()
		}
		nc.Close()
	}
	if err != nil {
		pgtest.Unavailable(t, fmt.Sprintf("no NATS with JetStream: %s%s does not answer (%v); run nats-server -js or set OUTBOX_TEST_NATS_URL", from, u, err))
	}
	return u
}

// connect returns a connection to url that reconnects for good, and its
// JetStream, closed when t ends.
func connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return dial(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Timeout(2*time.Second))
}

// dial returns a connection to url with opts (and nats.go's defaults
// for the rest), and its JetStream, closed when t ends.
func dial(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// stream creates a stream of its own, subjects "<name>.>", duplicate
// window dup (the server's default when 0), removed when t ends, and
// returns it with the subject mapping of the forwarder.
func stream(t testing.TB, js jetstream.JetStream, dup time.Duration) (jetstream.Stream, func(topic string) string) {
	t.Helper()
	return streamWith(t, js, func(c *jetstream.StreamConfig) { c.Duplicates = dup })
}

// streamWith is stream with the configuration edit makes.
func streamWith(t testing.TB, js jetstream.JetStream, edit func(*jetstream.StreamConfig)) (jetstream.Stream, func(topic string) string) {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "OCFWD_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage}
	edit(&cfg)
	s, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	return s, func(topic string) string { return name + "." + topic }
}

type stored struct {
	seq     uint64
	id      string
	subject string
	data    string
	header  nats.Header
}

// read returns every message of s, in stream order.
func read(t testing.TB, s jetstream.Stream) []stored {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []stored
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get %d: %v", seq, err)
		}
		out = append(out, stored{seq: m.Sequence, id: m.Header.Get(jetstream.MsgIDHeader), subject: m.Subject, data: string(m.Data), header: m.Header})
	}
	return out
}

// server is a nats-server process of the test's own (JetStream, storage in
// a temporary directory), which the test can stop and start again.
type server struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
}

const natsServer = "/usr/sbin/nats-server"

// ownServer starts a nats-server on a free port, stopped when t ends. It
// skips t (fails under CI=true) when the binary is missing.
func ownServer(t testing.TB) *server {
	t.Helper()
	if _, err := os.Stat(natsServer); err != nil {
		pgtest.Unavailable(t, "no "+natsServer+" to start a NATS server of the test's own: "+err.Error())
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &server{t: t, port: port, dir: t.TempDir()}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *server) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

func (s *server) start() {
	s.t.Helper()
	s.cmd = exec.Command(natsServer, "-a", "127.0.0.1", "-p", fmt.Sprint(s.port), "-js", "-sd", s.dir)
	s.cmd.Stdout, s.cmd.Stderr = nil, nil
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		nc, err := nats.Connect(s.url(), nats.NoReconnect(), nats.Timeout(time.Second))
		if err == nil {
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err = js.AccountInfo(ctx)
			cancel()
			nc.Close()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("own nats-server on port %d not ready: %v", s.port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop stops the server (SIGTERM, as a service manager does) and waits
// for it to exit.
func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}
