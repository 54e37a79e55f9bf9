package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// Defaults for [RelayConfig].
const (
	DefaultPollInterval   = time.Second
	DefaultBatchSize      = 100
	DefaultLease          = 30 * time.Second
	DefaultConcurrency    = 200
	DefaultMaxAttempts    = 10
	DefaultRetryBase      = time.Second
	DefaultRetryCap       = 10 * time.Minute
	DefaultRetryJitter    = 1.0
	DefaultCommandTimeout = 30 * time.Second
	DefaultShutdownGrace  = 10 * time.Second
	DefaultJanitorEvery   = time.Minute
)

// MinLease is the shortest RelayConfig.Lease on every dialect. A dialect
// may ask for more while leases are renewed (SQLite asks for 15s).
const MinLease = time.Second

// UnlimitedAttempts, as RelayConfig.MaxAttempts, never dead-letters a
// message for its number of attempts: it is retried (with backoff capped at
// RetryCap) until its handler succeeds or cancels it. It is the largest
// value the attempts column (a 32-bit integer on every dialect) holds.
const UnlimitedAttempts = math.MaxInt32

// ListenMode says whether a relay listens for wake-up notifications
// (PostgreSQL LISTEN), the other half of [NotifyMode].
type ListenMode int

const (
	// ListenAuto listens when the dialect and the DB adapter can (pgx,
	// native or stdlib, on PostgreSQL) and polls only otherwise.
	ListenAuto ListenMode = iota
	// ListenOn listens, and makes [Outbox.Relay] fail with ErrUnsupported
	// when the dialect or the driver cannot.
	ListenOn
	// ListenOff polls only.
	ListenOff
)

// Forever, as RelayConfig.KeepDelivered, keeps delivered messages until they
// are purged by hand.
const Forever time.Duration = math.MaxInt64

// Errors of the relay.
var (
	// ErrNoHandlers is returned by Run when no handler is registered.
	ErrNoHandlers = errors.New("outbox: relay has no handlers")
	// ErrRelayStarted is returned by Handle after Run has started, and by a
	// second call to Run.
	ErrRelayStarted = errors.New("outbox: relay already started")
	// ErrDuplicateHandler is returned by Handle for a topic that already
	// has a handler.
	ErrDuplicateHandler = errors.New("outbox: topic already has a handler")
	// ErrNoRelay is returned by [Outbox.Relay] when the dialect cannot relay.
	ErrNoRelay = errors.New("outbox: dialect has no relay support")
)

// RelayConfig configures a [Relay]. The zero value works.
type RelayConfig struct {
	// PollInterval is how often the relay looks for due messages when
	// nothing wakes it sooner. Polling is the source of truth; NOTIFY only
	// makes delivery faster. Defaults to the dialect's suggestion (100ms on
	// SQLite, which has no notifications), else DefaultPollInterval (1s).
	PollInterval time.Duration

	// BatchSize is the most messages one claim takes, and so the most a
	// batch handler (HandleBatch) gets at once. With Config.OrderByKey, it
	// is the most heads of keys one claim takes; their runs share up to
	// 4 x BatchSize more messages (BatchSize when the relay has a batch
	// handler). Defaults to DefaultBatchSize (100).
	BatchSize int

	// Lease is how long a claimed message stays invisible to other relays.
	// While its handler runs, the relay renews the lease every Lease/6 once
	// a third of it has passed (so a renewal is sent by half the lease),
	// so only a relay that stops (crash, partition) loses it. It is at
	// least MinLease (1s) and, while leases are renewed, at least the
	// dialect's minimum (15s on SQLite, whose renewals may wait for the
	// write lock up to the busy timeout; see its package documentation):
	// Relay refuses a shorter one with a [*ConfigError]. Defaults to
	// DefaultLease (30s).
	Lease time.Duration

	// DisableLeaseRenewal stops the renewals: a handler running longer than
	// Lease is then delivered again by another claim. With no renewal to
	// land in time, the dialect's minimum lease does not apply, only
	// MinLease. Defaults to false.
	DisableLeaseRenewal bool

	// Concurrency is the most handlers running at once. A claim takes at
	// most the free slots; with room for two batches, one batch runs while
	// the next is claimed, and claims stay whole batches. Defaults to
	// DefaultConcurrency (200).
	Concurrency int

	// MaxAttempts is the number of attempts after which a failing message is
	// dead-lettered (attempts count claims, so a crash counts), at most
	// UnlimitedAttempts, which retries forever. Defaults to
	// DefaultMaxAttempts (10).
	MaxAttempts int

	// RetryBase and RetryCap shape the backoff after a failure: attempt n
	// waits min(RetryCap, RetryBase * 2^(n-1)). Default to DefaultRetryBase
	// (1s) and DefaultRetryCap (10m).
	RetryBase time.Duration
	RetryCap  time.Duration

	// RetryJitter is the fraction of each backoff drawn at random, in
	// [0, 1]: 1 is full jitter, 0 none. Nil means the default; set it with
	// new(0.5). Defaults to DefaultRetryJitter (1, full jitter).
	RetryJitter *float64

	// DiscardDead deletes messages instead of dead-lettering them (state
	// dead). Defaults to false: dead messages stay for inspection and
	// redrive.
	DiscardDead bool

	// AsyncCommit makes the relay's claims and settles commit without
	// waiting for the database to flush its log to disk (PostgreSQL:
	// synchronous_commit off, set inside each of these statements for its
	// own transaction; the connection and every other statement keep the
	// server's setting). A claim's commit then costs no disk flush: on a
	// 2-core host a one-relay drain ran 1.3x faster and the median time
	// from a publish's commit to its handler fell by about a third
	// (docs/operations.md, Relays, has the run).
	//
	// What it costs, only if the database server itself crashes (or fails
	// over to a standby that had not received them): the claims and
	// settles of its last moments (up to about three wal_writer_delay, 0.6
	// s by default) are lost. Nothing is lost of the messages: their rows
	// come back as they were before those statements, so a message
	// settled in that window is delivered again, and one claimed in it may
	// be claimed again at once while its first handler still runs; its
	// attempt is not counted. Delivery stays at least once. A crash or
	// kill of the relay's process changes nothing: committed is committed.
	// Publishes are not affected (they commit in the caller's transaction).
	//
	// Not with Config.OrderByKey (a key's messages could be delivered again
	// after messages that follow them); not on dialects whose
	// Capabilities lack AsyncCommit (SQLite, MySQL/MariaDB): Relay returns
	// an error. Defaults to false.
	AsyncCommit bool

	// KeepDelivered keeps delivered messages (state delivered) instead of
	// deleting them, for this long: a janitor in the relay purges older
	// ones every JanitorEvery. Forever keeps them until purged by hand.
	// Defaults to 0: delete on success.
	KeepDelivered time.Duration

	// JanitorEvery is how often the janitor purges delivered messages older
	// than KeepDelivered and, with Config.OrderByKey on a dialect that
	// trims them (outboxdriver.KeyTrimmer), deletes the key rows of ordered
	// delivery no longer needed (see docs/internals.md). Defaults to
	// DefaultJanitorEvery (1m).
	JanitorEvery time.Duration

	// Listen says whether the relay listens for the wake-up notifications
	// publishes send. ListenAuto listens when the dialect and the DB adapter
	// can; ListenOn makes Relay fail when they cannot; ListenOff polls only
	// (set it behind PgBouncer in transaction pooling mode, where a LISTEN
	// hears nothing). Defaults to ListenAuto.
	Listen ListenMode

	// CommandTimeout bounds each statement of the relay (claim, settle,
	// renew, purge). Defaults to DefaultCommandTimeout (30s).
	CommandTimeout time.Duration

	// ShutdownGrace is how long Run, once its context ends, lets running
	// handlers finish before it cancels their contexts. Defaults to
	// DefaultShutdownGrace (10s).
	ShutdownGrace time.Duration

	// UnhandledEvery is how often the relay looks for due messages of
	// topics it has no handler for (one [Outbox.Stats] query, which scans
	// the table) and warns about those that have waited over a minute (or
	// ten poll intervals), at most once an hour per topic. The first look
	// is five seconds after Run starts. Forever turns it off; a relay with
	// a catch-all handler ([AllTopics]) never looks. Defaults to
	// DefaultUnhandledEvery (5m).
	UnhandledEvery time.Duration

	// DeadKeys is what a dead-lettered ordered message (Config.OrderByKey)
	// does to its key: HaltKey keeps it as the key's head, holding the
	// key's later messages until it is redriven or skipped; ContinueKey
	// lets the key go on. Defaults to HaltKey.
	DeadKeys DeadKeyPolicy

	// DeadKeysByTopic overrides DeadKeys for the dead messages of some
	// topics. Defaults to nil.
	DeadKeysByTopic map[string]DeadKeyPolicy

	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// Tracer, when set, is told about each claim and settle, with the
	// dialect's rows (tests and benchmarks use it; for telemetry, see
	// Observer).
	Tracer RelayTracer

	// Observer, when set, is told about claims, handler runs, writes of
	// outcomes, dead letters, lost leases and the listener's state (the
	// OpenTelemetry package implements it). Defaults to nil: nothing is
	// observed, at no cost.
	Observer RelayObserver

	// Middleware wraps every handler registered with Handle or HandleJSON,
	// once, at registration: the first element is the outermost. It does
	// not wrap batch handlers (HandleBatch): a Middleware has the shape of
	// one message's handler; Observer sees each message of a batch.
	// Defaults to none.
	Middleware []Middleware
}

// RelayTracer observes a relay. Its methods are called from the relay's
// goroutines and must not block.
type RelayTracer interface {
	// TraceClaim is called after each claim with the rows it took.
	TraceClaim(ctx context.Context, claimed []outboxdriver.Claimed, err error)
	// TraceSettle is called after each settle statement with the
	// settlements it wrote and the fences that applied (a settlement whose
	// fence is missing was fenced off: another claim had taken the row).
	// Each message has its own settlement and fence, the run of an ordered
	// head's included (Config.OrderByKey): a run member's Attempts are its
	// attempts after this delivery, and its fence applied when its head's
	// did.
	TraceSettle(ctx context.Context, s []outboxdriver.Settlement, applied []outboxdriver.Fence, err error)
}

func (c *RelayConfig) validate(caps outboxdriver.Capabilities) error {
	type check struct {
		field string
		bad   bool
	}
	for _, ch := range []check{
		{"PollInterval", c.PollInterval < 0}, {"BatchSize", c.BatchSize < 0}, {"Lease", c.Lease < 0},
		{"Concurrency", c.Concurrency < 0}, {"MaxAttempts", c.MaxAttempts < 0}, {"RetryBase", c.RetryBase < 0},
		{"RetryCap", c.RetryCap < 0}, {"KeepDelivered", c.KeepDelivered < 0}, {"JanitorEvery", c.JanitorEvery < 0},
		{"CommandTimeout", c.CommandTimeout < 0}, {"ShutdownGrace", c.ShutdownGrace < 0},
		{"UnhandledEvery", c.UnhandledEvery < 0},
	} {
		if ch.bad {
			return &ConfigError{Field: ch.field, Reason: "must not be negative"}
		}
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if caps.PollInterval > 0 {
		def(&c.PollInterval, caps.PollInterval)
	}
	def(&c.PollInterval, DefaultPollInterval)
	def(&c.Lease, DefaultLease)
	def(&c.RetryBase, DefaultRetryBase)
	def(&c.RetryCap, DefaultRetryCap)
	def(&c.JanitorEvery, DefaultJanitorEvery)
	def(&c.CommandTimeout, DefaultCommandTimeout)
	def(&c.ShutdownGrace, DefaultShutdownGrace)
	def(&c.UnhandledEvery, DefaultUnhandledEvery)
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxAttempts > UnlimitedAttempts {
		return &ConfigError{Field: "MaxAttempts", Reason: fmt.Sprintf("%d is more than the attempts column holds; at most UnlimitedAttempts (%d), which retries forever", c.MaxAttempts, UnlimitedAttempts)}
	}
	if err := c.validateLease(caps); err != nil {
		return err
	}
	if c.RetryCap < c.RetryBase {
		return &ConfigError{Field: "RetryCap", Reason: "must not be less than RetryBase"}
	}
	if c.RetryJitter != nil && !(*c.RetryJitter >= 0 && *c.RetryJitter <= 1) {
		return &ConfigError{Field: "RetryJitter", Reason: "must be in [0, 1]"}
	}
	if err := c.validateOrdered(); err != nil {
		return err
	}
	if c.Listen < ListenAuto || c.Listen > ListenOff {
		return &ConfigError{Field: "Listen", Reason: "unknown mode"}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// validateLease refuses a lease shorter than MinLease, or, while leases are
// renewed, than the dialect's Capabilities.MinLease.
func (c *RelayConfig) validateLease(caps outboxdriver.Capabilities) error {
	if c.Lease < MinLease {
		return &ConfigError{Field: "Lease", Reason: fmt.Sprintf("%v is less than MinLease (%v)", c.Lease, MinLease)}
	}
	if !c.DisableLeaseRenewal && c.Lease < caps.MinLease {
		return &ConfigError{Field: "Lease", Reason: fmt.Sprintf("%v is less than the dialect's minimum while leases are renewed (%v): a renewal kept waiting by the database could land after the lease lapsed, and another claim run the message beside its handler", c.Lease, caps.MinLease)}
	}
	return nil
}
