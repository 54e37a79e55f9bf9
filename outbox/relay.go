package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"

	"github.com/oncommit/oncommit/internal/backoff"
)

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

	mu sync.Mutex
	// handlers and batches are the handlers by topic (AllTopics for the
	// catch-all), each topic in one of them; topics are the topics of
	// both, AllTopics left out, sorted; all is set when a catch-all is
	// registered. Written before Run only: read without mu after.
	handlers map[string]Handler
	batches  map[string]*batchHandler
	// subs are the subscribers' handlers by topic and subscriber
	// (fanout.go); their topics are in topics too.
	subs map[string]map[string]subscription
	// batchSubs is set when a subscriber has a batch handler.
	batchSubs bool
	topics    []string
	all       bool
	started   bool

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
	// backToBack is set while the claim loop is claiming again at once
	// (its last claim filled its limit and enough slots are free): the
	// next claim comes within about one claim's time and can carry the
	// successes, so the settler leaves them to it as when claims carry.
	// It is clear while the loop waits (for slots, a poll or a wake-up).
	backToBack atomic.Bool
	// claimDone and claimFences are the claim loop's buffers for the
	// successes a claim carries.
	claimDone   []queued
	claimFences []outboxdriver.Fence

	// ord is the state of ordered delivery (see ordered.go), nil unless
	// the Outbox has OrderByKey.
	ord *orderedRelay
	// stream is the reading of the dialect's message stream (stream.go),
	// nil when the dialect has none.
	stream *streamState
	// win is the claims' window (window.go).
	win claimWindow
	// horizonWarn, when not zero, replaces horizonWarnAfter (tests).
	horizonWarn time.Duration
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
	if cfg.AsyncCommit {
		switch {
		case !o.caps.AsyncCommit:
			return nil, fmt.Errorf("%w: the %s dialect cannot commit a relay's statements asynchronously (RelayConfig.AsyncCommit)", ErrUnsupported, o.d.Name())
		case o.cfg.OrderByKey:
			return nil, &ConfigError{Field: "AsyncCommit", Reason: "not with Config.OrderByKey: after a database crash a key's messages could be delivered again after later ones"}
		}
	}
	if _, ok := o.d.(outboxdriver.Streamer); ok && cfg.KeepDelivered > 0 {
		return nil, &ConfigError{Field: "KeepDelivered", Reason: "the " + o.d.Name() + " dialect's message stream (the WAL transport) writes no row for a delivered message, so there is none to keep; keep delivered messages with the table dialect"}
	}
	jitter := DefaultRetryJitter
	if cfg.RetryJitter != nil {
		jitter = *cfg.RetryJitter
	}
	r := &Relay{
		ob: o, d: rd, db: db, cfg: cfg, log: cfg.Logger,
		retry:    backoff.Policy{Base: cfg.RetryBase, Cap: cfg.RetryCap, Jitter: jitter},
		settleP:  outboxdriver.SettleParams{KeepDelivered: cfg.KeepDelivered > 0, DiscardDead: cfg.DiscardDead, AsyncCommit: cfg.AsyncCommit},
		handlers: map[string]Handler{},
		batches:  map[string]*batchHandler{},
		inflight: map[*claimBatch]struct{}{},
		wake:     make(chan struct{}, 1),
		stream:   newStream(rd),
	}
	if err := r.initOrdered(); err != nil {
		return nil, err
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

// Handle registers h for topic, or for every topic without a handler of
// its own with [AllTopics], before Run. A topic has at most one handler;
// the relay claims only topics with one, so other topics' messages wait.
// For a topic with subscribers (Config.Subscribers), h handles its
// messages stored without subscribers (published before the topic had
// them, or through an Outbox without them); the copies go to the
// subscribers' handlers ([Relay.Subscribe]).
// It returns a [*ConfigError] for a bad topic or a nil handler, or an error
// wrapping [ErrDuplicateHandler], [ErrRelayStarted] or [ErrUnsupported].
func (r *Relay) Handle(topic string, h Handler) error {
	if err := r.checkTopic(topic); err != nil {
		return err
	}
	if h == nil {
		return &ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	h, err := r.wrapHandler(h)
	if err != nil {
		return err
	}
	return r.addHandler(topic, func() { r.handlers[topic] = h })
}

// HandleBatch registers h for topic as [Relay.Handle] does: h gets the
// messages of each claim for it at once (at most RelayConfig.BatchSize, in
// claim order), each then treated as with a [Handler]. The batch's context
// is cancelled when any of its leases is lost or the shutdown grace ends.
//
// With Config.OrderByKey, a batch holds each key's messages in key order,
// and a key's messages after its first failure are not settled whatever h
// returned (OutcomeHeld): h must not act on them.
func (r *Relay) HandleBatch(topic string, h BatchHandler) error {
	if err := r.checkTopic(topic); err != nil {
		return err
	}
	if h == nil {
		return &ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	return r.addHandler(topic, func() { r.batches[topic] = &batchHandler{h: h} })
}

// checkTopic checks the topic of a registration.
func (r *Relay) checkTopic(topic string) error {
	if err := checkText(0, "Topic", topic, MaxTopicBytes, true); err != nil {
		return &ConfigError{Field: "topic", Reason: err.(*MessageError).Reason}
	}
	if topic == AllTopics && !r.ob.caps.AllTopics {
		return fmt.Errorf("%w: the %s dialect cannot claim every topic (AllTopics)", ErrUnsupported, r.ob.d.Name())
	}
	return nil
}

// addHandler records a handler for topic with add, under r.mu.
func (r *Relay) addHandler(topic string, add func()) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return ErrRelayStarted
	}
	_, dup := r.handlers[topic]
	if _, ok := r.batches[topic]; dup || ok {
		return fmt.Errorf("%w: %q", ErrDuplicateHandler, topic)
	}
	add()
	if topic == AllTopics {
		r.all = true
		return nil
	}
	r.addTopic(topic)
	return nil
}

// addTopic adds topic to the claimed topics, once (under r.mu).
func (r *Relay) addTopic(topic string) {
	if i, found := slices.BinarySearch(r.topics, topic); !found {
		r.topics = slices.Insert(r.topics, i, topic)
	}
}

// Run claims and handles messages until ctx ends, then lets running
// handlers finish within RelayConfig.ShutdownGrace, cancels the rest,
// writes the outcomes it has and returns nil. Database errors are logged
// and retried; Run fails only when it cannot start (no handlers, already
// started, [ErrTableMissing], [ErrSchemaMismatch], or [ErrStreamUnusable]
// for a dialect's message stream that cannot work). With a message stream
// (postgres.WALDialect) Run also reads it, when no other relay does.
func (r *Relay) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.started {
		r.mu.Unlock()
		return ErrRelayStarted
	}
	if len(r.handlers)+len(r.batches)+len(r.subs) == 0 {
		r.mu.Unlock()
		return ErrNoHandlers
	}
	if err := r.checkSubscribed(); err != nil {
		r.mu.Unlock()
		return err
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
	if err := r.openStream(ctx); err != nil {
		return err
	}
	if r.pollOnly != nil {
		r.log.Debug("outbox: relay polls only", "reason", r.pollOnly, "poll_interval", r.cfg.PollInterval)
	}

	// Handlers' contexts carry ctx's values but outlive it by the grace
	// period: each is cancelled on its own, by cancelHandlers at the end of
	// the grace period or when its lease is lost. They are not children of
	// one shared cancellable context: registering with it took every
	// delivery a lock on that one context, a seventh of the relay's CPU.
	handlersCtx := detachedValues(ctx)
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
	if r.janitorRuns() {
		startBG(r.janitorLoop)
	}
	if r.cfg.UnhandledEvery != Forever && !r.all { // a catch-all handles every topic
		startBG(r.unhandledLoop)
	}
	if cr, ok := r.d.(outboxdriver.CleanupReader); ok {
		startBG(func(ctx context.Context) { r.cleanupLoop(ctx, cr) })
	}
	if wc, ok := r.d.(outboxdriver.WindowedClaimer); ok && r.ord == nil {
		r.win.wc, r.win.kick = wc, make(chan struct{}, 1)
		startBG(r.probeLoop)
	}
	stopSettler := make(chan struct{})
	go r.settleLoop(context.WithoutCancel(ctx), stopSettler)

	stopRuns := r.startRuns(ctx)

	if r.stream != nil {
		go r.streamLoop(ctx, handlersCtx)
	}
	var workers sync.WaitGroup
	runErr := r.claimLoop(ctx, handlersCtx, &workers, checked)
	r.health.set(func(h *Health) { h.Draining = true })

	// Shutdown: wait for the running handlers within the grace period.
	drained := make(chan struct{})
	go func() {
		workers.Wait()
		if r.stream != nil {
			<-r.stream.done
		}
		close(drained)
	}()
	grace := time.NewTimer(r.cfg.ShutdownGrace)
	select {
	case <-drained:
		grace.Stop()
	case <-grace.C:
		r.log.Warn("outbox: shutdown grace period over; cancelling running handlers", "grace", r.cfg.ShutdownGrace, "count", r.inflightCount())
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
	stopRuns()
	return runErr
}

// check runs the dialect's Check. It returns an error for a table that is
// missing or lacks columns, and whether the check could tell.
func (r *Relay) check(ctx context.Context) (checked bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	err = r.d.Check(cctx, r.db, r.ob.table)
	if err == nil {
		err = r.checkOrdered(cctx)
	}
	if err == nil {
		err = r.ob.checkSubscribers(cctx, r.db)
	}
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
	r.cancelStreamHandlers()
	r.inflightMu.Lock()
	defer r.inflightMu.Unlock()
	r.handlersCancelled = true
	for b := range r.inflight {
		for i := range b.jobs {
			b.jobs[i].ctx.cancel()
		}
	}
}

// detachedValues is context.WithoutCancel(ctx) under a value of its own.
// The value is not for its own sake: a Value call on a WithoutCancel
// context boxes it, an allocation and some 60 ns for every lookup (a
// tracer looks up the current span several times per delivery); under a
// value context the lookup walks through it without that.
func detachedValues(ctx context.Context) context.Context {
	return context.WithValue(context.WithoutCancel(ctx), detachedKey{}, true)
}

type detachedKey struct{}
