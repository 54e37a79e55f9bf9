package outboxdriver

import "context"

// KeysTable is the table of the per-key sequences of ordered messages
// beside outbox table t: t's name with "_keys" appended, in t's schema.
// It has one row per key ever published ordered: message_key (primary
// key), last_seq (the last key_seq given), live (the key's ordered
// messages not yet settled for good, a Halt-dead head included) and
// halted_seq (the key_seq of a head dead under the Halt policy, else
// NULL).
func KeysTable(t Table) Table { return Table{Schema: t.Schema, Name: t.Name + "_keys"} }

// MaxOrderedTableName is the longest outbox table name (without schema)
// with which messages can be ordered: KeysTable appends 5 bytes and
// identifiers hold 63.
const MaxOrderedTableName = 63 - len("_keys")

// OrderedDialect is implemented by a [RelayDialect] whose
// Capabilities().Ordered is true: it delivers the messages of one key in
// the order their publishes committed, one at a time, while other keys
// flow.
//
// Publish. Insert stores each row with Ordered as follows, on the caller's
// transaction. It takes the row lock of the key's row in KeysTable (keys
// of a batch in sorted order, so that batches cannot deadlock each other),
// adds the batch's messages of that key to last_seq and live, and gives
// them consecutive key_seq values: the lock is held until the commit, so
// publishers of one key serialise and key_seq order is commit order; a
// rollback takes the numbers back. The first of them is the key's head
// (state pending) when the key had no live message before; every other
// ordered row is stored in state blocked, which no claim reads. When no
// ordered row has a DedupKey, Insert does all this in its one statement.
// When one has (a duplicate must not count in live), Insert stores the
// ordered rows blocked without a key_seq, and Publish then runs, on the
// same transaction, the statement SequenceSQL returns for the ids the
// INSERT stored.
// A dialect that is a [Sequencer] (MySQL) always takes the second path,
// with the statements SequenceStatements returns.
//
// Relay. A relay of an Outbox with OrderByKey claims with ClaimOrdered
// and settles the runs of ordered heads with SettleRuns; unordered rows
// are settled with Settle as always.
type OrderedDialect interface {
	RelayDialect

	// SequenceSQL returns the statement that numbers the ordered rows
	// among ids (stored blocked without key_seq by Insert, in this
	// transaction) as Insert does in its one-statement form: ids are in
	// publish order. A dialect whose Insert numbers ordered rows in its
	// one statement whatever their DedupKey (SQLite, through a trigger)
	// returns an empty query, and Publish sends nothing more.
	SequenceSQL(t Table, ids []ID) (query string, args []any)

	// ClaimOrdered claims like Claim, with these differences: it never
	// dead-letters at claim (the relay settles a spent head through
	// SettleRuns, which applies its key's dead-letter policy, and a spent
	// unordered row through Settle); each claimed row carries its KeySeq;
	// and each claimed ordered head carries its Run: the blocked messages
	// that follow it in its key, in key_seq order, stopping before the
	// first one that is not due or whose topic is not among p.Topics (with
	// p.AllTopics, every topic is).
	// runLimit bounds the run members of the whole claim (so its memory):
	// they are shared among the heads round-robin, each run a prefix of
	// its key, so that one hot key gets a run of runLimit. The run's rows
	// are left blocked.
	ClaimOrdered(ctx context.Context, db DB, t Table, p ClaimParams, runLimit int) (claimed []Claimed, done []Fence, err error)

	// SettleRuns writes the outcomes of claimed runs in one transaction:
	// it first locks the key rows of the runs in key order, skipping a key
	// row another transaction holds (an open publish of the key, another
	// settle): the runs of such a key are neither written nor fenced off,
	// but returned in busy (their indexes in runs) for the caller to write
	// later, so that one open publishing transaction delays only its own
	// key. Then, for each run whose key it locked and whose head still
	// holds its Fence (state processing), checked on the head's newest row
	// version in the write itself and held locked to commit (a run whose
	// head does not is left alone entirely): it deletes its successes
	// (marks them delivered with p.KeepDelivered), turns its failed
	// message, if any, into the key's head again (pending after the delay,
	// attempts + 1 for a run member) or dead, and when the key is left
	// without a head (all succeeded, or dead under Continue), makes the
	// next blocked message of the key pending. A head dead under Halt
	// stays dead as the key's head: the key waits. It returns the head
	// fences that applied. p.DiscardDead does not apply: dead ordered
	// messages are kept. A dialect with one writer at a time (SQLite),
	// where no other transaction can hold a key row, never returns busy.
	SettleRuns(ctx context.Context, db DB, t Table, p SettleParams, runs []RunOutcome) (applied []Fence, busy []int, err error)

	// RedriveOrdered is Redrive for a table with ordered messages: dead
	// unordered messages become pending as in Redrive; dead ordered ones
	// re-enter their keys (blocked, and the first of a key without a head
	// becomes pending), never all at once. Their place (docs/internals.md,
	// invariant I5): a dead message that halts its key (the key's halted
	// head) keeps its place at the front and becomes the key's head
	// again; any other (dead under the Continue policy, or a skipped head)
	// takes a new key_seq after every message of its key published before
	// the redrive (last_seq grows by one for each), several of one key in
	// their old order: a function of the key's messages and the redrive,
	// never of how far a relay's run had got. It locks the keys of the
	// messages it redrives before it changes them, and changes only
	// messages of keys it locked.
	RedriveOrdered(ctx context.Context, db DB, t Table, topic string) (int64, error)

	// SkipHead skips the head of key when it is dead under Halt and, when
	// head is not the zero ID, is that message (a fence: an operator who
	// read the head skips it and no other): the message stays dead (a
	// later redrive re-enters it at its place), the key's next message
	// becomes its head. It returns the skipped message's id, or ok false
	// when the key has no such dead head.
	SkipHead(ctx context.Context, db DB, t Table, key string, head ID) (id ID, ok bool, err error)

	// StatsOrdered is Stats with the fields of ordered delivery filled.
	StatsOrdered(ctx context.Context, db DB, t Table) ([]TopicStats, error)

	// CheckOrdered is Check for the columns and table ordered delivery
	// needs (key_seq, KeysTable).
	CheckOrdered(ctx context.Context, db DB, t Table) error
}

// RunOutcome is the outcome of one claimed ordered head and its run.
type RunOutcome struct {
	// Head is the claim of the run's head: it fences the whole run.
	Head Fence
	// Key is the run's message key.
	Key string
	// Done are the ids of the messages handled, in order: a prefix of the
	// head and its run.
	Done []ID
	// Failed, when its Kind is not zero, is the outcome of the message
	// after Done, which failed: SettleRetry (it becomes the key's head,
	// pending after Delay or at At) or SettleDead. Its Fence.Attempts is
	// the message's attempts after this delivery: the head's claimed
	// attempts, or a run member's stored attempts + 1.
	Failed Settlement
	// Halt, with Failed.Kind SettleDead, keeps the dead message as the
	// key's head: nothing behind it is delivered until it is redriven or
	// skipped. Without Halt the key goes on with its next message.
	Halt bool
}

// Sequencer is implemented by an [OrderedDialect] that numbers the ordered
// rows of every publish after its INSERT, in several statements: MySQL and
// MariaDB, where a statement writes one table and no trigger numbers rows.
// Its Insert stores every ordered row blocked without a key_seq (as other
// dialects do only with a DedupKey), and Publish then runs, in order on the
// caller's transaction, the statements SequenceStatements returns for the
// ordered rows the INSERT stored (ids in publish order: every ordered row's
// when the batch has no DedupKey), instead of SequenceSQL's statement. They
// take the key rows in key order, as Insert does on other dialects, so
// the locks, the numbering and the head are as described at
// [OrderedDialect].
type Sequencer interface {
	SequenceStatements(t Table, ids []ID) []Statement
}

// Statement is one SQL statement and its arguments.
type Statement struct {
	Query string
	Args  []any
}

// KeyTrimmer is implemented by an [OrderedDialect] that can delete the
// rows of KeysTable no longer needed; a relay of an Outbox with
// OrderByKey runs it from its janitor, every JanitorEvery. A dialect
// without it keeps every key row forever.
//
// TrimKeys deletes at most limit key rows (one short transaction) with
// live = 0, no halted head (halted_seq NULL) and no message of the key
// left in t in a state that is not settled for good (pending, processing,
// blocked or dead: a redrive of a dead message, even one dead under the
// Continue policy, joins on its key row and must find its last_seq, so
// that the numbers are not given again). It skips a key row held by an
// open transaction (a publisher of the key, a settle) rather than wait,
// and returns how many rows it deleted.
//
// A publisher of a trimmed key then creates its row again, with last_seq
// restarting at 1. That cannot break the key's order: no message of the
// key is left to be ordered against, and the deletion commits under the
// key row's lock, which the publisher's upsert takes too (it waits for
// the deletion, or the trim skips the row it holds). Delivered messages
// kept by RelayConfig.KeepDelivered are not live, so they do not keep a
// key row: their key_seq values repeat across generations of a key, and
// key_seq orders a key's messages only within one generation (settled_at
// orders the history).
type KeyTrimmer interface {
	TrimKeys(ctx context.Context, db DB, t Table, limit int) (int64, error)
}
