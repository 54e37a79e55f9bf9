package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncommit/oncommit/internal/fwd"
	"github.com/oncommit/oncommit/outbox"
)

// Defaults for [Config].
const (
	DefaultWindow         = 256
	DefaultConfirmTimeout = 10 * time.Second
	DefaultDialTimeout    = 10 * time.Second
)

// Errors of the outcomes (wrapped), which the relay records as the
// messages' last error.
var (
	// ErrNacked: the broker refused the message (a negative confirm, or
	// the channel closed before its confirm). It is retried.
	ErrNacked = errors.New("rabbitmq: the broker did not confirm the message")
	// ErrConfirmTimeout: no confirm came within Config.ConfirmTimeout, or
	// no channel opened within it. It is retried.
	ErrConfirmTimeout = fwd.ErrAckTimeout
	// ErrKeyFailed: the message was not published because an earlier
	// message of its key in the same batch failed. It is retried.
	ErrKeyFailed = fwd.ErrKeyFailed
)

// UnroutableError is the outcome (wrapped) of a message that the broker
// returned because no queue is bound for it (a mandatory publish it could
// not route). It is retried, or dead-lettered at once with
// Config.DeadLetterUnroutable: it is never done.
type UnroutableError struct {
	Exchange   string
	RoutingKey string
	Code       uint16 // the reply code, 312 NO_ROUTE
	Text       string
}

func (e *UnroutableError) Error() string {
	return fmt.Sprintf("rabbitmq: unroutable: exchange %q, routing key %q: %d %s", e.Exchange, e.RoutingKey, e.Code, e.Text)
}

// Config configures a [Forwarder]. The zero value works.
type Config struct {
	// Exchange is the exchange messages are published to. Defaults to ""
	// (the default exchange, which routes to the queue named by the
	// routing key).
	Exchange string

	// RoutingKey returns a delivery's routing key. Defaults to the
	// delivery's topic.
	RoutingKey func(outbox.Delivery) string

	// Window is the most publishes of one batch awaiting their confirm at
	// once. Defaults to DefaultWindow (256).
	Window int

	// ConfirmTimeout is how long a publish waits for its confirm (one
	// without by then is retried), and how long a batch waits for a
	// channel to open (see [Forwarder.Handler]). Defaults to
	// DefaultConfirmTimeout (10s).
	ConfirmTimeout time.Duration

	// DeadLetterUnroutable dead-letters a message the broker returned as
	// unroutable at once, instead of retrying it (a binding that is
	// missing for good). Defaults to false: retried with backoff, dead
	// after RelayConfig.MaxAttempts.
	DeadLetterUnroutable bool

	// Source is the envelope's source: the app-id property of every
	// message and, in CloudEvents mode, its cloudEvents_source header (a
	// URI-reference, such as "/orders" or "urn:example:orders"). At most
	// 255 bytes (app-id is an AMQP short string). Defaults to
	// "oncommit".
	Source string

	// CloudEvents adds the CloudEvents attributes of the envelope as
	// headers, in binary content mode as the CloudEvents AMQP protocol
	// binding says (application properties, which are AMQP 0-9-1
	// headers, named with the prefix "cloudEvents_"): the payload is
	// the event's data, unchanged. Defaults to false (plain mode).
	//
	// Every message carries these properties, in both modes:
	//
	//	message-id    the message's id (consumers deduplicate on it)
	//	content-type  application/json ("" for a message without payload)
	//	app-id        Source
	//	type          the message's topic
	//	timestamp     its creation time (whole seconds: AMQP's resolution)
	//
	// In plain mode a message with a Key also carries the header
	// KeyHeader ("oncommit-key") = its key. In CloudEvents mode it
	// carries these headers instead (all strings):
	//
	//	cloudEvents_id            the message's id (= message-id)
	//	cloudEvents_source        Source
	//	cloudEvents_specversion   1.0
	//	cloudEvents_type          the message's topic (= type)
	//	cloudEvents_time          its creation time, RFC 3339 in UTC with
	//	                          the database's precision (microseconds)
	//	cloudEvents_partitionkey  its key, for a message with a Key
	//
	// datacontenttype is the content-type property, as the binding says.
	// The message's own headers go along (see [Forwarder.Handler]), but
	// for those names: a message header named oncommit-key, or starting
	// with "cloudEvents_" or "cloudEvents:" (the binding's older
	// prefix), in any case and in either mode, is dropped, so that
	// message data cannot forge the envelope.
	CloudEvents bool

	// Dial opens a connection to url. Defaults to amqp.DialConfig with
	// DefaultDialTimeout (10s) for the TCP connection and the library's
	// other defaults (10s heartbeats).
	Dial func(url string) (*amqp.Connection, error)

	// Logger receives a line per reconnect and per message header
	// dropped (see [Forwarder.Handler]). Defaults to slog.Default().
	Logger *slog.Logger
}

// ConfigError reports an invalid [Config] field or argument of [New].
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return "rabbitmq: Config." + e.Field + " " + e.Reason }

// Forwarder publishes outbox deliveries to RabbitMQ. Build it with [New],
// register its [Forwarder.Handler] on a relay, and [Forwarder.Close] it
// after the relay stopped. It is safe for concurrent use: the relay runs
// several batches at once, each on a channel of its own.
type Forwarder struct {
	url     string
	cfg     Config
	headers fwd.Headers

	opening chan struct{} // held (one value) by the batch that opens a channel

	mu    sync.Mutex
	conn  *amqp.Connection // nil or closed: dialled on the next batch
	free  []*channel       // idle channels of conn
	dials int
}

// channel is one confirm-mode channel with its returns.
type channel struct {
	ch      *amqp.Channel
	conn    *amqp.Connection
	returns chan amqp.Return
}

// New returns a forwarder that publishes to the broker at url (an AMQP
// URI, amqp://user:pass@host:port/vhost). It connects on the first batch,
// and again on the next batch after a connection or channel was lost.
func New(url string, cfg Config) (*Forwarder, error) {
	switch {
	case url == "":
		return nil, &ConfigError{Field: "url", Reason: "must not be empty"}
	case cfg.Window < 0:
		return nil, &ConfigError{Field: "Window", Reason: "must not be negative"}
	case cfg.ConfirmTimeout < 0:
		return nil, &ConfigError{Field: "ConfirmTimeout", Reason: "must not be negative"}
	case len(cfg.Source) > 255:
		return nil, &ConfigError{Field: "Source", Reason: "must be at most 255 bytes (the app-id property is an AMQP short string)"}
	}
	if _, err := amqp.ParseURI(url); err != nil {
		return nil, &ConfigError{Field: "url", Reason: err.Error()}
	}
	if cfg.Source == "" {
		cfg.Source = fwd.DefaultSource
	}
	if cfg.RoutingKey == nil {
		cfg.RoutingKey = func(d outbox.Delivery) string { return d.Topic }
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.ConfirmTimeout == 0 {
		cfg.ConfirmTimeout = DefaultConfirmTimeout
	}
	if cfg.Dial == nil {
		cfg.Dial = defaultDial
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	f := &Forwarder{url: url, cfg: cfg, opening: make(chan struct{}, 1)}
	f.headers = fwd.Headers{Reserved: func(name string) bool { return reserved(name) || envelopeHeader(name) }, Logger: cfg.Logger,
		Msg: "rabbitmq: dropped a message header that RabbitMQ acts on (CC, BCC or an x- name) or that the forwarder sets (oncommit-key, cloudEvents_ names); later drops of this name are logged at debug level"}
	return f, nil
}

// Header names of the envelope (see Config.CloudEvents).
const (
	// KeyHeader is the header of a message's key in plain mode.
	KeyHeader = "oncommit-key"
	// CloudEventsPrefix begins the name of each CloudEvents attribute's
	// header in CloudEvents mode.
	CloudEventsPrefix = "cloudEvents_"
)

// reserved reports whether a header of this name is one RabbitMQ acts on:
// the forwarder drops it from a message, Consume from a dead letter.
func reserved(name string) bool {
	return strings.EqualFold(name, "CC") || strings.EqualFold(name, "BCC") || fwd.HasPrefixFold(name, "x-")
}

// envelopeHeader reports whether a header of this name is one the
// forwarder sets (or one of the CloudEvents binding's, in its older
// spelling too): the forwarder drops it from a message's own headers.
func envelopeHeader(name string) bool {
	return strings.EqualFold(name, KeyHeader) || fwd.HasPrefixFold(name, CloudEventsPrefix) || fwd.HasPrefixFold(name, "cloudEvents:")
}

// publishing returns d's message: its payload and headers (but those
// dropped), in the envelope.
func (f *Forwarder) publishing(ctx context.Context, d *outbox.Delivery) amqp.Publishing {
	e := fwd.EnvelopeOf(d, f.cfg.Source)
	msg := amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		MessageId:    e.ID,
		ContentType:  e.ContentType,
		AppId:        e.Source,
		Type:         e.Type,
		Timestamp:    d.CreatedAt,
		Body:         d.Payload,
	}
	h := make(amqp.Table, len(d.Headers)+6)
	for k, v := range d.Headers {
		if f.headers.Keep(ctx, d, k) {
			h[k] = v
		}
	}
	switch {
	case f.cfg.CloudEvents:
		for _, a := range e.CloudEvents() {
			h[CloudEventsPrefix+a.Name] = a.Value
		}
	case e.Key != "":
		h[KeyHeader] = e.Key
	}
	if len(h) > 0 {
		msg.Headers = h
	}
	return msg
}

// Close closes the connection, waiting for the broker's answer at most
// Config.ConfirmTimeout. A batch after Close dials again.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.free = nil
	if f.conn == nil || f.conn.IsClosed() {
		return nil
	}
	err := f.conn.CloseDeadline(time.Now().Add(f.cfg.ConfirmTimeout))
	f.conn = nil
	return err
}

// take returns an idle channel, or opens one (and the connection when
// needed). One batch at a time opens; the others wait for it at most
// Config.ConfirmTimeout, or until ctx ends, and never under f.mu, so that
// a broker that does not answer holds up no batch longer than that (the
// one that dials waits at most the dial's own timeout).
func (f *Forwarder) take(ctx context.Context) (*channel, error) {
	if c := f.idle(); c != nil {
		return c, nil
	}
	timer := time.NewTimer(f.cfg.ConfirmTimeout)
	defer timer.Stop()
	select {
	case f.opening <- struct{}{}:
		defer func() { <-f.opening }()
	case <-timer.C:
		return nil, fmt.Errorf("rabbitmq: open channel: %w", ErrConfirmTimeout)
	case <-ctx.Done():
		return nil, fmt.Errorf("rabbitmq: open channel: %w", ctx.Err())
	}
	if c := f.idle(); c != nil { // given back while this batch waited
		return c, nil
	}
	f.mu.Lock()
	conn := f.conn
	f.mu.Unlock()
	if conn == nil {
		var err error
		if conn, err = f.cfg.Dial(f.url); err != nil {
			return nil, fmt.Errorf("rabbitmq: connect: %w", err)
		}
		f.mu.Lock()
		f.conn = conn
		f.dials++
		dials := f.dials
		f.mu.Unlock()
		if dials > 1 {
			f.cfg.Logger.Info("rabbitmq: reconnected", "dials", dials)
		}
	}
	return f.open(ctx, conn)
}

// idle returns an idle channel of the connection, or nil.
func (f *Forwarder) idle() *channel {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil && f.conn.IsClosed() {
		f.conn, f.free = nil, nil
	}
	for len(f.free) > 0 {
		c := f.free[len(f.free)-1]
		f.free = f.free[:len(f.free)-1]
		if !c.ch.IsClosed() && c.conn == f.conn {
			return c
		}
	}
	return nil
}

// open opens a channel of conn in confirm mode. amqp091 awaits the
// broker's answers to that without a timeout, and a stalled connection
// never sends them: when they do not come within Config.ConfirmTimeout, or
// ctx ends first, open closes the connection, which ends the wait (the
// next batch dials again).
func (f *Forwarder) open(ctx context.Context, conn *amqp.Connection) (*channel, error) {
	var (
		mu      sync.Mutex
		settled bool  // abandon ran
		cause   error // why conn was closed, if it was
	)
	abandon := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if !settled {
			settled, cause = true, err
			if err != nil {
				_ = conn.CloseDeadline(time.Now())
			}
		}
	}
	timer := time.AfterFunc(f.cfg.ConfirmTimeout, func() { abandon(ErrConfirmTimeout) })
	stop := context.AfterFunc(ctx, func() { abandon(ctx.Err()) })
	ch, err := conn.Channel()
	if err == nil {
		if err = ch.Confirm(false); err != nil {
			_ = ch.Close()
			err = fmt.Errorf("confirm mode: %w", err)
		}
	}
	timer.Stop()
	stop()
	abandon(nil) // after an abandon under way; none after this one
	if cause != nil {
		return nil, fmt.Errorf("rabbitmq: open channel: %w", cause)
	}
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	// Room for a return per unconfirmed publish: the library drops a
	// return it cannot hand over within 5 s, and a dropped return would
	// let an unroutable message pass for done.
	return &channel{ch: ch, conn: conn, returns: ch.NotifyReturn(make(chan amqp.Return, f.cfg.Window+1))}, nil
}

// give puts c back for the next batch, unless it closed meanwhile.
func (f *Forwarder) give(c *channel) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !c.ch.IsClosed() && c.conn == f.conn {
		f.free = append(f.free, c)
	}
}

// Handler returns the batch handler to register on a relay, for one topic
// or for all of them (outbox.AllTopics).
//
// It publishes the batch on a channel of its own in confirm mode, at most
// Config.Window publishes awaiting their confirm at once, each
// persistent (delivery mode 2) and mandatory, in the envelope of
// Config.CloudEvents (message-id = the message's id, type = its topic,
// timestamp = its creation time, ...) with its headers (but those below),
// and returns once every publish has its answer. A message is done only when the broker confirmed it and did not
// return it. A message returned as unroutable is retried (or dead with
// Config.DeadLetterUnroutable); a nack, a missing confirm after
// Config.ConfirmTimeout, a lost channel or connection (whose unconfirmed
// publishes are then all retried; the next batch connects again), and the
// relay's shutdown are retries.
//
// One batch at a time opens a channel (dialling the connection when it is
// down); the others wait for it at most Config.ConfirmTimeout, or until
// their context ends. A channel the broker does not open within
// Config.ConfirmTimeout (a stalled connection) fails the batch and closes
// the connection; the next batch dials again.
//
// Headers RabbitMQ acts on are dropped: CC and BCC (extra routing keys)
// and every name starting with "x-" (the broker's namespace, which it and
// its plugins read: x-delay, x-death, x-stream-filter-value, ...), in any
// case, so that message data cannot route, delay or otherwise steer the
// broker. A drop is logged on Config.Logger, at warning level the first
// time a name is dropped and at debug level after that. The x- rule also
// drops application headers written the HTTP way (X-Request-Id): give
// them names without the prefix. Headers the forwarder sets itself
// (oncommit-key, and cloudEvents_ or cloudEvents: names, in any case; see
// Config.CloudEvents) are dropped from the message's own headers in the
// same way, in both modes, so that message data cannot forge the
// envelope.
//
// Messages with a Key go out one at a time per key, as in natsfwd: the
// next one of a key is published after the previous one's confirm, and
// after a failure the key's later messages in the batch are retried
// without being published.
func (f *Forwarder) Handler() outbox.BatchHandler {
	return f.forward
}

func (f *Forwarder) forward(ctx context.Context, ds []outbox.Delivery) []error {
	c, err := f.take(ctx)
	if err != nil {
		out := make([]error, len(ds))
		for i := range out {
			out[i] = err
		}
		return out
	}
	defer f.give(c)
	returned := map[string]amqp.Return{}
	returns := c.returns // nil once closed (the channel was lost)
	got := func(r amqp.Return, ok bool) {
		if !ok {
			returns = nil
			return
		}
		returned[r.MessageId] = r
	}
	drain := func() {
		for returns != nil {
			select {
			case r, ok := <-returns:
				got(r, ok)
			default:
				return
			}
		}
	}
	defer drain() // the channel starts the next batch without returns
	return fwd.Batch(ctx, ds, f.cfg.Window, f.cfg.ConfirmTimeout, func(i int) (fwd.Wait, error) {
		d := &ds[i]
		key := f.cfg.RoutingKey(*d)
		msg := f.publishing(ctx, d)
		id := msg.MessageId
		dc, err := c.ch.PublishWithDeferredConfirm(f.cfg.Exchange, key, true, false, msg)
		if err != nil {
			return nil, fmt.Errorf("rabbitmq: publish to exchange %q, routing key %q: %w", f.cfg.Exchange, key, err)
		}
		return func(done <-chan struct{}, timeout <-chan time.Time) error {
			for {
				select {
				case r, ok := <-returns:
					got(r, ok)
					continue
				case <-dc.Done():
				case <-timeout:
					return fmt.Errorf("rabbitmq: publish to exchange %q, routing key %q: %w", f.cfg.Exchange, key, ErrConfirmTimeout)
				case <-done:
					return fmt.Errorf("rabbitmq: publish to exchange %q, routing key %q: %w", f.cfg.Exchange, key, ctx.Err())
				}
				break
			}
			// The broker sends a return before the confirm of the same
			// message, and the library hands it over before it reads
			// the confirm: it is in c.returns by now.
			drain()
			if r, ok := returned[id]; ok {
				err := &UnroutableError{Exchange: r.Exchange, RoutingKey: r.RoutingKey, Code: r.ReplyCode, Text: r.ReplyText}
				if f.cfg.DeadLetterUnroutable {
					return outbox.DeadLetter(err)
				}
				return err
			}
			if !dc.Acked() {
				return fmt.Errorf("rabbitmq: publish to exchange %q, routing key %q: %w", f.cfg.Exchange, key, ErrNacked)
			}
			return nil
		}, nil
	})
}

// defaultDial is Config.Dial's and ConsumeConfig.Dial's default: the
// library's dial with DefaultDialTimeout for the TCP connection.
func defaultDial(url string) (*amqp.Connection, error) {
	return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(DefaultDialTimeout)})
}
