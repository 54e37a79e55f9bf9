package outboxdriver

import (
	"context"
	"errors"
	"time"
)

// ErrStreamBusy reports a stream that another relay reads: a relay that
// gets it waits and tries again, and takes the stream over once the other
// relay has let it go.
var ErrStreamBusy = errors.New("outbox: the message stream is read by another relay")

// ErrStreamUnusable reports a stream that cannot work until an operator
// acts (the server cannot stream, the stream is missing or was lost): a
// relay's Run fails with it at its start, and logs it as an error after.
var ErrStreamUnusable = errors.New("outbox: the message stream cannot be read")

// Streamer is implemented by a [RelayDialect] whose Insert sends some
// messages through a stream beside the table (PostgreSQL's WAL transport):
// they are never rows unless their delivery fails. A relay of such a
// dialect reads the stream beside its claims: it runs each message's
// handler; a success writes nothing; a failure (or a message of a topic
// it has no handler for) is written into the table with StoreSQL, and the
// table's retries, dead letters and inspection take it from there. Only
// then is the message settled in the stream.
type Streamer interface {
	// OpenStream opens the stream of table t's messages, from the first
	// one not yet settled. It fails with an error wrapping [ErrStreamBusy]
	// when another relay reads the stream, and with another error when
	// the stream cannot work at all (the relay's Run returns it).
	OpenStream(ctx context.Context, t Table) (Stream, error)

	// StoreSQL returns the one statement that writes stream message m
	// into table t with outcome s: a retry is pending with one attempt,
	// due after s.Delay (or at s.At); a dead letter is dead with one
	// attempt; any other kind (a message no handler took) is pending with
	// no attempt, due now. A row with m's id already stored is left as it
	// is (the message was read again after a restart).
	//
	// An ordered message (m.Ordered) enters its key's sequence: as the
	// key's head when the key has no live message in the table, else
	// blocked behind them. Dead under halt, it halts its key as a dead
	// head does; dead otherwise, it lets the key go on.
	StoreSQL(t Table, m *StreamMessage, s Settlement, halt bool) (query string, args []any)

	// QueueSQL returns the one statement that stores ordered message m
	// in table t when its key has messages there (blocked behind the live
	// ones, or the key's head when it has only dead ones), and nothing when
	// it has none (the reader may then deliver m). It returns one row of
	// one boolean: whether m is in the table now (stored by it, or before
	// it by an earlier reader).
	QueueSQL(t Table, m *StreamMessage) (query string, args []any)

	// TableKeysSQL returns the statement, without arguments, that lists
	// the keys with ordered messages in table t (undelivered or dead), one
	// per row. A reader runs it when it opens the stream: a key it does not
	// list, and that the reader has not stored a message of since, has
	// nothing in the table for its next message to queue behind (no
	// publish stores ordered messages in the table, and only the reader
	// writes stream messages there).
	TableKeysSQL(t Table) string
}

// Stream is an open stream of messages; Next is called from one
// goroutine, Settled from any.
type Stream interface {
	// Next waits for the next messages: those of one transaction, in the
	// order they were published, transactions in commit order.
	Next(ctx context.Context) ([]StreamMessage, error)
	// Settled records that m was handled or stored in the table; once m
	// and every message before it are, the stream never gives them again.
	Settled(m *StreamMessage)
	// Lag is how far the stream's reader is behind: the bytes and age of
	// what it has not settled yet.
	Lag(ctx context.Context) (StreamLag, error)
	// Close settles what can be and lets the stream go, for another
	// relay to take.
	Close(ctx context.Context) error
}

// StreamLag is how far a stream's settled position is behind its
// database.
type StreamLag struct {
	// Bytes the database keeps for the stream past its settled position.
	Bytes int64
	// Oldest is when the oldest message read and not settled was
	// committed; zero when none is outstanding.
	Oldest time.Time
}

// StreamMessage is one message read from a stream.
type StreamMessage struct {
	ID        ID
	Topic     string
	Key       string // "" means none
	Payload   []byte // nil means NULL
	Headers   []byte // JSON object, nil means none
	CreatedAt time.Time
	// Ordered is true when the message is delivered in order within Key:
	// one at a time, in commit order, behind the key's messages in the
	// table.
	Ordered bool
	// Pos is the stream's position of the message's transaction, for
	// Settled.
	Pos uint64
}
