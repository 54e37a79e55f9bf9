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
		r.streamHealth(err, false)
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
				if ctx.Err() == nil {
					r.streamHealth(err, false)
				}
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
		}
		busyLogged = false
		r.streamHealth(nil, true)
		err := r.readStream(ctx, hctx, st)
		r.streamHealth(err, false)
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

// streamHealth records, in the relay's Health, an open or the end of a
// read (err nil for a read ended by shutdown) and whether the relay reads
// the stream now; another relay reading it is no error.
func (r *Relay) streamHealth(err error, reading bool) {
	r.health.set(func(h *Health) {
		h.Stream.Reading = reading
		switch {
		case reading:
			h.Stream.ConsecutiveErrors, h.Stream.LastError = 0, nil
		case err != nil && !errors.Is(err, outboxdriver.ErrStreamBusy):
			h.Stream.ConsecutiveErrors++
			h.Stream.LastError = err
		}
		if !reading {
			h.Stream.Lag = StreamLag{}
		}
	})
}

// readStream delivers st's messages until ctx ends or st fails, then
// waits for the handlers it started. When st fails, its handlers'
// contexts are cancelled and nothing more is written for its messages:
// another relay may take the stream over and read them again.
func (r *Relay) readStream(ctx, hctx context.Context, st outboxdriver.Stream) error {
	sctx, cancel := context.WithCancel(hctx)
	defer cancel()
	r.stream.mu.Lock()
	r.stream.cur, r.stream.cancel = st, cancel
	r.stream.mu.Unlock()
	rd := &streamRead{st: st, lost: make(chan struct{}),
		// A slot per handler running: the stream's handlers have
		// Concurrency slots of their own, beside the claims'. ahead bounds
		// the ordered messages read and waiting behind their key's.
		sem:   make(chan struct{}, r.cfg.Concurrency),
		ahead: make(chan struct{}, max(r.cfg.BatchSize, r.cfg.Concurrency)),
		lines: map[string][]*outboxdriver.StreamMessage{},
	}
	var mine sync.WaitGroup
	defer mine.Wait()
	if err := r.loadTableKeys(ctx, rd); err != nil {
		return err
	}
	for {
		msgs, err := st.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			close(rd.lost)
			cancel()
			return err
		}
		for i := range msgs {
			m := &msgs[i]
			if m.Ordered {
				select {
				case rd.ahead <- struct{}{}:
				case <-ctx.Done():
					return nil
				}
				if rd.add(m) {
					mine.Add(1)
					go func() {
						defer mine.Done()
						r.runKeyLine(ctx, sctx, rd, m)
					}()
				}
				continue
			}
			select {
			case rd.sem <- struct{}{}:
			case <-ctx.Done():
				return nil // stopping: the rest is read again by the next reader
			}
			mine.Add(1)
			go func() {
				defer mine.Done()
				defer func() { <-rd.sem }()
				s, ok := r.handleStream(sctx, m)
				if s.Kind == outboxdriver.SettleDone || (s.Kind == outboxdriver.SettleDead && r.cfg.DiscardDead) || r.storeStream(ctx, rd, m, s, ok) {
					st.Settled(m)
				}
			}()
		}
	}
}

// streamRead is one reading of a stream, from its opening to its end.
type streamRead struct {
	st outboxdriver.Stream
	// lost is closed when the stream failed: its messages are no longer
	// this relay's to settle.
	lost       chan struct{}
	sem, ahead chan struct{}

	mu sync.Mutex
	// lines holds, per key, the ordered messages read and waiting for the
	// one of their key in hand: one goroutine delivers a key's messages,
	// in commit order.
	lines map[string][]*outboxdriver.StreamMessage
	// inTable holds the keys that may have ordered messages in the table:
	// those listed when the stream was opened, and those this reading has
	// stored a message of since. A message of any other key is delivered
	// without asking the table.
	inTable map[string]bool
}

// add queues m behind its key's messages in hand, and reports whether
// none was (the caller starts the key's line with m).
func (rd *streamRead) add(m *outboxdriver.StreamMessage) bool {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	q, busy := rd.lines[m.Key]
	rd.lines[m.Key] = append(q, m)
	return !busy
}

// next drops m, the key's message in hand, and returns the key's next
// one, nil (and the key forgotten) when none waits.
func (rd *streamRead) next(m *outboxdriver.StreamMessage) *outboxdriver.StreamMessage {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	q := rd.lines[m.Key][1:]
	if len(q) == 0 {
		delete(rd.lines, m.Key)
		return nil
	}
	rd.lines[m.Key] = q
	return q[0]
}

// mayBeInTable reports whether key may have messages in the table;
// setInTable records that it may, or that it has none.
func (rd *streamRead) mayBeInTable(key string) bool {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	return rd.inTable[key]
}

func (rd *streamRead) setInTable(key string, may bool) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if may {
		rd.inTable[key] = true
	} else {
		delete(rd.inTable, key)
	}
}

// isLost reports whether the stream failed.
func (rd *streamRead) isLost() bool {
	select {
	case <-rd.lost:
		return true
	default:
		return false
	}
}

// loadTableKeys lists, into rd, the keys with ordered messages in the
// table.
func (r *Relay) loadTableKeys(ctx context.Context, rd *streamRead) error {
	rd.inTable = map[string]bool{}
	if !r.ob.cfg.OrderByKey {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	rows, err := r.db.QueryDB(qctx, r.stream.s.TableKeysSQL(r.ob.table))
	if err != nil {
		return err
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			_ = rows.Close()
			return err
		}
		rd.inTable[k] = true
	}
	if err := rows.Err(); err != nil {
		_ = rows.Close()
		return err
	}
	return rows.Close()
}

// runKeyLine delivers m and the messages of its key read after it, one at
// a time. A message not settled (the relay is stopping, or the stream
// failed) ends the line: the ones behind it are read again by the next
// reader.
func (r *Relay) runKeyLine(ctx, hctx context.Context, rd *streamRead, m *outboxdriver.StreamMessage) {
	for ; m != nil; m = rd.next(m) {
		if !r.deliverOrderedStream(ctx, hctx, rd, m) {
			return
		}
		<-rd.ahead
	}
}

// deliverOrderedStream settles ordered message m. A message of a key
// that may have messages in the table is stored behind them when it has
// some; one of a key with none is delivered, and stored as the key's head
// when its handler fails. It reports false when m could not be settled.
func (r *Relay) deliverOrderedStream(ctx, hctx context.Context, rd *streamRead, m *outboxdriver.StreamMessage) bool {
	if rd.isLost() {
		return false
	}
	if rd.mayBeInTable(m.Key) {
		q, args := r.stream.s.QueueSQL(r.ob.table, m)
		var queued bool
		if !r.writeStream(ctx, rd, m, q, args, &queued) {
			return false
		}
		if queued {
			rd.st.Settled(m)
			return true
		}
		rd.setInTable(m.Key, false)
	}
	select {
	case rd.sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	s, handled := r.handleStream(hctx, m)
	<-rd.sem
	if s.Kind != outboxdriver.SettleDone {
		rd.setInTable(m.Key, true)
		if !r.storeStream(ctx, rd, m, s, handled) {
			return false
		}
	}
	rd.st.Settled(m)
	return true
}

// handleStream runs m's handler and returns its outcome; handled is false
// when this relay has no handler for m (a batch handler's topic, or none):
// the table's claims take it.
func (r *Relay) handleStream(hctx context.Context, m *outboxdriver.StreamMessage) (s outboxdriver.Settlement, handled bool) {
	c := &outboxdriver.Claimed{ID: m.ID, Topic: m.Topic, Key: m.Key, Payload: m.Payload, Attempts: 1, CreatedAt: m.CreatedAt}
	d := newDelivery(c, 1)
	h := r.handlerOf(m.Topic, d.Subscriber)
	if !r.handles(m.Topic, d.Subscriber) {
		h = nil // the table's claims take it, for a relay that has a handler
	}
	var err error
	if len(m.Headers) > 0 {
		d.Headers, err = decodeHeaders(m.Headers)
	}
	switch {
	case err != nil:
		return r.outcome(c, err), true
	case h == nil:
		return outboxdriver.Settlement{}, false
	}
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
	return s, true
}

// storeStream writes m into the table with outcome s (handled false: no
// handler ran), trying again while ctx lasts; it reports whether it was
// written.
func (r *Relay) storeStream(ctx context.Context, rd *streamRead, m *outboxdriver.StreamMessage, s outboxdriver.Settlement, handled bool) bool {
	if !handled {
		s = outboxdriver.Settlement{}
	}
	q, args := r.stream.s.StoreSQL(r.ob.table, m, s, r.halts(m.Topic))
	return r.writeStream(ctx, rd, m, q, args, nil)
}

// writeStream runs statement q for stream message m, trying again while
// ctx lasts and the stream is not lost, and scans its one boolean into
// into when into is not nil; it reports whether the statement ran.
func (r *Relay) writeStream(ctx context.Context, rd *streamRead, m *outboxdriver.StreamMessage, q string, args []any, into *bool) bool {
	for attempt := 1; ; attempt++ {
		if rd.isLost() {
			return false
		}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CommandTimeout)
		err := r.queryStream(wctx, q, args, into)
		cancel()
		if err == nil {
			return true
		}
		r.log.Warn("outbox: cannot write a stream message into the table; trying again", "message_id", m.ID, "topic", m.Topic, "attempt", attempt, "err", r.d.Classify(err))
		select {
		case <-ctx.Done():
			return false
		case <-rd.lost:
			return false
		case <-time.After(r.retry.Delay(attempt)):
		}
	}
}

func (r *Relay) queryStream(ctx context.Context, q string, args []any, into *bool) error {
	rows, err := r.db.QueryDB(ctx, q, args...)
	if err != nil {
		return err
	}
	if into != nil {
		if !rows.Next() {
			_ = rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			return errors.New("outbox: the stream's queue statement returned no row")
		}
		if err := rows.Scan(into); err != nil {
			_ = rows.Close()
			return err
		}
	}
	return rows.Close()
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
