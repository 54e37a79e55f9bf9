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

// MinLease is the shortest RelayConfig.Lease.
const MinLease = time.Second

// UnlimitedAttempts, as RelayConfig.MaxAttempts, retries a failing message
// until its handler succeeds or dead-letters it.
const UnlimitedAttempts = math.MaxInt32

// ListenMode says whether a relay listens for wake-up notifications
// (PostgreSQL LISTEN).
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
	// ErrRelayStarted is returned by Handle after Run, and by a second Run.
	ErrRelayStarted = errors.New("outbox: relay already started")
	// ErrDuplicateHandler is returned by Handle for a topic with a handler.
	ErrDuplicateHandler = errors.New("outbox: topic already has a handler")
	// ErrNoRelay is returned by [Outbox.Relay] when the dialect cannot relay.
	ErrNoRelay = errors.New("outbox: dialect has no relay support")
)

// RelayConfig configures a [Relay]. The zero value works.
type RelayConfig struct {
	// PollInterval is how often the relay looks for due messages when
	// nothing wakes it sooner. Defaults to the dialect's suggestion (100ms
	// on SQLite), else DefaultPollInterval (1s).
	PollInterval time.Duration

	// BatchSize is the most messages one claim takes, and so the most a
	// batch handler gets at once; with Config.OrderByKey, the most heads of
	// keys, whose runs add up to 4 x BatchSize messages (BatchSize with a
	// batch handler). Defaults to DefaultBatchSize (100).
	BatchSize int

	// Lease is how long a claimed message stays invisible to other relays;
	// the relay renews it while the handler runs. At least MinLease and,
	// with renewal, the dialect's minimum (15s on SQLite). Defaults to
	// DefaultLease (30s).
	Lease time.Duration

	// DisableLeaseRenewal stops the renewals: a handler running longer than
	// Lease is delivered again. Defaults to false.
	DisableLeaseRenewal bool

	// Concurrency is the most handlers running at once; a claim takes at
	// most the free slots. Defaults to DefaultConcurrency (200).
	Concurrency int

	// MaxAttempts is the number of attempts (claims: a crash counts) after
	// which a failing message is dead-lettered, at most UnlimitedAttempts.
	// Defaults to DefaultMaxAttempts (10).
	MaxAttempts int

	// RetryBase and RetryCap shape the backoff after a failure: attempt n
	// waits min(RetryCap, RetryBase * 2^(n-1)). Default to DefaultRetryBase
	// (1s) and DefaultRetryCap (10m).
	RetryBase time.Duration
	RetryCap  time.Duration

	// RetryJitter is the fraction of each backoff drawn at random, in
	// [0, 1]. Defaults (nil) to DefaultRetryJitter (1, full jitter).
	RetryJitter *float64

	// DiscardDead deletes messages instead of dead-lettering them (a
	// message read from the WAL transport's slot is not written into the
	// table when it dies). Defaults to false.
	DiscardDead bool

	// AsyncCommit commits the relay's claims and settles without waiting
	// for the log flush (PostgreSQL: synchronous_commit off per statement).
	// A database server crash loses those of its last moments: their
	// messages are delivered again, none is lost. Not with
	// Config.OrderByKey. Defaults to false.
	AsyncCommit bool

	// KeepDelivered keeps delivered messages this long instead of deleting
	// them (Forever: until purged by hand). Defaults to 0. Not with a
	// dialect that streams messages (PostgreSQL's WAL transport), which
	// writes no row for a delivered message.
	KeepDelivered time.Duration

	// JanitorEvery is how often the relay purges delivered messages older
	// than KeepDelivered and trims ordered delivery's key rows. Defaults to
	// DefaultJanitorEvery (1m).
	JanitorEvery time.Duration

	// Listen says whether the relay listens for wake-up notifications
	// (ListenOff behind PgBouncer in transaction mode). Defaults to
	// ListenAuto.
	Listen ListenMode

	// CommandTimeout bounds each statement of the relay (claim, settle,
	// renew, purge). Defaults to DefaultCommandTimeout (30s).
	CommandTimeout time.Duration

	// ShutdownGrace is how long Run, once its context ends, lets handlers
	// finish before cancelling them. Defaults to DefaultShutdownGrace (10s).
	ShutdownGrace time.Duration

	// UnhandledEvery is how often the relay looks (with [Outbox.Stats])
	// for due messages of topics it has no handler for, to log a warning;
	// Forever never. Defaults to DefaultUnhandledEvery (5m).
	UnhandledEvery time.Duration

	// DeadKeys is what a dead-lettered ordered message does to its key.
	// Defaults to HaltKey.
	DeadKeys DeadKeyPolicy

	// DeadKeysByTopic overrides DeadKeys for the dead messages of some
	// topics. Defaults to nil.
	DeadKeysByTopic map[string]DeadKeyPolicy

	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// Tracer, when set, sees each claim's and settle's rows (for tests;
	// telemetry uses Observer). Defaults to nil.
	Tracer RelayTracer

	// Observer, when set, is told what the relay does (the otel module
	// implements it). Defaults to nil.
	Observer RelayObserver

	// Middleware wraps every handler registered with Handle or HandleJSON,
	// not batch handlers; the first element is the outermost. Defaults to
	// none.
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
