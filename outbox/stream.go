package outbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// This file holds the relay's reading of a dialect's message stream
// (outboxdriver.Streamer: PostgreSQL's WAL transport). One relay at a time
// reads a stream; the others wait to take it over. A message read runs
// its handler like a claimed one; a success writes nothing, a failure
// writes the message into the table with its outcome (the table's claims
// then retry it), and only then is it settled in the stream.

// ErrStreamUnusable: Run fails with an error wrapping it when its
// dialect's message stream cannot work until an operator acts (PostgreSQL's
// WAL transport: wal_level not logical, slot missing or lost, no
// replication allowed; the error wraps the dialect's own).
var ErrStreamUnusable = outboxdriver.ErrStreamUnusable

// streamWait is how long a relay waits before it tries again to open a
// stream another relay reads, or that failed.
const streamWait = time.Second

// streamState is the relay's stream, nil without one.
type streamState struct {
	s outboxdriver.Streamer
	// first is the stream Run opened before its first claim, nil when
	// another relay was reading it.
	first outboxdriver.Stream
	// cancel cancels the running handlers of stream messages (the end of
	// the shutdown grace period).
	mu     sync.Mutex
	cancel context.CancelFunc
	cur    outboxdriver.Stream
	done   chan struct{}
}

// newStream is the stream state of a relay of dialect d, nil when d has
// no stream; made with the relay, so that the pointer is never written
// while StreamLag may read it.
func newStream(d outboxdriver.RelayDialect) *streamState {
	s, ok := d.(outboxdriver.Streamer)
	if !ok {
		return nil
	}
	return &streamState{s: s, done: make(chan struct{})}
}

// openStream opens the dialect's stream at Run's start. A stream that
// cannot work (outboxdriver.ErrStreamUnusable) fails Run; one that another
// relay reads, or an error that may pass, leaves the relay to try again.
func (r *Relay) openStream(ctx context.Context) error {
	if r.stream == nil {
		return nil
	}
	octx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	st, err := r.stream.s.OpenStream(octx, r.ob.table)
	switch {
	case err == nil:
		r.stream.first = st
	case errors.Is(err, outboxdriver.ErrStreamUnusable):
		return err
	case errors.Is(err, outboxdriver.ErrStreamBusy):
		r.log.Info("outbox: another relay reads the message stream; this one claims from the table and stands by", "table", r.ob.table.String())
	default:
		r.log.Warn("outbox: cannot open the message stream; trying again", "err", err)
	}
	return nil
}

// streamLoop reads the stream until ctx ends, opening it again after an
// error or when another relay lets it go; handlers run with contexts from
// hctx. It closes r.stream.done once its handlers have returned and the
// stream is closed (Run's shutdown grace waits for it).
func (r *Relay) streamLoop(ctx, hctx context.Context) {
	defer close(r.stream.done)
	st := r.stream.first
	busyLogged := false
	for {
		if st == nil {
			octx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
			var err error
			st, err = r.stream.s.OpenStream(octx, r.ob.table)
			cancel()
			if err != nil {
				switch {
				case errors.Is(err, outboxdriver.ErrStreamBusy):
					if !busyLogged {
						r.log.Debug("outbox: the message stream is read by another relay; standing by", "err", err)
						busyLogged = true
					}
				case ctx.Err() == nil:
					r.log.Error("outbox: cannot open the message stream; messages wait in it", "err", err)
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(streamWait):
				}
				continue
			}
			r.log.Info("outbox: reading the message stream", "table", r.ob.table.String())
			busyLogged = false
		}
		err := r.readStream(ctx, hctx, st)
		if cerr := st.Close(ctx); cerr != nil && ctx.Err() == nil {
			r.log.Warn("outbox: closing the message stream", "err", cerr)
		}
		st = nil
		r.stream.mu.Lock()
		r.stream.cur = nil
		r.stream.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("outbox: the message stream failed; opening it again", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(streamWait):
		}
	}
}

// readStream delivers st's messages until ctx ends or st fails, then
// waits for the handlers it started.
func (r *Relay) readStream(ctx, hctx context.Context, st outboxdriver.Stream) error {
	sctx, cancel := context.WithCancel(hctx)
	defer cancel()
	r.stream.mu.Lock()
	r.stream.cur, r.stream.cancel = st, cancel
	r.stream.mu.Unlock()
	sem := make(chan struct{}, r.cfg.Concurrency)
	var mine sync.WaitGroup
	defer mine.Wait()
	for {
		msgs, err := st.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		// A slot per message: the stream's handlers have Concurrency slots
		// of their own, beside the claims'.
		for i := range msgs {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return nil // stopping: the rest is read again by the next reader
			}
			m := &msgs[i]
			mine.Add(1)
			go func() {
				defer mine.Done()
				defer func() { <-sem }()
				r.deliverStream(ctx, sctx, st, m)
			}()
		}
	}
}

// deliverStream runs m's handler and settles it: nothing to write on
// success, the table on failure (or when this relay has no handler for
// its topic).
func (r *Relay) deliverStream(ctx, hctx context.Context, st outboxdriver.Stream, m *outboxdriver.StreamMessage) {
	d := Delivery{ID: m.ID, Topic: m.Topic, Key: m.Key, Payload: m.Payload, Attempt: 1, CreatedAt: m.CreatedAt}
	c := &outboxdriver.Claimed{ID: m.ID, Topic: m.Topic, Attempts: 1}
	h := r.handlerOf(m.Topic)
	var s outboxdriver.Settlement
	var err error
	if len(m.Headers) > 0 {
		d.Headers, err = decodeHeaders(m.Headers)
	}
	switch {
	case err != nil:
		s = r.outcome(c, err)
	case h == nil:
		// A batch handler's topic, or one this relay has no handler for:
		// the table's claims take it.
		s = outboxdriver.Settlement{}
	default:
		start := time.Now()
		hc := hctx
		if r.cfg.Observer != nil {
			hc = r.cfg.Observer.HandlerStart(hctx, d)
		}
		err = r.call(hc, h, d)
		s = r.outcome(c, err)
		if r.cfg.Observer != nil {
			r.observeHandled(hc, &d, &s, start, true, err)
		}
	}
	if s.Kind != outboxdriver.SettleDone && !r.storeStream(ctx, m, s) {
		return // not settled: read again by the next reader
	}
	st.Settled(m)
}

// storeStream writes m into the table with outcome s, trying again while
// ctx lasts; it reports whether it was written.
func (r *Relay) storeStream(ctx context.Context, m *outboxdriver.StreamMessage, s outboxdriver.Settlement) bool {
	q, args := r.stream.s.StoreSQL(r.ob.table, m, s)
	for attempt := 1; ; attempt++ {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CommandTimeout)
		rows, err := r.db.QueryDB(wctx, q, args...)
		if err == nil {
			err = rows.Close()
		}
		cancel()
		if err == nil {
			return true
		}
		r.log.Warn("outbox: cannot write a stream message into the table; trying again", "message_id", m.ID, "topic", m.Topic, "attempt", attempt, "err", r.d.Classify(err))
		select {
		case <-ctx.Done():
			return false
		case <-time.After(r.retry.Delay(attempt)):
		}
	}
}

// cancelStreamHandlers cancels the running handlers of stream messages.
func (r *Relay) cancelStreamHandlers() {
	if r.stream == nil {
		return
	}
	r.stream.mu.Lock()
	defer r.stream.mu.Unlock()
	if r.stream.cancel != nil {
		r.stream.cancel()
	}
}

// StreamLag is how far the relay's reading of its dialect's message
// stream (PostgreSQL's WAL transport) is behind; see [Relay.StreamLag].
type StreamLag = outboxdriver.StreamLag

// StreamLag reports how far this relay's reading of the message stream is
// behind, and whether this relay reads it now (false: no stream, another
// relay reads it, or it is not open).
func (r *Relay) StreamLag(ctx context.Context) (StreamLag, bool, error) {
	if r.stream == nil {
		return StreamLag{}, false, nil
	}
	r.stream.mu.Lock()
	st := r.stream.cur
	r.stream.mu.Unlock()
	if st == nil {
		return StreamLag{}, false, nil
	}
	l, err := st.Lag(ctx)
	return l, true, err
}
