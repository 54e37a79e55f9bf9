package outbox

import (
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
	DefaultUnhandledEvery = 5 * time.Minute
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
	// The relay renews it while the handler runs (every Lease/6 once a
	// third has passed), so only a relay that stops loses it. At least
	// MinLease and, while leases are renewed, the dialect's minimum (15s on
	// SQLite): Relay refuses a shorter one with a [*ConfigError]. Defaults
	// to DefaultLease (30s).
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
	// waiting for the database's log flush (PostgreSQL: synchronous_commit
	// off inside each of these statements only; docs/operations.md has its
	// figures). Only a crash of the database server itself costs anything:
	// the claims and settles of its last moments are lost, so a message
	// settled then is delivered again and one claimed then may be claimed
	// again while its handler runs. No message is lost; publishes are not
	// affected. Not with Config.OrderByKey, nor on dialects whose
	// Capabilities lack AsyncCommit (Relay returns an error). Defaults to
	// false.
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

	// UnhandledEvery is how often the relay warns about due messages of
	// topics it has no handler for, waiting over a minute (one
	// [Outbox.Stats], which scans the table; at most once an hour per
	// topic). Forever turns it off; a catch-all relay never looks.
	// Defaults to DefaultUnhandledEvery (5m).
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

// RelayTracer is [outboxdriver.RelayTracer], for RelayConfig.Tracer.
type RelayTracer = outboxdriver.RelayTracer

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
