package natsfwd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncommit/oncommit/internal/fwd"
	"github.com/oncommit/oncommit/outbox"
)

// Defaults for [Config].
const (
	DefaultWindow     = 256
	DefaultAckTimeout = 10 * time.Second
)

// ErrAckTimeout is the outcome (wrapped) of a message whose PubAck did not
// come within Config.AckTimeout: it is retried, and JetStream drops the
// retry if the first publish was stored after all.
var ErrAckTimeout = fwd.ErrAckTimeout

// ErrKeyFailed is the outcome of a message that was not published because
// an earlier message of its key in the same batch failed (see
// [Forwarder.Handler]).
var ErrKeyFailed = fwd.ErrKeyFailed

// Config configures a [Forwarder]. The zero value works.
type Config struct {
	// Subject returns the subject a delivery is published on. It must
	// be a subject a stream stores, or JetStream does not acknowledge the
	// publish and the message is retried. Defaults to the delivery's
	// topic.
	Subject func(outbox.Delivery) string

	// Window is the most publishes of one batch awaiting their PubAck at
	// once. Defaults to DefaultWindow (256).
	Window int

	// AckTimeout is how long a publish waits for its PubAck; a publish
	// without one by then is retried. Defaults to DefaultAckTimeout (10s).
	AckTimeout time.Duration

	// Lease and RetryCap are the relay's (RelayConfig.Lease and
	// RetryCap), which [Forwarder.Check] compares the streams' duplicate
	// windows with. Default to outbox.DefaultLease (30s) and
	// outbox.DefaultRetryCap (10m), the relay's defaults.
	Lease    time.Duration
	RetryCap time.Duration

	// Logger receives Check's warnings and a line per message header
	// dropped (see [Forwarder.Handler]). Defaults to slog.Default().
	Logger *slog.Logger
}

// ConfigError reports an invalid [Config] field.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return "natsfwd: Config." + e.Field + " " + e.Reason }

// Forwarder publishes outbox deliveries to JetStream. Build it with
// [New] and register its [Forwarder.Handler] on a relay. It is safe for
// concurrent use: the relay runs several batches at once.
type Forwarder struct {
	js      jetstream.JetStream // the caller's: Check's stream lookups
	pub     jetstream.JetStream // the forwarder's own: its publishes
	cfg     Config
	headers fwd.Headers
}

// New returns a forwarder that publishes on js's connection, or a
// *[ConfigError].
//
// It publishes through a JetStream context of its own on that connection
// (jetstream.New(js.Conn(), jetstream.WithPublishAsyncTimeout(AckTimeout))),
// whose pending PubAcks expire after Config.AckTimeout: a PubAck that
// never comes frees its slot, so lost acks cannot pile up to nats.go's cap
// of unanswered publishes (jetstream.WithPublishAsyncMaxPending, 4,000)
// and stall every later publish. The options of js's own publisher (its
// cap, timeout and callbacks) do not apply to the forwarder's publishes,
// and js's pending publishes are left alone.
func New(js jetstream.JetStream, cfg Config) (*Forwarder, error) {
	if js == nil {
		return nil, &ConfigError{Field: "js", Reason: "must not be nil"}
	}
	switch {
	case cfg.Window < 0:
		return nil, &ConfigError{Field: "Window", Reason: "must not be negative"}
	case cfg.AckTimeout < 0:
		return nil, &ConfigError{Field: "AckTimeout", Reason: "must not be negative"}
	case cfg.Lease < 0:
		return nil, &ConfigError{Field: "Lease", Reason: "must not be negative"}
	case cfg.RetryCap < 0:
		return nil, &ConfigError{Field: "RetryCap", Reason: "must not be negative"}
	}
	if cfg.Subject == nil {
		cfg.Subject = func(d outbox.Delivery) string { return d.Topic }
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.Lease == 0 {
		cfg.Lease = outbox.DefaultLease
	}
	if cfg.RetryCap == 0 {
		cfg.RetryCap = outbox.DefaultRetryCap
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	nc := js.Conn()
	if nc == nil {
		return nil, &ConfigError{Field: "js", Reason: "has no connection"}
	}
	pub, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("natsfwd: %w", err)
	}
	f := &Forwarder{js: js, pub: pub, cfg: cfg}
	f.headers = fwd.Headers{Reserved: reserved, Logger: cfg.Logger,
		Msg: "natsfwd: dropped a message header in the Nats- namespace, which JetStream acts on; later drops of this name are logged at debug level"}
	return f, nil
}

// reserved reports whether the forwarder drops a message header of this
// name (see [Forwarder.Handler]). Nats-Msg-Id is the forwarder's own.
func reserved(name string) bool { return fwd.HasPrefixFold(name, "Nats-") }

// Handler returns the batch handler to register on a relay, for one topic
// or for all of them (outbox.AllTopics).
//
// It publishes the batch asynchronously, at most Config.Window publishes
// awaiting their PubAck at once, each with Nats-Msg-Id set to the
// message's id and with the message's headers, and returns once every
// publish has its answer: a message is done only when JetStream
// acknowledged it (a PubAck that reports a duplicate included: the stream
// has it). An error, a missing PubAck after Config.AckTimeout, or the
// relay's shutdown are retries. A subject NATS refuses (empty, or with
// spaces) and a message over the server's maximum payload are
// dead-lettered: retrying cannot help.
//
// Headers whose names start with "Nats-" (in any case) are dropped: the
// server reserves that namespace and acts on its names (Nats-Rollup
// purges the subject, Nats-Expected-* make the publish fail, Nats-TTL
// expires the message), and message data must not control the stream. A
// drop is logged on Config.Logger, at warning level the first time a name
// is dropped and at debug level after that.
//
// Messages with a Key go out one at a time per key: the next one of a key
// is published only after the previous one's PubAck, and after a failure
// the key's later messages in the batch are retried without being
// published, so a retry cannot put a key's messages on the stream out of
// order (with Config.OrderByKey the relay hands them over in order).
func (f *Forwarder) Handler() outbox.BatchHandler {
	return f.forward
}

func (f *Forwarder) forward(ctx context.Context, ds []outbox.Delivery) []error {
	return fwd.Batch(ctx, ds, f.cfg.Window, f.cfg.AckTimeout, func(i int) (fwd.Wait, error) {
		d := &ds[i]
		m := &nats.Msg{Subject: f.cfg.Subject(*d), Data: d.Payload, Header: make(nats.Header, len(d.Headers)+1)}
		for k, v := range d.Headers {
			if f.headers.Keep(ctx, d, k) {
				m.Header[k] = []string{v}
			}
		}
		m.Header[jetstream.MsgIDHeader] = []string{d.ID.String()}
		paf, err := f.pub.PublishMsgAsync(m)
		if err != nil {
			if errors.Is(err, nats.ErrBadSubject) || errors.Is(err, nats.ErrMaxPayload) {
				return nil, outbox.DeadLetter(fmt.Errorf("natsfwd: publish on %q: %w", m.Subject, err))
			}
			return nil, fmt.Errorf("natsfwd: publish on %q: %w", m.Subject, err)
		}
		return func(done <-chan struct{}, timeout <-chan time.Time) error {
			select {
			case <-paf.Ok():
				return nil
			case err := <-paf.Err():
				if errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
					err = ErrAckTimeout // the context's own timer, which is AckTimeout too
				}
				return fmt.Errorf("natsfwd: publish on %q: %w", m.Subject, err)
			case <-timeout:
				return fmt.Errorf("natsfwd: publish on %q: %w", m.Subject, ErrAckTimeout)
			case <-done:
				return fmt.Errorf("natsfwd: publish on %q: %w", m.Subject, ctx.Err())
			}
		}, nil
	})
}

// Check reads, for each topic, the duplicate window of the stream that
// stores its subject (Config.Subject), and logs a warning for each stream
// whose window is not longer than Config.Lease + Config.RetryCap: a
// redelivery after the window would be stored twice. It returns an error
// when a subject has no stream (wrapping jetstream.ErrStreamNotFound) or
// the streams cannot be read. Call it once at start, with the topics the
// forwarder handles.
func (f *Forwarder) Check(ctx context.Context, topics ...string) error {
	need := f.cfg.Lease + f.cfg.RetryCap
	seen := map[string]bool{}
	for _, t := range topics {
		subject := f.cfg.Subject(outbox.Delivery{Topic: t})
		name, err := f.js.StreamNameBySubject(ctx, subject)
		if err != nil {
			return fmt.Errorf("natsfwd: stream of subject %q (topic %q): %w", subject, t, err)
		}
		if seen[name] {
			continue
		}
		seen[name] = true
		s, err := f.js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("natsfwd: stream %q: %w", name, err)
		}
		info := s.CachedInfo()
		if w := info.Config.Duplicates; w <= need {
			f.cfg.Logger.Warn("natsfwd: stream's duplicate window is not longer than the relay's lease plus its longest backoff: a redelivery after the window is stored twice",
				"stream", name, "duplicates", w, "lease", f.cfg.Lease, "retry_cap", f.cfg.RetryCap, "want_more_than", need)
		}
	}
	return nil
}
