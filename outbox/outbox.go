package outbox

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncommit/oncommit/internal/publishsql"
	"github.com/oncommit/oncommit/outboxdriver"
)

// Defaults for [Config].
const (
	DefaultTable           = outboxdriver.DefaultTable
	DefaultMaxPayloadBytes = 1 << 20
	DefaultMaxBatch        = 1000
	DefaultNotifyInterval  = 5 * time.Millisecond
)

// NotifyEvery, as Config.NotifyInterval, notifies on every publish instead
// of coalescing notifications.
const NotifyEvery time.Duration = -1

// NotifyMode says whether Publish sends a wake-up notification with the
// INSERT, so relays react within milliseconds instead of at their next poll.
type NotifyMode int

const (
	// NotifyAuto notifies when the dialect can (PostgreSQL) and stays silent
	// where it cannot (SQLite, MySQL).
	NotifyAuto NotifyMode = iota
	// NotifyOn notifies, and makes [New] fail with ErrUnsupported when the
	// dialect cannot.
	NotifyOn
	// NotifyOff never notifies; relays find messages by polling. Use it
	// behind PgBouncer in transaction mode, where LISTEN does not work.
	NotifyOff
)

// Config configures an [Outbox]. The zero value works.
type Config struct {
	// Table is the outbox table: "name" or "schema.name", each part
	// [a-z_][a-z0-9_]* of at most 63 bytes; with NOTIFY, also the channel.
	// Defaults to DefaultTable ("outbox").
	Table string

	// Notify says whether Publish sends a wake-up notification inside the
	// caller's transaction. Defaults to NotifyAuto.
	Notify NotifyMode

	// NotifyInterval coalesces notifications: the Outbox sends at most one
	// per NotifyInterval, and a relay it wakes claims a silent publish
	// committed t later within about max(2ms, t/8). NotifyEvery notifies
	// on every publish. Defaults to DefaultNotifyInterval (5ms).
	NotifyInterval time.Duration

	// MaxPayloadBytes bounds Message.Payload. Defaults to
	// DefaultMaxPayloadBytes (1 MiB).
	MaxPayloadBytes int

	// MaxBatch bounds the messages of one PublishBatch call. Defaults to
	// DefaultMaxBatch (1000).
	MaxBatch int

	// CommandTimeout bounds each statement Publish sends, on top of the
	// caller's context (error wrapping context.DeadlineExceeded); lib/pq
	// cannot be bounded. Defaults to 0: only the caller's context.
	CommandTimeout time.Duration

	// OrderByKey delivers the messages of one Key one at a time, across
	// topics, in commit order; a failing message holds back only its key.
	// Publishers of one key serialise until their commit. Every relay of
	// the table must use it too (the guide's "Ordered delivery").
	// Defaults to false.
	OrderByKey bool

	// Subscribers gives topics (the map's keys) more than one subscriber
	// (the names, each 1 to 64 bytes of ASCII letters, digits, '.', '_'
	// and '-'). Publish stores a copy of a message of such a topic per
	// subscriber, in the same statement; each copy has its own id,
	// attempts, backoff and dead letter, and with OrderByKey its own
	// order per key, so a subscriber that fails never makes another
	// receive a message again. Relays handle the copies with
	// [Relay.Subscribe]; every Outbox and relay of the table must have
	// the same subscribers. Defaults to none: one row per message.
	Subscribers map[string][]string

	// Hook, when set, sees each message Publish and PublishBatch store,
	// before validation, and each call's result. Defaults to nil.
	Hook PublishHook
}

// Outbox publishes messages into the outbox table inside the caller's
// transactions. Build it once with [New]; it is safe for concurrent use.
type Outbox struct {
	d     Dialect
	caps  outboxdriver.Capabilities
	table Table
	// depth is the deepest payload nesting accepted: MaxPayloadDepth or
	// the dialect's Capabilities.MaxJSONDepth, whichever is less.
	depth int
	cfg   Config
	// wakeLoud is the notification a notifying publish sends (Send is
	// false when the Outbox never notifies).
	wakeLoud outboxdriver.Wake
	// check refuses rows the dialect cannot store, nil when it stores all.
	check outboxdriver.RowChecker
	// subs are the subscribers by topic (Config.Subscribers), nil for none.
	subs map[string][]string

	// With NotifyInterval: when the last notifying publish began, in
	// nanoseconds since epoch (monotonic).
	epoch      time.Time
	lastNotify atomic.Int64

	// rowBufs holds *[]outboxdriver.Row buffers for insert's rows: a
	// batch's rows live only for its statement (the Dialect does not keep
	// them; see outboxdriver.Dialect's Insert), and one buffer of
	// MaxBatch rows, reused, is cheaper than an allocation per publish
	// that the collector must then scan.
	rowBufs sync.Pool
}

// New returns an Outbox that writes through dialect d; it sends nothing to
// the database.
func New(d Dialect, cfg Config) (*Outbox, error) {
	if d == nil {
		return nil, &ConfigError{Field: "Dialect", Reason: "must not be nil"}
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	table, err := ParseTable(cfg.Table)
	if err != nil {
		return nil, err
	}
	caps := d.Capabilities()
	if cfg.MaxPayloadBytes < 0 {
		return nil, &ConfigError{Field: "MaxPayloadBytes", Reason: "must not be negative"}
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if cfg.MaxBatch < 0 {
		return nil, &ConfigError{Field: "MaxBatch", Reason: "must not be negative"}
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if caps.ParamsPerRow > 0 && cfg.MaxBatch*caps.ParamsPerRow > caps.MaxParams {
		return nil, &ConfigError{Field: "MaxBatch", Reason: fmt.Sprintf("%d messages need more than the %d parameters %s allows in one statement; at most %d",
			cfg.MaxBatch, caps.MaxParams, d.Name(), caps.MaxParams/caps.ParamsPerRow)}
	}
	if cfg.CommandTimeout < 0 {
		return nil, &ConfigError{Field: "CommandTimeout", Reason: "must not be negative"}
	}
	var notify bool
	switch cfg.Notify {
	case NotifyAuto:
		notify = caps.Notify
	case NotifyOn:
		if !caps.Notify {
			return nil, fmt.Errorf("%w: %s has no notifications (Config.Notify is NotifyOn)", ErrUnsupported, d.Name())
		}
		notify = true
	case NotifyOff:
	default:
		return nil, &ConfigError{Field: "Notify", Reason: "unknown mode " + strconv.Itoa(int(cfg.Notify))}
	}
	if cfg.OrderByKey {
		if _, ok := d.(outboxdriver.OrderedDialect); !ok || !caps.Ordered {
			return nil, fmt.Errorf("%w: the %s dialect cannot order messages by key (Config.OrderByKey)", ErrUnsupported, d.Name())
		}
		if len(table.Name) > outboxdriver.MaxOrderedTableName {
			return nil, &ConfigError{Field: "Table", Reason: fmt.Sprintf("longer than %d bytes, too long for the table of keys beside it (OrderByKey)", outboxdriver.MaxOrderedTableName)}
		}
	}
	if notify && len(table.String()) > 63 {
		return nil, &ConfigError{Field: "Table", Reason: "longer than 63 bytes, too long to be the notification channel; shorten it or set Notify to NotifyOff"}
	}
	switch {
	case cfg.NotifyInterval == 0:
		cfg.NotifyInterval = DefaultNotifyInterval
	case cfg.NotifyInterval < 0 && cfg.NotifyInterval != NotifyEvery:
		return nil, &ConfigError{Field: "NotifyInterval", Reason: "must not be negative (NotifyEvery notifies on every publish)"}
	}
	subs, err := checkSubscribers(cfg.Subscribers)
	if err != nil {
		return nil, err
	}
	cfg.Subscribers = nil // o.subs, the copy, is the one read
	o := &Outbox{d: d, caps: caps, table: table, depth: MaxPayloadDepth, cfg: cfg, epoch: time.Now(), subs: subs}
	o.check, _ = d.(outboxdriver.RowChecker)
	if caps.MaxJSONDepth > 0 {
		o.depth = min(o.depth, caps.MaxJSONDepth)
	}
	o.lastNotify.Store(-int64(max(cfg.NotifyInterval, 0))) // the first publish notifies
	if notify {
		o.wakeLoud.Send = true
		if cfg.NotifyInterval > 0 {
			o.wakeLoud.Payload = wakePayload(min(cfg.NotifyInterval, maxFollowUpStep))
		}
	}
	return o, nil
}

// wake decides whether this publish notifies: always with NotifyEvery,
// else when no publish of this Outbox notified in
// the last NotifyInterval.
func (o *Outbox) wake() outboxdriver.Wake {
	if !o.wakeLoud.Send || o.cfg.NotifyInterval <= 0 {
		return o.wakeLoud
	}
	now := int64(time.Since(o.epoch))
	last := o.lastNotify.Load()
	if now-last < int64(o.cfg.NotifyInterval) {
		return outboxdriver.Wake{}
	}
	if !o.lastNotify.CompareAndSwap(last, now) {
		return outboxdriver.Wake{} // a concurrent publish notifies
	}
	return o.wakeLoud
}

// Table returns the outbox table.
func (o *Outbox) Table() Table { return o.table }

// Dialect returns the dialect the Outbox was built with.
func (o *Outbox) Dialect() Dialect { return o.d }

// Publish stores msg inside tx, the caller's open transaction; it never
// begins, commits or rolls back. A message refused by validation returns a
// [*MessageError] before any SQL is sent, and a taken DedupKey makes
// Result.Duplicate true: tx stays usable after both.
func (o *Outbox) Publish(ctx context.Context, tx Tx, msg Message) (Result, error) {
	if o.cfg.Hook != nil {
		// The hook's event keeps the results: they live on the heap.
		res := make([]Result, 1)
		if err := o.publish(ctx, tx, []Message{msg}, res); err != nil {
			return Result{}, err
		}
		return res[0], nil
	}
	// Without a hook nothing keeps msg or the result: both stay on the
	// stack.
	var res [1]Result
	msgs := [1]Message{msg}
	if err := o.checkPublish(ctx, tx); err != nil {
		return Result{}, err
	}
	if err := o.insert(ctx, tx, msgs[:], res[:]); err != nil {
		return Result{}, err
	}
	return res[0], nil
}

// PublishBatch stores msgs inside tx like [Outbox.Publish], with one
// multi-row statement and at most one notification. Every message is
// validated before anything is sent; results[i] belongs to msgs[i].
func (o *Outbox) PublishBatch(ctx context.Context, tx Tx, msgs []Message) ([]Result, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	res := make([]Result, len(msgs))
	if err := o.publish(ctx, tx, msgs, res); err != nil {
		return nil, err
	}
	return res, nil
}

// Statement is the SQL that Publish sends for some messages.
type Statement struct {
	Query string
	Args  []any
	// IDs are the ids generated for the messages, in order (a message of a
	// topic with subscribers has one per copy, in its subscribers' order);
	// each appears in Args as its text form.
	IDs []ID

	extra publishsql.Extra
}

func init() {
	publishsql.Of = func(st any) publishsql.Extra { return st.(Statement).extra }
}

// PublishSQL returns the statement Publish or PublishBatch sends for msgs,
// for documentation and for pinning SQL in tests (see package outboxtest).
// It validates msgs like Publish and generates fresh ids on each call.
func (o *Outbox) PublishSQL(msgs ...Message) (Statement, error) {
	rows, err := o.rows(msgs, nil)
	if err != nil {
		return Statement{}, err
	}
	q, args := o.d.Insert(o.table, rows, o.wakeLoud)
	st := Statement{Query: q, Args: args, IDs: rowIDs(rows)}
	if o.wakeLoud.Send && o.cfg.NotifyInterval > 0 {
		st.extra.QuietQuery, _ = o.d.Insert(o.table, rows, outboxdriver.Wake{})
	}
	if sl, ok := o.d.(outboxdriver.StoredLister); ok {
		for i := range rows {
			if rows[i].DedupKey != "" {
				st.extra.StoredQuery, st.extra.StoredArgs = sl.StoredSQL(o.table, st.IDs)
				break
			}
		}
	}
	if od := o.orderedDialect(); od != nil && needsSequence(od, rows) {
		var ids []ID
		for i := range rows {
			if rows[i].Ordered {
				ids = append(ids, rows[i].ID)
			}
		}
		st.extra.Sequence = o.sequenceStatements(od, ids)
	}
	return st, nil
}

func rowIDs(rows []outboxdriver.Row) []ID {
	ids := make([]ID, len(rows))
	for i := range rows {
		ids[i] = rows[i].ID
	}
	return ids
}

// rows validates msgs and returns their rows, in buf when it has room.
func (o *Outbox) rows(msgs []Message, buf []outboxdriver.Row) ([]outboxdriver.Row, error) {
	if len(msgs) > o.cfg.MaxBatch {
		return nil, &MessageError{-1, "batch", fmt.Sprintf("%d messages, more than Config.MaxBatch (%d)", len(msgs), o.cfg.MaxBatch)}
	}
	n := o.copies(msgs)
	if o.caps.ParamsPerRow > 0 && n*o.caps.ParamsPerRow > o.caps.MaxParams {
		return nil, &MessageError{-1, "batch", fmt.Sprintf("%d messages are %d rows with their subscribers' copies, more than one %s statement holds (%d)",
			len(msgs), n, o.d.Name(), o.caps.MaxParams/o.caps.ParamsPerRow)}
	}
	rows := buf[:0]
	if cap(rows) < n {
		rows = make([]outboxdriver.Row, n)
	}
	rows = rows[:n]
	k := 0
	for i := range msgs {
		r := &rows[k]
		if err := toRow(r, i, &msgs[i], o.cfg.MaxPayloadBytes, o.depth); err != nil {
			return nil, err
		}
		if err := checkReserved(i, &msgs[i]); err != nil {
			return nil, err
		}
		r.Ordered = o.cfg.OrderByKey && r.Key != ""
		if o.check != nil {
			if field, reason := o.check.CheckRow(r); reason != "" {
				return nil, &MessageError{i, field, reason}
			}
		}
		if subs := o.subs[msgs[i].Topic]; len(subs) > 0 {
			fanOut(rows, k, subs)
			k += len(subs)
		} else {
			k++
		}
	}
	newIDs(rows)
	return rows, nil
}

// newIDs gives each row a new ID, in the rows' order, under one lock and
// one clock read of the process's id generator (the ids are monotonic
// across the process, as NewID's).
func newIDs(rows []outboxdriver.Row) {
	outboxdriver.NewIDs(len(rows), func(i int, id ID) { rows[i].ID = id })
}

// checkPublish refuses a publish whose context is done or whose
// transaction cannot take a statement, before anything is sent.
func (o *Outbox) checkPublish(ctx context.Context, tx Tx) error {
	if err := ctx.Err(); err != nil {
		return wrapOp(ctx, "publish", err)
	}
	if tx == nil {
		return ErrNilTx
	}
	return tx.CheckTx()
}

func (o *Outbox) publish(ctx context.Context, tx Tx, msgs []Message, res []Result) error {
	if err := o.checkPublish(ctx, tx); err != nil {
		return err
	}
	if o.cfg.Hook != nil {
		own, ctxs := o.hookStart(ctx, msgs)
		err := o.insert(ctx, tx, own, res)
		e := PublishEvent{Messages: own, Contexts: ctxs, Err: err}
		if err == nil {
			e.Results = res
		}
		o.cfg.Hook.PublishEnd(ctx, e)
		return err
	}
	return o.insert(ctx, tx, msgs, res)
}

// insert validates msgs and stores them, filling res.
func (o *Outbox) insert(ctx context.Context, tx Tx, msgs []Message, res []Result) error {
	bp, _ := o.rowBufs.Get().(*[]outboxdriver.Row)
	if bp == nil {
		bp = new([]outboxdriver.Row)
	}
	rows, err := o.rows(msgs, *bp)
	defer func() {
		if cap(rows) > cap(*bp) {
			*bp = rows[:0] // grown
		}
		// Cleared (as far as rows may have written, a refused batch
		// included): a buffer in the pool keeps no message's payload alive.
		clear((*bp)[:min(o.copies(msgs), cap(*bp))])
		o.rowBufs.Put(bp)
	}()
	if err != nil {
		return err
	}
	query, args := o.d.Insert(o.table, rows, o.wake())
	if o.cfg.CommandTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.cfg.CommandTimeout)
		defer cancel()
	}
	dedup := false
	for i := range rows {
		dedup = dedup || rows[i].DedupKey != ""
	}
	var stored []string
	if sl, ok := o.d.(outboxdriver.StoredLister); ok && dedup {
		// The INSERT cannot return what it stored: ask in a second statement.
		if _, err = o.query(ctx, tx, query, args, 0, false); err == nil {
			sq, sargs := sl.StoredSQL(o.table, rowIDs(rows))
			stored, err = o.query(ctx, tx, sq, sargs, len(rows), true)
		}
	} else {
		stored, err = o.query(ctx, tx, query, args, len(rows), dedup)
	}
	if err == nil {
		err = o.sequence(ctx, tx, rows, stored, dedup)
	}
	if err != nil {
		return wrapOp(ctx, "publish", err)
	}
	if o.subs != nil && o.anySubscribed(msgs) {
		return o.fanOutResults(ctx, msgs, rows, res, stored, dedup)
	}
	if !dedup || len(stored) == len(rows) { // nothing was a duplicate
		for i := range rows {
			res[i] = Result{ID: rows[i].ID}
		}
		return nil
	}
	got, err := storedSet(stored)
	if err != nil {
		return wrapOp(ctx, "publish", err)
	}
	for i := range rows {
		if got[rows[i].ID] {
			res[i] = Result{ID: rows[i].ID}
		} else {
			res[i] = Result{Duplicate: true}
		}
	}
	return nil
}

// storedSet parses the ids of the stored rows.
func storedSet(stored []string) (map[ID]bool, error) {
	got := make(map[ID]bool, len(stored))
	for _, s := range stored {
		id, err := ParseID(s)
		if err != nil {
			return nil, err
		}
		got[id] = true
	}
	return got, nil
}

// query runs the insert. With scan it returns the text ids of the stored
// rows; without, it runs the statement with ExecTx and returns nothing.
func (o *Outbox) query(ctx context.Context, tx Tx, query string, args []any, n int, scan bool) ([]string, error) {
	if !scan {
		if err := tx.ExecTx(ctx, query, args...); err != nil {
			return nil, o.d.Classify(err)
		}
		return nil, nil
	}
	rs, err := tx.QueryTx(ctx, query, args...)
	if err != nil {
		return nil, o.d.Classify(err)
	}
	ids := make([]string, 0, n)
	for rs.Next() {
		var s string
		if err := rs.Scan(&s); err != nil {
			rs.Close()
			return nil, o.d.Classify(err)
		}
		ids = append(ids, s)
	}
	cerr := rs.Close()
	if err := rs.Err(); err != nil {
		return nil, o.d.Classify(err)
	}
	if cerr != nil {
		return nil, o.d.Classify(cerr)
	}
	return ids, nil
}
