package natsfwd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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

	// Source is the envelope's source (see CloudEvents): the
	// Oncommit-Source header, or ce-source. Defaults to "oncommit".
	Source string

	// CloudEvents selects the message envelope. Every message carries
	// Nats-Msg-Id = the message's id (JetStream's deduplication id) and,
	// when it has a payload, Content-Type = "application/json". Then:
	//
	// Plain mode (false, the default):
	//
	//	Oncommit-Type    the topic
	//	Oncommit-Source  Source
	//	Oncommit-Time    the creation time: RFC 3339, UTC, the database's
	//	                 precision (PostgreSQL: microseconds)
	//	Oncommit-Key     the key (only when the message has one)
	//
	// The values go as they are; NATS turns a CR or LF in a header value
	// into a space and trims the value's surrounding white space.
	//
	// CloudEvents mode (true): the binary content mode of the CloudEvents
	// NATS protocol binding, the payload as the event's data and the
	// attributes as headers, each value percent-encoded (space, '"',
	// '%' and every byte outside printable ASCII as %XY):
	//
	//	ce-id               the message's id (= Nats-Msg-Id)
	//	ce-source           Source
	//	ce-specversion      "1.0"
	//	ce-type             the topic
	//	ce-time             the creation time, as Oncommit-Time
	//	ce-partitionkey     the key (only when the message has one)
	//	ce-datacontenttype  "application/json" (only with a payload)
	//
	// Content-Type is the data's content type, never one starting with
	// "application/cloudevents" (which would mean the structured mode).
	//
	// In both modes the message's own headers named Content-Type or
	// starting with "Oncommit-" or "ce-" (in any case) are dropped, like
	// those starting with "Nats-" (see [Forwarder.Handler]): a message
	// header never stands in for an envelope field, whichever mode a
	// consumer reads.
	CloudEvents bool

	// Logger receives Check's warnings and a line per message header
	// dropped (see [Forwarder.Handler]). Defaults to slog.Default().
	Logger *slog.Logger
}

// resolve returns c with its defaults filled in, or a *ConfigError. New
// and EnsureStream share it.
func (c Config) resolve() (Config, error) {
	switch {
	case c.Window < 0:
		return c, &ConfigError{Field: "Window", Reason: "must not be negative"}
	case c.AckTimeout < 0:
		return c, &ConfigError{Field: "AckTimeout", Reason: "must not be negative"}
	case c.Lease < 0:
		return c, &ConfigError{Field: "Lease", Reason: "must not be negative"}
	case c.RetryCap < 0:
		return c, &ConfigError{Field: "RetryCap", Reason: "must not be negative"}
	}
	if c.Subject == nil {
		c.Subject = func(d outbox.Delivery) string { return d.Topic }
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.Lease == 0 {
		c.Lease = outbox.DefaultLease
	}
	if c.RetryCap == 0 {
		c.RetryCap = outbox.DefaultRetryCap
	}
	if c.Source == "" {
		c.Source = fwd.DefaultSource
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// redelivery is the longest a redelivery of a message can come after its
// first publish (of a resolved Config): the relay's lease plus its retry
// cap. A stream's duplicate window must be longer (see [Forwarder.Check]).
func (c Config) redelivery() time.Duration { return c.Lease + c.RetryCap }

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
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, err
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
		Msg: "natsfwd: dropped a message header in the Nats- namespace, which JetStream acts on, or named as an envelope header (Content-Type, Oncommit-*, ce-*); later drops of this name are logged at debug level"}
	return f, nil
}

// Envelope headers (see Config.CloudEvents).
const (
	headerContentType = "Content-Type"
	headerType        = "Oncommit-Type"
	headerSource      = "Oncommit-Source"
	headerTime        = "Oncommit-Time"
	headerKey         = "Oncommit-Key"
	prefixOncommit    = "Oncommit-"
	prefixCE          = "ce-"
	headerCEData      = prefixCE + "datacontenttype"
)

// reserved reports whether the forwarder drops a message header of this
// name (see [Forwarder.Handler]): the server's Nats- namespace (Nats-Msg-Id
// is the forwarder's own) and the names of the envelope, in either mode.
func reserved(name string) bool {
	return fwd.HasPrefixFold(name, "Nats-") || fwd.HasPrefixFold(name, prefixOncommit) ||
		fwd.HasPrefixFold(name, prefixCE) || strings.EqualFold(name, headerContentType)
}

// envelope sets d's envelope headers (see Config.CloudEvents) on h.
func (f *Forwarder) envelope(h nats.Header, d *outbox.Delivery) {
	e := fwd.EnvelopeOf(d, f.cfg.Source)
	h[jetstream.MsgIDHeader] = []string{e.ID}
	if e.ContentType != "" {
		h[headerContentType] = []string{e.ContentType}
	}
	if f.cfg.CloudEvents {
		for _, a := range e.CloudEvents() {
			h[prefixCE+a.Name] = []string{fwd.PercentEncode(a.Value)}
		}
		if e.ContentType != "" {
			h[headerCEData] = []string{fwd.PercentEncode(e.ContentType)}
		}
		return
	}
	h[headerType] = []string{e.Type}
	h[headerSource] = []string{e.Source}
	h[headerTime] = []string{e.Time}
	if e.Key != "" {
		h[headerKey] = []string{e.Key}
	}
}

// Handler returns the batch handler to register on a relay, for one topic
// or for all of them (outbox.AllTopics).
//
// It publishes the batch asynchronously, at most Config.Window publishes
// awaiting their PubAck at once, each with Nats-Msg-Id set to the
// message's id, with the envelope headers (see Config.CloudEvents) and
// with the message's headers, and returns once every publish has its
// answer: a message is done only when JetStream acknowledged it (a PubAck
// that reports a duplicate included: the stream has it). An error, a missing PubAck after Config.AckTimeout, or the
// relay's shutdown are retries. A subject NATS refuses (empty, or with
// spaces) and a message over the server's maximum payload are
// dead-lettered: retrying cannot help.
//
// Headers whose names start with "Nats-" (in any case) are dropped: the
// server reserves that namespace and acts on its names (Nats-Rollup
// purges the subject, Nats-Expected-* make the publish fail, Nats-TTL
// expires the message), and message data must not control the stream. So
// are headers named as the envelope's, in both modes: Content-Type and
// names starting with "Oncommit-" or "ce-" (in any case), as message data
// must not spoof the envelope either. A drop is logged on Config.Logger,
// at warning level the first time a name is dropped and at debug level
// after that.
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
		m := &nats.Msg{Subject: f.cfg.Subject(*d), Data: d.Payload, Header: make(nats.Header, len(d.Headers)+8)}
		for k, v := range d.Headers {
			if f.headers.Keep(ctx, d, k) {
				m.Header[k] = []string{v}
			}
		}
		f.envelope(m.Header, d)
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
	need := f.cfg.redelivery()
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

// serverDuplicates is the duplicate window nats-server gives a stream
// configured without one (unless its MaxAge is shorter).
const serverDuplicates = 2 * time.Minute

// EnsureStream creates the stream cfg describes, or updates the stream of
// that name to cfg (jetstream.JetStream.CreateOrUpdateStream), and
// returns it. Calling it again with the same arguments changes nothing.
//
// The duplicate window then fits the relay's lease and retry settings, as
// [Forwarder.Check] verifies: a cfg.Duplicates shorter than fcfg.Lease +
// fcfg.RetryCap (the relay's defaults when zero, as in a [Forwarder])
// plus fcfg.AckTimeout (the forwarder's default when zero, a margin for
// the last publish's PubAck) is raised to that sum; a longer window is
// kept, and so is a zero one when the server's default (two minutes, or
// cfg.MaxAge when shorter) is longer. The server refuses a window longer
// than cfg.MaxAge, when set. Of fcfg only Lease, RetryCap and AckTimeout
// are used; an invalid field is a *[ConfigError], as in [New].
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, fcfg Config) (jetstream.Stream, error) {
	if js == nil {
		return nil, &ConfigError{Field: "js", Reason: "must not be nil"}
	}
	fcfg, err := fcfg.resolve()
	if err != nil {
		return nil, err
	}
	have := cfg.Duplicates
	if have == 0 { // the server's default
		have = serverDuplicates
		if cfg.MaxAge > 0 && cfg.MaxAge < have {
			have = cfg.MaxAge
		}
	}
	if want := fcfg.redelivery() + fcfg.AckTimeout; have < want {
		cfg.Duplicates = want
	}
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("natsfwd: stream %q: %w", cfg.Name, err)
	}
	return s, nil
}
