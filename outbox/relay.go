package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"

	"github.com/oncommit/oncommit/internal/backoff"
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

	// BatchSize is the most messages one claim takes. Defaults to
	// DefaultBatchSize (100).
	BatchSize int

	// Lease is how long a claimed message stays invisible to other relays.
	// While its handler runs, the relay renews the lease every Lease/6 once
	// a third of it has passed (so a renewal always lands by half the
	// lease), so only a relay that stops (crash, partition) loses it.
	// Defaults to DefaultLease (30s).
	Lease time.Duration

	// DisableLeaseRenewal stops the renewals: a handler running longer than
	// Lease is then delivered again by another claim. Defaults to false.
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

	// KeepDelivered keeps delivered messages (state delivered) instead of
	// deleting them, for this long: a janitor in the relay purges older
	// ones every JanitorEvery. Forever keeps them until purged by hand.
	// Defaults to 0: delete on success.
	KeepDelivered time.Duration

	// JanitorEvery is how often the janitor purges delivered messages older
	// than KeepDelivered. Defaults to DefaultJanitorEvery (1m).
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
	// ten poll intervals), at most once an hour per topic. It also looks
	// once when Run starts. Forever turns it off. Defaults to
	// DefaultUnhandledEvery (5m).
	UnhandledEvery time.Duration

	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// Tracer, when set, is told about each claim and settle.
	Tracer RelayTracer
}

// RelayTracer observes a relay. Its methods are called from the relay's
// goroutines and must not block.
type RelayTracer interface {
	// TraceClaim is called after each claim with the rows it took.
	TraceClaim(ctx context.Context, claimed []outboxdriver.Claimed, err error)
	// TraceSettle is called after each settle statement with the
	// settlements it wrote and the fences that applied (a settlement whose
	// fence is missing was fenced off: another claim had taken the row).
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
	if c.Lease < time.Second {
		return &ConfigError{Field: "Lease", Reason: "must be at least 1s"}
	}
	if c.RetryCap < c.RetryBase {
		return &ConfigError{Field: "RetryCap", Reason: "must not be less than RetryBase"}
	}
	if c.RetryJitter != nil && !(*c.RetryJitter >= 0 && *c.RetryJitter <= 1) {
		return &ConfigError{Field: "RetryJitter", Reason: "must be in [0, 1]"}
	}
	if c.Listen < ListenAuto || c.Listen > ListenOff {
		return &ConfigError{Field: "Listen", Reason: "unknown mode"}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Relay claims due messages and runs their handlers. Build it with
// [Outbox.Relay], register handlers with [Relay.Handle] or [HandleJSON],
// then call [Relay.Run]. Every replica may run one: claims never overlap.
type Relay struct {
	ob     *Outbox
	d      outboxdriver.RelayDialect
	db     DB
	cfg    RelayConfig
	retry  backoff.Policy
	log    *slog.Logger
	listen outboxdriver.Listener // nil when polling only
	// pollOnly says why the relay cannot listen with ListenAuto
	// (logged once when Run starts), nil otherwise.
	pollOnly error
	health   health
	settleP  outboxdriver.SettleParams

	mu       sync.Mutex
	handlers map[string]Handler // written before Run only: read without mu after
	topics   []string
	started  bool

	inflightMu sync.Mutex
	inflight   map[*claimBatch]struct{} // claims with handlers still running (see dispatch.go)
	inflightN  atomic.Int64             // handlers registered and not finished
	// handlersCancelled is set when the grace period is over: a message
	// registered after that gets an already cancelled context.
	handlersCancelled bool

	wake chan struct{} // a notification, a freed slot, a reconnect
	// followUp is the largest follow-up step asked by the notifications
	// (of coalescing publishers, see Config.NotifyInterval) received
	// since the claim loop last looked, in nanoseconds: the claim loop
	// then follows up (see nextFollowUp).
	followUp atomic.Int64

	// out holds the handlers' outcomes until they are written (see
	// settler.go).
	out outcomes
	// carried is when a claim last carried successes (unix nanoseconds):
	// while claims keep coming, the settler leaves successes to them.
	carried atomic.Int64
	// claimDone and claimFences are the claim loop's buffers for the
	// successes a claim carries.
	claimDone   []queued
	claimFences []outboxdriver.Fence
}

// Relay returns a relay that delivers this Outbox's messages from db.
func (o *Outbox) Relay(db DB, cfg RelayConfig) (*Relay, error) {
	rd, ok := o.d.(outboxdriver.RelayDialect)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoRelay, o.d.Name())
	}
	if db == nil {
		return nil, &ConfigError{Field: "DB", Reason: "must not be nil"}
	}
	if err := cfg.validate(o.caps); err != nil {
		return nil, err
	}
	jitter := DefaultRetryJitter
	if cfg.RetryJitter != nil {
		jitter = *cfg.RetryJitter
	}
	r := &Relay{
		ob: o, d: rd, db: db, cfg: cfg, log: cfg.Logger,
		retry:    backoff.Policy{Base: cfg.RetryBase, Cap: cfg.RetryCap, Jitter: jitter},
		settleP:  outboxdriver.SettleParams{KeepDelivered: cfg.KeepDelivered > 0, DiscardDead: cfg.DiscardDead},
		handlers: map[string]Handler{},
		inflight: map[*claimBatch]struct{}{},
		wake:     make(chan struct{}, 1),
	}
	if cfg.Listen != ListenOff {
		l, ok := db.(outboxdriver.Listener)
		var why error
		switch {
		case rd.ListenSQL(o.table) == "":
			why = fmt.Errorf("%w: the %s dialect has no notifications", ErrUnsupported, o.d.Name())
		case !ok:
			why = fmt.Errorf("%w: %T cannot listen for notifications", ErrUnsupported, db)
		default:
			why = l.CanListen()
		}
		switch {
		case why == nil:
			r.listen = l
		case !errors.Is(why, ErrUnsupported):
			return nil, why
		case cfg.Listen == ListenOn:
			return nil, fmt.Errorf("%w (RelayConfig.Listen is ListenOn; ListenAuto polls instead)", why)
		default:
			r.pollOnly = why
		}
	}
	return r, nil
}

// Handle registers h for topic. Each topic has at most one handler; only
// topics with a handler are claimed, so messages of other topics wait
// (which keeps rolling deploys safe). Register before Run.
func (r *Relay) Handle(topic string, h Handler) error {
	if err := checkText(0, "Topic", topic, MaxTopicBytes, true); err != nil {
		return &ConfigError{Field: "topic", Reason: err.(*MessageError).Reason}
	}
	if h == nil {
		return &ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return ErrRelayStarted
	}
	if _, dup := r.handlers[topic]; dup {
		return fmt.Errorf("%w: %q", ErrDuplicateHandler, topic)
	}
	r.handlers[topic] = h
	r.topics = append(r.topics, topic)
	sort.Strings(r.topics)
	return nil
}

// Run claims and handles messages until ctx ends, then stops claiming (a
// claim already sent may finish, for up to a second, and its messages are
// handled), lets running handlers finish within
// RelayConfig.ShutdownGrace, cancels the rest
// (their leases lapse and another claim delivers them again), writes the
// outcomes it has and returns nil. Errors talking to the database are
// logged and retried with backoff, never returned. Run returns an error
// only when it cannot start: no handlers, already started, or an outbox
// table that does not exist ([ErrTableMissing]) or lacks columns
// ([ErrSchemaMismatch]). It checks the table before its first claim (when
// the database cannot be reached then, before the first claim that
// succeeds). [Relay.Health] reports how it is doing meanwhile.
func (r *Relay) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.started {
		r.mu.Unlock()
		return ErrRelayStarted
	}
	if len(r.handlers) == 0 {
		r.mu.Unlock()
		return ErrNoHandlers
	}
	r.started = true
	r.health.set(func(h *Health) { *h = Health{Running: true} })
	r.out.init()
	r.mu.Unlock()
	defer r.health.set(func(h *Health) { h.Running, h.Draining, h.Listener = false, false, ListenerOff })

	// A missing table or an old schema fails Run at once; an unreachable
	// database does not (the claims retry with backoff, and check again).
	checked, err := r.check(ctx)
	if err != nil {
		return err
	}
	if r.pollOnly != nil {
		r.log.Info("outbox: relay polls only", "reason", r.pollOnly, "poll_interval", r.cfg.PollInterval)
	}

	// Handlers' contexts carry ctx's values but outlive it by the grace
	// period: each is cancelled on its own, by cancelHandlers at the end of
	// the grace period or when its lease is lost. They are not children of
	// one shared cancellable context: registering with it took every
	// delivery a lock on that one context, a seventh of the relay's CPU.
	handlersCtx := context.WithoutCancel(ctx)
	defer r.cancelHandlers()
	// The listener, renewer and janitor run until the handlers are done:
	// leases must keep being renewed during the grace period.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var bgWG sync.WaitGroup
	startBG := func(f func(context.Context)) {
		bgWG.Add(1)
		go func() { defer bgWG.Done(); f(bg) }()
	}
	if r.listen != nil {
		startBG(r.listenLoop)
	}
	if !r.cfg.DisableLeaseRenewal {
		startBG(r.renewLoop)
	}
	if r.cfg.KeepDelivered > 0 && r.cfg.KeepDelivered != Forever {
		startBG(r.janitorLoop)
	}
	if r.cfg.UnhandledEvery != Forever {
		startBG(r.unhandledLoop)
	}
	stopSettler := make(chan struct{})
	go r.settleLoop(context.WithoutCancel(ctx), stopSettler)

	var workers sync.WaitGroup
	runErr := r.claimLoop(ctx, handlersCtx, &workers, checked)
	r.health.set(func(h *Health) { h.Draining = true })

	// Shutdown: wait for the running handlers within the grace period.
	drained := make(chan struct{})
	go func() { workers.Wait(); close(drained) }()
	grace := time.NewTimer(r.cfg.ShutdownGrace)
	select {
	case <-drained:
		grace.Stop()
	case <-grace.C:
		r.log.Warn("outbox: shutdown grace period over; cancelling running handlers", "grace", r.cfg.ShutdownGrace)
		r.cancelHandlers()
		// Give cancelled handlers a moment to return and report.
		select {
		case <-drained:
		case <-time.After(100 * time.Millisecond):
		}
	}
	stopBG()
	bgWG.Wait()
	close(stopSettler)
	<-r.out.stopped
	return runErr
}

// check runs the dialect's Check. It returns an error for a table that is
// missing or lacks columns, and whether the check could tell.
func (r *Relay) check(ctx context.Context) (checked bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	err = r.d.Check(cctx, r.db, r.ob.table)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrTableMissing) || errors.Is(err, ErrSchemaMismatch):
		return true, wrapOp(cctx, "relay", fmt.Errorf("%w (table %s)", err, r.ob.table))
	}
	if ctx.Err() == nil {
		r.log.Warn("outbox: cannot check the outbox table yet; claiming with backoff", "err", wrapOp(cctx, "check", err))
	}
	return false, nil
}

// cancelHandlers cancels the contexts of the running handlers, and of any
// that start after.
func (r *Relay) cancelHandlers() {
	r.inflightMu.Lock()
	defer r.inflightMu.Unlock()
	r.handlersCancelled = true
	for b := range r.inflight {
		for i := range b.jobs {
			b.jobs[i].ctx.cancel()
		}
	}
}

// claimLoop claims and dispatches until ctx ends.
//
// It claims when the poll timer fires, when a notification arrives, and
// right after a claim that filled its limit (more may be due). A claim
// takes at most the free handler slots; after a full claim it waits until
// enough slots are free (see threshold), so a busy relay claims in batches
// rather than one row per finished handler.
//
// While claims fail, it waits out the backoff whatever wakes it
// (notification, reconnect, freed slot): a sick database gets a few claims
// a second at most, not one per wake-up. Until the table has been checked
// (see check), a failed claim checks it again, and a missing table ends
// the loop with that error.
func (r *Relay) claimLoop(ctx, handlersCtx context.Context, workers *sync.WaitGroup, checked bool) error {
	sl := &slots{freed: make(chan struct{}, 1)}
	free := func() int { return r.cfg.Concurrency - int(sl.running.Load()) }
	// After a full claim, claim again once this many slots are free: a whole
	// batch when the slots hold two batches (one runs while the next is
	// claimed), else half of what fits.
	threshold := max(1, min(r.cfg.BatchSize, r.cfg.Concurrency)/2)
	if r.cfg.Concurrency >= 2*r.cfg.BatchSize {
		threshold = r.cfg.BatchSize
	}
	// The handler whose end frees the threshold-th slot signals freed:
	// the loop waits on freed only for that.
	sl.signalAt = int64(r.cfg.Concurrency - threshold)
	// Handler goroutines take claimed messages from queue.
	var queue *handlerQueue
	queue = newHandlerQueue(func() { go r.work(queue, workers, sl) })
	defer queue.close()
	var dispatch []*job
	lastDispatch := time.Now()
	poll := time.NewTimer(0)
	defer poll.Stop()
	failures := 0
	var retryAt time.Time   // while claims fail: no claim before this
	full := false           // the last claim filled its limit: more may be due
	var trail time.Duration // the follow-up step in force, 0 for none
	var woke time.Time      // with trail: when the relay was woken, or a follow-up last found messages
	for {
		if !full || free() < threshold {
			select {
			case <-ctx.Done():
				return nil
			case <-poll.C:
				resetTimer(poll, r.cfg.PollInterval)
			case <-r.wake:
			case <-sl.freed:
				if !full || free() < threshold {
					continue
				}
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if failures > 0 && time.Now().Before(retryAt) {
			continue // backing off: the poll timer fires at retryAt
		}
		nfree := free()
		if nfree == 0 {
			continue // all slots busy: wait for the next poll or wake-up
		}
		limit := min(nfree, r.cfg.BatchSize)
		claimed, err := r.claimFinishing(ctx, limit)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.health.claimed(err)
			if !checked {
				var cerr error
				if checked, cerr = r.check(ctx); cerr != nil {
					return cerr
				}
			}
			failures++
			wait := claimRetry(r.cfg.PollInterval).Delay(failures)
			r.log.Error("outbox: claim failed", "err", err, "retry_in", wait, "failures", failures)
			full = false
			retryAt = time.Now().Add(wait)
			resetTimer(poll, wait)
			continue
		}
		r.health.claimed(nil)
		checked = true
		failures = 0
		for i := range claimed {
			if c := &claimed[i]; c.Dead {
				r.log.Warn("outbox: message dead-lettered at claim: max attempts reached", "id", c.ID, "topic", c.Topic, "attempts", c.Attempts-c.AttemptsBase)
				if r.cfg.DiscardDead {
					r.send(queued{outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}, Kind: outboxdriver.SettleDead, Error: "max attempts reached"}, time.Now().Add(r.cfg.Lease)})
				}
			}
		}
		if dispatch = r.register(handlersCtx, claimed, dispatch[:0]); len(dispatch) > 0 {
			sl.running.Add(int64(len(dispatch)))
			workers.Add(len(dispatch))
			queue.push(dispatch)
			clear(dispatch)
			lastDispatch = time.Now()
		}
		full = len(claimed) == limit
		if len(claimed) == 0 && time.Since(lastDispatch) > workerIdle {
			queue.retire()
		}
		if !full {
			// A coalescing publisher's notification asks for follow-up
			// claims: publishes it made silent commit later, some as
			// late as their transactions last. Follow up at short
			// intervals that grow with the time since the wake-up (or
			// since a follow-up last found messages), back to the poll
			// interval (see nextFollowUp).
			now := time.Now()
			if d := time.Duration(r.followUp.Swap(0)); d > 0 {
				trail, woke = d, now
			} else if trail > 0 && len(claimed) > 0 {
				woke = now
			}
			next := r.cfg.PollInterval
			if trail > 0 {
				var hot bool
				if next, hot = nextFollowUp(trail, now.Sub(woke), r.cfg.PollInterval); !hot {
					trail = 0
				}
			}
			resetTimer(poll, next)
		}
	}
}

// claimRetry is the backoff after failed claims: from 100 ms up to the poll
// interval or 10 s, whichever is longer.
func claimRetry(poll time.Duration) backoff.Policy {
	return backoff.Policy{Base: 100 * time.Millisecond, Cap: max(poll, 10*time.Second), Jitter: 0.5}
}

// claimFinishing claims like claim, but a claim in flight when ctx ends
// may still finish, for up to min(ShutdownGrace, 1s): cancelling it
// mid-statement makes the driver tear its connection down (pgx sends the
// server a cancel request), and the last settle at shutdown then waits for
// the cancelled statement's row locks. The rows it claims are handled
// within the grace period like those of earlier claims.
func (r *Relay) claimFinishing(ctx context.Context, limit int) ([]outboxdriver.Claimed, error) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(min(r.cfg.ShutdownGrace, time.Second), cancel) })
	defer stop()
	return r.claim(cctx, limit)
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	select {
	case <-t.C:
	default:
	}
	t.Reset(d)
}

// notified records a notification's follow-up request, if any, and wakes
// the claim loop.
func (r *Relay) notified(payload string) {
	if d := int64(min(followUp(payload), r.cfg.PollInterval)); d > 0 {
		for {
			cur := r.followUp.Load()
			if cur >= d || r.followUp.CompareAndSwap(cur, d) {
				break
			}
		}
	}
	r.signal()
}

// signal wakes the claim loop without blocking.
func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Relay) claim(ctx context.Context, limit int) ([]outboxdriver.Claimed, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	// Only the claim loop claims: the buffers are reused from claim to
	// claim (the dialect does not keep ClaimParams.Done).
	done := r.out.takeDoneInto(r.claimDone[:0], maxSettleBatch)
	r.claimDone = done
	if len(done) > 0 {
		r.carried.Store(time.Now().UnixNano())
	}
	fences := r.claimFences[:0]
	for i := range done {
		fences = append(fences, done[i].Fence)
	}
	r.claimFences = fences
	claimed, applied, err := r.d.Claim(ctx, r.db, r.ob.table, outboxdriver.ClaimParams{
		Topics: r.topics, Limit: limit, Lease: r.cfg.Lease, MaxAttempts: r.cfg.MaxAttempts,
		Done: fences, KeepDelivered: r.settleP.KeepDelivered,
	})
	if err != nil {
		err = wrapOp(ctx, "claim", r.d.Classify(err))
		if len(done) > 0 {
			r.putBack(done) // nothing of the statement was committed
		}
	} else if len(done) > 0 {
		var batch []outboxdriver.Settlement
		if r.cfg.Tracer != nil {
			batch = settlements(done)
		}
		r.report(ctx, len(done), batch, applied, nil)
	}
	clear(done) // no error strings kept until the next claim
	if r.cfg.Tracer != nil {
		r.cfg.Tracer.TraceClaim(ctx, claimed, err)
	}
	return claimed, err
}

// workerIdle is how long a relay dispatches nothing before its idle
// handler goroutines exit.
const workerIdle = 5 * time.Second

// work delivers the messages of queue until it yields nil (the claim loop
// has stopped, or the relay has been idle a while). Reusing goroutines
// saves starting one per message and growing its stack again each time.
func (r *Relay) work(queue *handlerQueue, workers *sync.WaitGroup, sl *slots) {
	for j := queue.next(false); j != nil; j = queue.next(true) {
		r.workOne(j, workers, sl)
	}
}

// register makes one batch of the claimed messages (but dead-lettered
// ones), each with its handler's context carrying ctx's values, records
// it in r.inflight, and appends its jobs to dispatch: once per claim,
// under one lock, rather than once per message from each handler
// goroutine.
func (r *Relay) register(ctx context.Context, claimed []outboxdriver.Claimed, dispatch []*job) []*job {
	n := 0
	for i := range claimed {
		if !claimed[i].Dead {
			n++
		}
	}
	if n == 0 {
		return dispatch
	}
	b := &claimBatch{jobs: make([]job, n), claimed: time.Now()}
	b.left.Store(int64(n))
	k := 0
	for i := range claimed {
		if c := &claimed[i]; !c.Dead {
			j := &b.jobs[k]
			j.c, j.b, j.ctx.parent = c, b, ctx
			dispatch = append(dispatch, j)
			k++
		}
	}
	r.inflightN.Add(int64(n))
	r.inflightMu.Lock()
	defer r.inflightMu.Unlock()
	r.inflight[b] = struct{}{}
	if r.handlersCancelled {
		for i := range b.jobs {
			b.jobs[i].ctx.cancel()
		}
	}
	return dispatch
}

// finished records that j's handler has returned, and forgets its batch
// once all of the batch's have.
func (r *Relay) finished(j *job) {
	j.ctx.cancel()
	j.ended.Store(true)
	r.inflightN.Add(-1)
	if j.b.left.Add(-1) == 0 {
		r.inflightMu.Lock()
		delete(r.inflight, j.b)
		r.inflightMu.Unlock()
	}
}

// inflightCount is the number of handlers registered and not finished.
func (r *Relay) inflightCount() int { return int(r.inflightN.Load()) }

// slots counts a relay's running handlers.
type slots struct {
	running  atomic.Int64
	freed    chan struct{} // signalled when running falls to signalAt
	signalAt int64
}

func (r *Relay) workOne(j *job, workers *sync.WaitGroup, sl *slots) {
	defer workers.Done()
	r.deliver(j)
	if sl.running.Add(-1) == sl.signalAt {
		select {
		case sl.freed <- struct{}{}:
		default:
		}
	}
}

// deliver runs the handler of one claimed message and queues its outcome.
func (r *Relay) deliver(j *job) {
	c := j.c
	h := r.handlers[c.Topic]
	defer r.finished(j)

	d := Delivery{ID: c.ID, Topic: c.Topic, Key: c.Key, Payload: c.Payload, Attempt: c.Attempts - c.AttemptsBase, CreatedAt: c.CreatedAt}
	var err error
	if len(c.Headers) > 0 {
		d.Headers, err = decodeHeaders(c.Headers)
	}
	if err == nil {
		err = r.call(&j.ctx, h, d)
	}
	r.send(queued{r.outcome(c, err), time.Now().Add(r.cfg.Lease)})
}

// decodeHeaders decodes a claimed message's headers; an error dead-letters
// the message. (Apart from deliver, so that only messages with headers pay
// for the map json.Unmarshal writes through a pointer: decoding into
// &d.Headers moved every Delivery to the heap.)
func decodeHeaders(b []byte) (map[string]string, error) {
	var h map[string]string
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, DeadLetter(fmt.Errorf("invalid headers: %w", err))
	}
	return h, nil
}

// call runs h, turning a panic into an error.
func (r *Relay) call(ctx context.Context, h Handler, d Delivery) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("outbox: handler panicked", "id", d.ID, "topic", d.Topic, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return h(ctx, d)
}

// outcome maps a handler's result to a settlement.
func (r *Relay) outcome(c *outboxdriver.Claimed, err error) outboxdriver.Settlement {
	s := outboxdriver.Settlement{Fence: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}}
	if err == nil {
		s.Kind = outboxdriver.SettleDone
		return s
	}
	return r.failure(c, s, err)
}

// failure is outcome for a handler that did not succeed (apart, so that a
// success allocates nothing for the error checks).
func (r *Relay) failure(c *outboxdriver.Claimed, s outboxdriver.Settlement, err error) outboxdriver.Settlement {
	attempt := c.Attempts - c.AttemptsBase // since the last redrive
	var retry *RetryError
	var cancel *DeadLetterError
	switch {
	case errors.As(err, &cancel):
		s.Kind, s.Error = outboxdriver.SettleDead, cleanError(err)
		r.log.Warn("outbox: message cancelled; dead-lettered", "id", c.ID, "topic", c.Topic, "attempt", attempt, "err", err)
		return s
	}
	s.Error = cleanError(err)
	if attempt >= r.cfg.MaxAttempts {
		s.Kind = outboxdriver.SettleDead
		r.log.Warn("outbox: message failed its last attempt; dead-lettered", "id", c.ID, "topic", c.Topic, "attempt", attempt, "err", err)
		return s
	}
	s.Kind = outboxdriver.SettleRetry
	if errors.As(err, &retry) {
		s.Delay, s.At = max(retry.After, 0), retryTime(retry.At)
	} else {
		s.Delay = r.retry.Delay(attempt)
	}
	r.log.Info("outbox: handler failed; retrying", "id", c.ID, "topic", c.Topic, "attempt", attempt, "retry_in", s.Delay, "err", err)
	return s
}

// retryTime clamps a handler's RetryAt time into the years every dialect's
// timestamp column stores (1970 to 9999, as for Message.NotBefore), in UTC:
// the one place where a far past or far future time is made storable.
func retryTime(t time.Time) time.Time {
	switch {
	case t.IsZero():
		return t
	case t.Before(earliest):
		return earliest
	case t.After(latest):
		return latest
	}
	return t.UTC()
}

// maxErrorBytes bounds the last_error recorded for a message.
const maxErrorBytes = 4096

// cleanError makes err's text storable in a text column: valid UTF-8, no
// NUL, at most maxErrorBytes.
func cleanError(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) > maxErrorBytes {
		s = strings.ToValidUTF8(s[:maxErrorBytes], "")
	}
	return s
}

// renewLoop extends, every sixth of the lease, the leases of the handlers
// claimed more than a third of the lease ago (each such handler is renewed
// at every tick, not once per third): a lease is renewed by the time half
// of it has passed, so a renewal that has to wait (a busy database, a
// SQLite write lock) still has half the lease to land.
func (r *Relay) renewLoop(ctx context.Context) {
	tick(ctx, r.cfg.Lease/6, func() {
		var held []outboxdriver.Fence
		cutoff := time.Now().Add(-r.cfg.Lease / 3)
		r.inflightMu.Lock()
		for b := range r.inflight {
			if !b.claimed.Before(cutoff) {
				continue
			}
			for i := range b.jobs {
				if j := &b.jobs[i]; !j.ended.Load() {
					held = append(held, outboxdriver.Fence{ID: j.c.ID, Attempts: j.c.Attempts})
				}
			}
		}
		r.inflightMu.Unlock()
		if len(held) == 0 {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
		kept, err := r.d.Renew(rctx, r.db, r.ob.table, r.cfg.Lease, held)
		if err != nil {
			err = wrapOp(rctx, "renew", r.d.Classify(err))
		}
		cancel()
		if err != nil {
			r.log.Error("outbox: lease renewal failed", "err", err, "count", len(held))
			return
		}
		if len(kept) < len(held) {
			still := make(map[outboxdriver.Fence]bool, len(kept))
			for _, f := range kept {
				still[f] = true
			}
			for _, f := range held {
				if still[f] {
					continue
				}
				r.log.Warn("outbox: lease lost: the message was claimed again; cancelling its handler, whose outcome will be fenced off", "id", f.ID, "attempt", f.Attempts)
				r.cancelHandler(f)
			}
		}
	})
}

// cancelHandler cancels the context of the handler of claim f, if it is
// running.
func (r *Relay) cancelHandler(f outboxdriver.Fence) {
	r.inflightMu.Lock()
	defer r.inflightMu.Unlock()
	for b := range r.inflight {
		for i := range b.jobs {
			if j := &b.jobs[i]; j.c.ID == f.ID && j.c.Attempts == f.Attempts {
				j.ctx.cancel()
			}
		}
	}
}

// janitorLoop purges delivered messages older than KeepDelivered.
func (r *Relay) janitorLoop(ctx context.Context) {
	tick(ctx, r.cfg.JanitorEvery, func() {
		jctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
		n, err := r.d.Purge(jctx, r.db, r.ob.table, []State{StateDelivered}, r.cfg.KeepDelivered)
		if err != nil {
			err = wrapOp(jctx, "purge", r.d.Classify(err))
		}
		cancel()
		switch {
		case err != nil && n > 0 && errors.Is(err, context.DeadlineExceeded):
			// The batches made progress; the next round goes on.
			r.log.Info("outbox: purged delivered messages until the command timeout; the next round continues", "count", n)
		case err != nil:
			r.log.Error("outbox: purging delivered messages failed", "err", err, "count", n)
		case n > 0:
			r.log.Debug("outbox: purged delivered messages", "count", n)
		}
	})
}

// tick calls f every d until ctx ends.
func tick(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}
