package pgwal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/oncommit/oncommit/internal/walenv"
)

// Errors a reader fails with before it reads anything.
var (
	// ErrWALLevel: the server's wal_level is not logical.
	ErrWALLevel = errors.New("pgwal: wal_level is not logical")
	// ErrSlotMissing: the replication slot does not exist.
	ErrSlotMissing = errors.New("pgwal: replication slot missing")
	// ErrSlotLost: the slot was invalidated (wal_status = lost), the WAL it
	// needed removed; the messages in that WAL cannot be read.
	ErrSlotLost = errors.New("pgwal: replication slot invalidated")
	// ErrSlotBusy: another connection reads the slot.
	ErrSlotBusy = errors.New("pgwal: replication slot in use")
	// ErrNoReplication: the connection may not replicate (no REPLICATION
	// role attribute, no pg_hba.conf replication line, or a pooler).
	ErrNoReplication = errors.New("pgwal: connection cannot replicate")
)

// ReaderConfig configures a [Reader].
type ReaderConfig struct {
	// ConnString is the database's connection string (URL or key=value);
	// the reader adds replication=database.
	ConnString string
	// Slot and Publication name what [Setup] created.
	Slot, Publication string
	// Prefix is the logical message prefix the reader takes; messages of
	// other prefixes are skipped (and confirmed with their transactions).
	Prefix string
	// StatusInterval is the longest time between two confirmations sent to
	// the server. Defaults to 1s.
	StatusInterval time.Duration
}

// Msg is one message read from the slot.
type Msg struct {
	walenv.Envelope
	// LSN is the position of the logical decoding message that carried it
	// (a publish's messages share one); End the end of its transaction,
	// which Settled takes.
	LSN, End pglogrepl.LSN
	// CommitTime is its transaction's commit time: the message's creation
	// time.
	CommitTime time.Time
}

// Reader reads a slot's messages of one prefix, transaction by
// transaction in commit order, and confirms to the server the end of the
// last transaction whose messages, and every earlier transaction's, are
// all settled. Next is called from one goroutine; Settled from any.
type Reader struct {
	cfg        ReaderConfig
	conn       *pgconn.PgConn
	track      tracker
	walEnd     atomic.Uint64 // the server's WAL end, as last reported
	sent       pglogrepl.LSN // last position confirmed to the server
	nextStatus time.Time
	inTx       bool
	tx         []Msg
}

// Open connects with replication=database, checks the server and the
// slot (typed errors above), and starts streaming from the slot's
// confirmed position.
func Open(ctx context.Context, cfg ReaderConfig) (*Reader, error) {
	for _, n := range [...][2]string{{"slot", cfg.Slot}, {"publication", cfg.Publication}} {
		if err := checkName(n[0], n[1]); err != nil {
			return nil, err
		}
	}
	if cfg.Prefix == "" {
		return nil, fmt.Errorf("%w: empty prefix", ErrName)
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = time.Second
	}
	pc, err := pgconn.ParseConfig(cfg.ConnString)
	if err != nil {
		return nil, err
	}
	pc.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "28000" || pe.Code == "42501") {
			return nil, fmt.Errorf("%w: %v", ErrNoReplication, err)
		}
		return nil, err
	}
	r := &Reader{cfg: cfg, conn: conn}
	if err := r.start(ctx); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return r, nil
}

func (r *Reader) start(ctx context.Context) error {
	// A connection a pooler or a server without replication=database
	// answers as an ordinary one: IDENTIFY_SYSTEM tells.
	if _, err := pglogrepl.IdentifySystem(ctx, r.conn); err != nil {
		return fmt.Errorf("%w: IDENTIFY_SYSTEM: %v", ErrNoReplication, err)
	}
	if err := checkLevel(ctx, r.conn); err != nil {
		return err
	}
	rows, err := query(ctx, r.conn, "SELECT coalesce(wal_status, ''), coalesce(active_pid::text, ''), plugin FROM pg_replication_slots WHERE slot_name = '"+r.cfg.Slot+"'")
	if err != nil {
		return err
	}
	switch {
	case len(rows) == 0:
		return fmt.Errorf("%w: %q (run the migration that creates it)", ErrSlotMissing, r.cfg.Slot)
	case rows[0][0] == "lost":
		return fmt.Errorf("%w: %q has wal_status lost; the messages it held are gone: drop and recreate it", ErrSlotLost, r.cfg.Slot)
	case rows[0][1] != "":
		return fmt.Errorf("%w: %q is read by pid %s", ErrSlotBusy, r.cfg.Slot, rows[0][1])
	case rows[0][2] != "pgoutput":
		return fmt.Errorf("pgwal: slot %q decodes with %q, want pgoutput", r.cfg.Slot, rows[0][2])
	}
	err = pglogrepl.StartReplication(ctx, r.conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.cfg.Publication + "'", "messages 'true'"},
	})
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55006" { // object_in_use: another reader won the race
			return fmt.Errorf("%w: %v", ErrSlotBusy, err)
		}
		return err
	}
	r.nextStatus = time.Now().Add(r.cfg.StatusInterval)
	return nil
}

// Next returns the messages of the next committed transaction that holds
// any of the prefix, in the order they were emitted. Each must be passed
// to Settled once it is settled. While it waits, Next confirms what is
// settled to the server at least every StatusInterval and answers its
// keepalives.
func (r *Reader) Next(ctx context.Context) ([]Msg, error) {
	for {
		if err := r.status(ctx, false); err != nil {
			return nil, err
		}
		rctx, cancel := context.WithDeadline(ctx, r.nextStatus)
		raw, err := r.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && pgconn.Timeout(err) {
				continue
			}
			return nil, err
		}
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			return nil, pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyData:
			msgs, err := r.copyData(ctx, m.Data)
			if err != nil {
				return nil, err
			}
			if len(msgs) > 0 {
				return msgs, nil
			}
		}
	}
}

func (r *Reader) copyData(ctx context.Context, data []byte) ([]Msg, error) {
	if len(data) == 0 {
		return nil, nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return nil, err
		}
		r.walEnd.Store(uint64(ka.ServerWALEnd))
		if !r.inTx {
			r.track.idle(ka.ServerWALEnd)
		}
		return nil, r.status(ctx, ka.ReplyRequested)
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return nil, err
		}
		r.walEnd.Store(uint64(xld.ServerWALEnd))
		return r.decode(xld.WALData)
	}
	return nil, nil
}

func (r *Reader) decode(wal []byte) ([]Msg, error) {
	m, err := pglogrepl.Parse(wal)
	if err != nil {
		return nil, err
	}
	switch m := m.(type) {
	case *pglogrepl.BeginMessage:
		r.inTx, r.tx = true, r.tx[:0]
	case *pglogrepl.LogicalDecodingMessage:
		if !m.Transactional || m.Prefix != r.cfg.Prefix {
			return nil, nil
		}
		// The content aliases the connection's read buffer, which the
		// next receive overwrites.
		es, err := walenv.DecodeAll(bytes.Clone(m.Content))
		if err != nil {
			return nil, fmt.Errorf("at %s: %w", m.LSN, err)
		}
		for _, e := range es {
			r.tx = append(r.tx, Msg{Envelope: e, LSN: m.LSN})
		}
	case *pglogrepl.CommitMessage:
		r.inTx = false
		r.track.add(m.TransactionEndLSN, m.CommitTime, len(r.tx))
		if len(r.tx) == 0 {
			return nil, nil
		}
		out := make([]Msg, len(r.tx))
		for i, msg := range r.tx {
			msg.End, msg.CommitTime = m.TransactionEndLSN, m.CommitTime
			out[i] = msg
		}
		r.tx = r.tx[:0]
		return out, nil
	}
	return nil, nil
}

// Settled records that m is settled (handled, or written to the table
// outbox for its retry): once it and everything before it are, the slot
// moves past its transaction.
func (r *Reader) Settled(m Msg) { r.track.settled(m.End) }

// SettledAt is Settled for a message of the transaction ending at end.
func (r *Reader) SettledAt(end pglogrepl.LSN) { r.track.settled(end) }

// Position is the position the reader may confirm, and the number of
// transactions read whose messages are not all settled.
func (r *Reader) Position() (pglogrepl.LSN, int) { return r.track.position() }

// Lag is how many bytes of WAL the server has written past the position
// the reader may confirm, as of the server's last report, and the commit
// time of the oldest transaction read and not all settled (zero when
// none is).
func (r *Reader) Lag() (bytes int64, oldest time.Time) {
	pos, _ := r.track.position()
	if end := pglogrepl.LSN(r.walEnd.Load()); end > pos {
		bytes = int64(end - pos)
	}
	return bytes, r.track.oldest()
}

// status confirms the settled position to the server when it is due, or
// now when force is true.
func (r *Reader) status(ctx context.Context, force bool) error {
	now := time.Now()
	if !force && now.Before(r.nextStatus) {
		return nil
	}
	pos, _ := r.track.position()
	if pos < r.sent {
		pos = r.sent
	}
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, r.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos}); err != nil {
		return err
	}
	r.sent = pos
	r.nextStatus = now.Add(r.cfg.StatusInterval)
	return nil
}

// Close confirms what is settled, ends the stream and waits for the
// server's answer (so the confirmation is not lost with the connection),
// bounded by 5s, and closes the connection; the server frees the slot for
// another reader.
func (r *Reader) Close(ctx context.Context) error {
	if r.conn.IsClosed() {
		// A failed receive closed it, and is still sending Terminate on
		// it: nothing more may be sent.
		return nil
	}
	err := r.status(ctx, true)
	if err == nil {
		deadline := time.Now().Add(5 * time.Second)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		_ = r.conn.Conn().SetDeadline(deadline)
		_, err = pglogrepl.SendStandbyCopyDone(ctx, r.conn)
	}
	if cerr := r.conn.Close(ctx); err == nil {
		err = cerr
	}
	return err
}
