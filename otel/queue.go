package oncommitotel

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/oncommit/oncommit/outbox"
)

// DefaultQueueInterval is QueueConfig.Interval's default.
const DefaultQueueInterval = 15 * time.Second

// QueueConfig configures [Telemetry.ObserveQueue]. The zero value works.
type QueueConfig struct {
	// Interval is how often the queue is measured (one [outbox.Outbox.Stats]
	// statement, which reads the whole table). Defaults to
	// DefaultQueueInterval (15s).
	Interval time.Duration
	// Elector decides which replica measures: only the one it says leads
	// runs the statement and reports the gauges, so N replicas do not scan
	// the table N times. [PostgresLock] and [MySQLLock] elect with a
	// database lock. Defaults to nil: this process always measures (one
	// process, or SQLite).
	Elector Elector
}

// Elector elects the one replica that measures the queue.
type Elector interface {
	// Lead reports whether this replica leads now. It is called before
	// each measurement; it acquires the lead when it is free and keeps it
	// while this replica holds it.
	Lead(ctx context.Context) (bool, error)
	// Release gives the lead up (ObserveQueue calls it when it returns).
	Release(ctx context.Context) error
}

// queueState is the last measurement, which the gauges' callback reports.
type queueState struct {
	mu     sync.Mutex
	stats  []outbox.TopicStats
	at     time.Time
	stale  time.Duration // a measurement older than this is not reported
	leader bool
	// ordered: the measured Outbox orders by key; the gauges of ordered
	// delivery report.
	ordered bool

	messages      metric.Int64ObservableGauge
	oldest        metric.Float64ObservableGauge
	keys          metric.Int64ObservableGauge
	oldestBlocked metric.Float64ObservableGauge
}

func (q *queueState) init(t *Telemetry, m metric.Meter) error {
	var err1, err2, err3, err4 error
	q.messages, err1 = m.Int64ObservableGauge(MetricQueueMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Messages in the outbox table by state: pending (due or scheduled), due (the pending ones due now), processing, dead, delivered (when kept), and with ordered delivery blocked (waiting behind the head of their key)."))
	q.oldest, err2 = m.Float64ObservableGauge(MetricQueueOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest due pending message: how late delivery runs."))
	q.keys, err3 = m.Int64ObservableGauge(MetricQueueKeys, metric.WithUnit("{key}"),
		metric.WithDescription("Ordered keys by state, per topic of their head: held (messages wait behind the head), blocked (the head failed: dead, halting the key until it is skipped or redriven, or waiting for a retry)."))
	q.oldestBlocked, err4 = m.Float64ObservableGauge(MetricQueueOldestBlockedAge, metric.WithUnit("s"),
		metric.WithDescription("Age (since it was published) of the oldest head of a blocked ordered key."))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return err
	}
	_, err := m.RegisterCallback(q.observe, q.messages, q.oldest, q.keys, q.oldestBlocked)
	return err
}

// observe reports the last measurement, if this replica made it and it is
// recent.
func (q *queueState) observe(_ context.Context, o metric.Observer) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.leader || q.at.IsZero() || time.Since(q.at) > q.stale {
		return nil
	}
	type count struct {
		state string
		n     int64
	}
	for _, s := range q.stats {
		base := []attribute.KeyValue{KeySystem.String(System), KeyDestination.String(s.Topic)}
		if s.Subscriber != "" {
			base = append(base, KeyConsumerGroup.String(s.Subscriber))
		}
		messages := []count{{"pending", s.Pending}, {"due", s.Due}, {"processing", s.Processing}, {"dead", s.Dead}, {"delivered", s.Delivered}}
		if q.ordered {
			messages = append(messages, count{"blocked", s.Blocked})
			for _, k := range []count{{"held", s.HeldKeys}, {"blocked", s.BlockedKeys}} {
				o.ObserveInt64(q.keys, k.n, metric.WithAttributes(append(base, KeyState.String(k.state))...))
			}
			o.ObserveFloat64(q.oldestBlocked, s.OldestBlockedKey.Seconds(), metric.WithAttributes(base...))
		}
		for _, st := range messages {
			o.ObserveInt64(q.messages, st.n, metric.WithAttributes(append(base, KeyState.String(st.state))...))
		}
		o.ObserveFloat64(q.oldest, s.OldestPending.Seconds(), metric.WithAttributes(base...))
	}
	return nil
}

// ObserveQueue measures ob's table through db every cfg.Interval, while
// cfg.Elector says this replica leads, and reports the queue gauges
// (oncommit.queue.messages per topic and state, oncommit.queue.oldest_due.age
// per topic; when ob orders by key, the blocked messages among the former,
// oncommit.queue.keys per topic and state held or blocked, and
// oncommit.queue.oldest_blocked_key.age per topic) from the last
// measurement. It blocks until ctx ends, then
// releases the lead and returns nil; run it beside Relay.Run, once per
// Telemetry (the gauges report one table's measurement). A failed
// measurement or election is retried at the next interval; meanwhile the
// gauges report nothing once the last measurement is older than three
// intervals.
func (t *Telemetry) ObserveQueue(ctx context.Context, ob *outbox.Outbox, db outbox.DB, cfg QueueConfig) error {
	if ob == nil || db == nil {
		return errors.New("oncommitotel: ObserveQueue needs an Outbox and a DB")
	}
	if cfg.Interval < 0 {
		return &outbox.ConfigError{Field: "Interval", Reason: "must not be negative"}
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultQueueInterval
	}
	q := &t.queue
	q.mu.Lock()
	q.stale, q.ordered = 3*cfg.Interval, ob.OrdersByKey()
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		q.leader, q.stats, q.at = false, nil, time.Time{}
		q.mu.Unlock()
		if cfg.Elector != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = cfg.Elector.Release(rctx)
			cancel()
		}
	}()
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for {
		t.measure(ctx, ob, db, cfg)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// measureTimeout bounds a measurement (election and statement) when the
// interval is shorter.
const measureTimeout = 10 * time.Second

// measure runs one measurement if this replica leads.
func (t *Telemetry) measure(ctx context.Context, ob *outbox.Outbox, db outbox.DB, cfg QueueConfig) {
	mctx, cancel := context.WithTimeout(ctx, max(cfg.Interval, measureTimeout))
	defer cancel()
	lead := true
	if cfg.Elector != nil {
		var err error
		if lead, err = cfg.Elector.Lead(mctx); err != nil {
			lead = false
		}
	}
	q := &t.queue
	if !lead {
		q.mu.Lock()
		q.leader = false
		q.mu.Unlock()
		return
	}
	stats, err := ob.Stats(mctx, db)
	if err != nil {
		return // the gauges go quiet once the last measurement is stale
	}
	q.mu.Lock()
	q.leader, q.stats, q.at = true, stats, time.Now()
	q.mu.Unlock()
}

// sessionLock is an Elector holding a database session lock on a
// connection of its own.
type sessionLock struct {
	db           *sql.DB
	lock, unlock string
	args         []any
	mu           sync.Mutex
	conn         *sql.Conn
}

// PostgresLock returns an Elector that leads while it holds the
// PostgreSQL session advisory lock key (pg_try_advisory_lock) on a
// connection of db it keeps for that: the replica that takes the lock
// measures, the others do not, and when the leader's connection or process
// dies the lock is freed and another replica takes it at its next interval.
// With pgx, open db with stdlib.OpenDBFromPool. It costs one connection on
// the leader and a short one per interval on the others.
func PostgresLock(db *sql.DB, key int64) Elector {
	return &sessionLock{db: db, lock: `SELECT pg_try_advisory_lock($1)`, unlock: `SELECT pg_advisory_unlock($1)`, args: []any{key}}
}

// MySQLLock is PostgresLock for MySQL and MariaDB, with the named lock
// GET_LOCK(name, 0).
func MySQLLock(db *sql.DB, name string) Elector {
	return &sessionLock{db: db, lock: `SELECT GET_LOCK(?, 0) = 1`, unlock: `SELECT RELEASE_LOCK(?)`, args: []any{name}}
}

func (l *sessionLock) Lead(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		if err := l.conn.PingContext(ctx); err == nil {
			return true, nil
		}
		l.discard() // the session, and its lock, are gone
	}
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return false, err
	}
	var got bool
	if err := conn.QueryRowContext(ctx, l.lock, l.args...).Scan(&got); err != nil {
		// The lock may have been taken before the error (a timeout):
		// never hand the connection back to the pool.
		l.conn = conn
		l.discard()
		return false, err
	}
	if !got {
		conn.Close()
		return false, nil
	}
	l.conn = conn
	return true, nil
}

func (l *sessionLock) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return nil
	}
	var ok bool
	err := l.conn.QueryRowContext(ctx, l.unlock, l.args...).Scan(&ok)
	if err != nil || !ok {
		l.discard() // never hand a connection holding the lock back to the pool
		return err
	}
	err = l.conn.Close()
	l.conn = nil
	return err
}

// discard closes the connection for good (not back to the pool).
func (l *sessionLock) discard() {
	_ = l.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = l.conn.Close()
	l.conn = nil
}
