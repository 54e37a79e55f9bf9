package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncommit/oncommit/internal/pgwal"
	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/internal/walenv"
	"github.com/oncommit/oncommit/outboxdriver"
)

// The errors of the WAL transport, which the relay's Run returns.
var (
	// ErrWALLevel: the server's wal_level is not logical.
	ErrWALLevel = pgwal.ErrWALLevel
	// ErrSlotMissing: the replication slot does not exist (see SetupWAL).
	ErrSlotMissing = pgwal.ErrSlotMissing
	// ErrSlotLost: the slot was invalidated (wal_status lost): the WAL it
	// held, and the messages in it, are gone.
	ErrSlotLost = pgwal.ErrSlotLost
	// ErrNoReplication: the connection may not replicate (no REPLICATION
	// attribute, no replication line in pg_hba.conf, or a pooler between).
	ErrNoReplication = pgwal.ErrNoReplication
	// ErrWALName: a slot or publication name that is not a lower-case SQL
	// identifier.
	ErrWALName = pgwal.ErrName
)

// Defaults of WALConfig.
const (
	DefaultWALSlot        = "oncommit"
	DefaultWALPublication = "oncommit"
)

// WALConfig configures the WAL transport; see [WALDialect].
type WALConfig struct {
	// ConnString is the database's connection string (URL or key=value),
	// from which the relay opens its replication connection. It must reach
	// PostgreSQL itself, not a pooler, as a role with the REPLICATION
	// attribute (or a superuser). Publishing does not use it.
	ConnString string
	// Slot and Publication are the logical replication slot and the
	// publication the relay reads through, made by [SetupWAL]. Default
	// DefaultWALSlot and DefaultWALPublication. Each outbox table needs a
	// slot of its own.
	Slot, Publication string
}

// WALDialect returns the PostgreSQL dialect with the WAL transport: Publish
// sends each message as a transactional logical decoding message
// (pg_logical_emit_message) in the caller's transaction, a batch in one
// statement, instead of a row; the relay reads them from a logical
// replication slot in commit order and writes nothing when a handler
// succeeds. A message with a DedupKey, a Delay or a NotBefore is stored in
// the table as with [Dialect], and so is every message of a batch that
// holds one; an ordered message (Config.OrderByKey and a Key) with one of
// those is refused with a MessageError, as its key's order could not hold
// across the two paths. A message whose handler fails is written into the
// table with its outcome, and is retried, dead lettered, inspected and
// redriven there as any other; an ordered one becomes its key's head
// there, and the key's later messages queue behind it in the table until
// it is settled. The table and its migrations stay: run them, then
// [SetupWAL].
//
// The server needs wal_level = logical. One relay at a time reads the
// slot; the others claim from the table and wait to take the slot over.
// docs/operations.md (The WAL transport) has what it costs and how to run
// it.
func WALDialect(cfg WALConfig) (outboxdriver.Dialect, error) {
	if cfg.Slot == "" {
		cfg.Slot = DefaultWALSlot
	}
	if cfg.Publication == "" {
		cfg.Publication = DefaultWALPublication
	}
	if err := pgwal.CheckNames(cfg.Slot, cfg.Publication); err != nil {
		return nil, err
	}
	if cfg.ConnString != "" {
		if _, err := pgconn.ParseConfig(cfg.ConnString); err != nil {
			return nil, fmt.Errorf("postgres: WALConfig.ConnString: %w", err)
		}
	}
	return &walDialect{dialect: Dialect().(*dialect), cfg: cfg}, nil
}

// SetupWAL creates, when missing, the publication and the logical
// replication slot that cfg names, on the server cfg.ConnString reaches.
// It fails with ErrWALLevel when the server's wal_level is not logical.
// The slot keeps WAL from the moment it is made: messages published
// before it are not in it. Run it once, like a migration, before the
// first publish; a slot nobody reads keeps WAL without bound (see
// max_slot_wal_keep_size).
func SetupWAL(ctx context.Context, cfg WALConfig) error {
	return withConn(ctx, cfg, func(c *pgconn.PgConn, cfg WALConfig) error {
		_, err := pgwal.Setup(ctx, c, cfg.Slot, cfg.Publication)
		return err
	})
}

// DropWAL drops the slot and the publication that cfg names, when they
// exist; no relay may be reading the slot. Messages published and not yet
// delivered are lost with it.
func DropWAL(ctx context.Context, cfg WALConfig) error {
	return withConn(ctx, cfg, func(c *pgconn.PgConn, cfg WALConfig) error {
		return pgwal.Drop(ctx, c, cfg.Slot, cfg.Publication)
	})
}

func withConn(ctx context.Context, cfg WALConfig, f func(*pgconn.PgConn, WALConfig) error) error {
	if cfg.Slot == "" {
		cfg.Slot = DefaultWALSlot
	}
	if cfg.Publication == "" {
		cfg.Publication = DefaultWALPublication
	}
	c, err := pgconn.Connect(ctx, cfg.ConnString)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return f(c, cfg)
}

// walDialect is the PostgreSQL dialect whose Insert emits messages into
// the WAL when it can.
type walDialect struct {
	*dialect
	cfg WALConfig
}

// prefix is the logical message prefix of table t's messages: a relay of
// one table never reads another's.
func walPrefix(t outboxdriver.Table) string { return "oncommit:" + t.String() }

// walRow reports whether r travels through the WAL: the table's features
// (dedup, scheduling) are not needed for it.
func walRow(r *outboxdriver.Row) bool {
	return r.DedupKey == "" && r.Delay <= 0 && r.NotBefore.IsZero()
}

// CheckRow refuses an ordered message with a DedupKey or a delay: it would
// be stored in the table while its key's other messages travel the WAL,
// and the two would not keep their commit order.
func (d *walDialect) CheckRow(r *outboxdriver.Row) (field, reason string) {
	if !r.Ordered || walRow(r) {
		return "", ""
	}
	field = "DedupKey"
	if r.DedupKey == "" {
		field = "Delay"
	}
	return field, "the WAL transport orders a key's messages by commit; an ordered message (OrderByKey and a Key) cannot have a DedupKey, a Delay or a NotBefore"
}

// Insert emits rows as one logical decoding message, in one statement:
//
//	SELECT pg_logical_emit_message(true, $1::text, $2::bytea)
//
// with $1 the table's prefix and $2 the rows' envelopes back to back
// (package walenv): one WAL record per publish. When some row needs the
// table it returns [Dialect]'s statement for them all.
func (d *walDialect) Insert(t outboxdriver.Table, rows []outboxdriver.Row, wake outboxdriver.Wake) (string, []any) {
	for i := range rows {
		if !walRow(&rows[i]) {
			return d.dialect.Insert(t, rows, wake)
		}
	}
	var b []byte
	for i := range rows {
		r := &rows[i]
		b = walenv.Append(b, walenv.Envelope{ID: r.ID, Topic: r.Topic, Key: r.Key, Payload: r.Payload, Headers: r.Headers, Ordered: r.Ordered})
	}
	return pgwal.EmitSQL, []any{walPrefix(t), b}
}

// OpenStream opens the slot for table t's messages; a slot another relay
// reads gives an error wrapping outboxdriver.ErrStreamBusy.
func (d *walDialect) OpenStream(ctx context.Context, t outboxdriver.Table) (outboxdriver.Stream, error) {
	if d.cfg.ConnString == "" {
		return nil, fmt.Errorf("%w: the WAL transport's relay needs WALConfig.ConnString", outboxdriver.ErrStreamUnusable)
	}
	r, err := pgwal.Open(ctx, pgwal.ReaderConfig{ConnString: d.cfg.ConnString, Slot: d.cfg.Slot, Publication: d.cfg.Publication, Prefix: walPrefix(t)})
	switch {
	case errors.Is(err, pgwal.ErrSlotBusy):
		return nil, fmt.Errorf("%w: %w", outboxdriver.ErrStreamBusy, err)
	case errors.Is(err, pgwal.ErrWALLevel), errors.Is(err, pgwal.ErrSlotMissing), errors.Is(err, pgwal.ErrSlotLost), errors.Is(err, pgwal.ErrNoReplication), errors.Is(err, pgwal.ErrName):
		return nil, fmt.Errorf("%w: %w", outboxdriver.ErrStreamUnusable, err)
	}
	if err != nil {
		return nil, err
	}
	return &walStream{r: r}, nil
}

// storeWAL writes a stream message into the table; see StoreSQL.
func storeWAL(tbl string) string {
	return `INSERT INTO ` + tbl + ` (id, topic, message_key, payload, headers, state, attempts, available_at, created_at, settled_at, last_error)
VALUES ($1::uuid, $2, NULLIF($3, ''), $4::jsonb, $5::jsonb, $6, $7,
        ` + storeAt + `,
        $10::timestamptz, CASE WHEN $6 = 'dead' THEN now() END, NULLIF($11, ''))
ON CONFLICT (id) DO NOTHING`
}

// storeAt is when a stored stream message is due: $8 a retry's time, else
// $9 its delay in seconds.
const storeAt = `CASE WHEN $8::timestamptz IS NOT NULL THEN greatest(now(), $8::timestamptz) ELSE now() + make_interval(secs => $9::float8) END`

// storeOrderedWAL writes an ordered stream message into the table, with
// StoreSQL's arguments and $12 halt: a message of a key with no live
// message takes its outcome's state ($6) and becomes the key's head; one
// of a key with live messages (a redrive came first) is blocked behind
// them, its attempt counted. The key row counts it live unless it is dead
// under continue at the head; dead under halt, it is the key's halted
// head (settled_at NULL, halted_seq). A message already stored changes
// nothing.
func storeOrderedWAL(t outboxdriver.Table) string {
	return `WITH present AS MATERIALIZED (SELECT 1 FROM ` + quoteTable(t) + ` WHERE id = $1::uuid),
k AS (
    INSERT INTO ` + keysTable(t) + ` AS ks (message_key, last_seq, live, halted_seq)
    SELECT $3, 1, CASE WHEN $6 = 'dead' AND NOT $12::boolean THEN 0 ELSE 1 END, CASE WHEN $6 = 'dead' AND $12::boolean THEN 1 END
    WHERE NOT EXISTS (SELECT 1 FROM present)
    ON CONFLICT (message_key) DO UPDATE SET
        last_seq   = ks.last_seq + 1,
        live       = ks.live + CASE WHEN ks.live = 0 AND excluded.live = 0 THEN 0 ELSE 1 END,
        halted_seq = CASE WHEN ks.live = 0 AND excluded.halted_seq IS NOT NULL THEN ks.last_seq + 1 ELSE ks.halted_seq END
    RETURNING ks.last_seq, ks.live, ks.live > CASE WHEN $6 = 'dead' AND NOT $12::boolean THEN 0 ELSE 1 END AS behind)
INSERT INTO ` + quoteTable(t) + ` (id, topic, message_key, payload, headers, state, attempts, available_at, created_at, settled_at, last_error, key_seq)
SELECT $1::uuid, $2, $3, $4::jsonb, $5::jsonb, CASE WHEN k.behind THEN 'blocked' ELSE $6 END, $7,
    ` + storeAt + `,
    $10::timestamptz, CASE WHEN $6 = 'dead' AND NOT $12::boolean AND NOT k.behind THEN now() END, NULLIF($11, ''), k.last_seq
FROM k`
}

// queueWAL stores an ordered stream message in the table when its key
// has messages there, live or dead; see QueueSQL. Its arguments are
// StoreSQL's first five and $6 the commit time. The message is blocked
// behind the key's live messages, or the key's head when it has only dead
// ones (under ContinueKey: a redrive of one then finds the key's later
// messages in the table, where it takes its place before them). The key
// row's lock orders it with settles: one that empties the key first
// leaves live 0.
func queueWAL(t outboxdriver.Table) string {
	tbl := quoteTable(t)
	return `WITH present AS MATERIALIZED (SELECT 1 FROM ` + tbl + ` WHERE id = $1::uuid),
k AS (
    UPDATE ` + keysTable(t) + ` AS ks SET last_seq = ks.last_seq + 1, live = ks.live + 1
    WHERE ks.message_key = $3 AND NOT EXISTS (SELECT 1 FROM present)
      AND (ks.live > 0 OR EXISTS (SELECT 1 FROM ` + tbl + ` o WHERE o.message_key = $3 AND o.key_seq IS NOT NULL AND o.state = 'dead'))
    RETURNING ks.last_seq, ks.live),
ins AS (
    INSERT INTO ` + tbl + ` (id, topic, message_key, payload, headers, state, available_at, created_at, key_seq)
    SELECT $1::uuid, $2, $3, $4::jsonb, $5::jsonb, CASE WHEN k.live > 1 THEN 'blocked' ELSE 'pending' END, now(), $6::timestamptz, k.last_seq FROM k
    RETURNING 1)
SELECT EXISTS (SELECT 1 FROM present) OR EXISTS (SELECT 1 FROM ins)`
}

// tableKeysWAL lists the keys with ordered messages in the table, through
// the key_seq index (which holds exactly those rows).
func tableKeysWAL(t outboxdriver.Table) string {
	return `SELECT DISTINCT message_key FROM ` + quoteTable(t) + `
WHERE key_seq IS NOT NULL AND state IN ('pending', 'processing', 'blocked', 'dead')`
}

var walTexts = sqlbuild.NewTexts(func(t outboxdriver.Table) [4]string {
	return [4]string{storeWAL(quoteTable(t)), storeOrderedWAL(t), queueWAL(t), tableKeysWAL(t)}
})

// TableKeysSQL lists the keys with ordered messages in table t; see
// outboxdriver.Streamer.
func (d *walDialect) TableKeysSQL(t outboxdriver.Table) string { return walTexts.Get(t)[3] }

// StoreSQL writes stream message m into table t with outcome s, one
// statement; a row with m's id is left as it is.
func (d *walDialect) StoreSQL(t outboxdriver.Table, m *outboxdriver.StreamMessage, s outboxdriver.Settlement, halt bool) (string, []any) {
	state, attempts := "pending", 1
	switch s.Kind {
	case outboxdriver.SettleDead:
		state = "dead"
	case outboxdriver.SettleRetry:
	default: // not handled here: waits for a relay with its handler
		attempts = 0
	}
	var at any
	if !s.At.IsZero() {
		at = s.At
	}
	payload, headers := walJSON(m)
	args := []any{m.ID.String(), m.Topic, m.Key, payload, headers, state, attempts, at, s.Delay.Seconds(), m.CreatedAt, s.Error}
	texts := walTexts.Get(t)
	if m.Ordered {
		return texts[1], append(args, halt)
	}
	return texts[0], args
}

// QueueSQL stores ordered stream message m behind its key's live messages
// in table t, if it has some; see outboxdriver.Streamer.
func (d *walDialect) QueueSQL(t outboxdriver.Table, m *outboxdriver.StreamMessage) (string, []any) {
	payload, headers := walJSON(m)
	return walTexts.Get(t)[2], []any{m.ID.String(), m.Topic, m.Key, payload, headers, m.CreatedAt}
}

// walJSON is m's payload and headers as statement arguments.
func walJSON(m *outboxdriver.StreamMessage) (payload, headers any) {
	if m.Payload != nil {
		payload = string(m.Payload)
	}
	if m.Headers != nil {
		headers = string(m.Headers)
	}
	return payload, headers
}

// walStream is a slot reader as an outboxdriver.Stream.
type walStream struct {
	r *pgwal.Reader
}

func (s *walStream) Next(ctx context.Context) ([]outboxdriver.StreamMessage, error) {
	msgs, err := s.r.Next(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]outboxdriver.StreamMessage, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		out[i] = outboxdriver.StreamMessage{ID: m.ID, Topic: m.Topic, Key: m.Key, Payload: m.Payload, Headers: m.Headers, CreatedAt: m.CommitTime, Ordered: m.Ordered && m.Key != "", Pos: uint64(m.End)}
	}
	return out, nil
}

func (s *walStream) Settled(m *outboxdriver.StreamMessage) { s.r.SettledAt(pglogrepl.LSN(m.Pos)) }

func (s *walStream) Lag(context.Context) (outboxdriver.StreamLag, error) {
	b, at := s.r.Lag()
	return outboxdriver.StreamLag{Bytes: b, Oldest: at}, nil
}

func (s *walStream) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return s.r.Close(ctx)
}
