package outboxdriver

import (
	"context"
	"time"
)

// Dialect supplies all the SQL text of one database. The dialect packages
// (dialect/postgres, dialect/sqlite, ...) provide one; pass it to [New].
// The outbox package itself holds no SQL.
type Dialect interface {
	// Name is the database's name, such as "postgres".
	Name() string

	// Capabilities tells what the database can do.
	Capabilities() Capabilities

	// Insert returns the one statement, and its arguments, that stores rows
	// in table in one round trip. When some row has a DedupKey, rows whose
	// DedupKey is already taken are skipped, not an error, and the statement
	// returns the id (as text) of each row it stored. When no row has one,
	// every row is stored or the statement fails, and whatever rows the
	// statement returns are ignored. When wake.Send is true the statement
	// also sends the wake-up notification, with wake.Payload, inside the
	// same transaction. rows holds at least one row and at most
	// Capabilities().MaxParams / Capabilities().ParamsPerRow. Insert must
	// not keep rows, or any part of it but its strings and byte slices
	// (which args may hold), after it returns: the caller reuses it.
	Insert(table Table, rows []Row, wake Wake) (query string, args []any)

	// Classify maps an error returned by the driver for a statement of this
	// dialect to one of the outbox sentinels (ErrTxAborted, ErrReadOnlyTx,
	// ErrTableMissing...), wrapping both; it returns err unchanged when it
	// knows no better.
	Classify(err error) error
}

// RowChecker is implemented by a [Dialect] that cannot store some rows
// the outbox otherwise accepts (PostgreSQL's WAL transport and an ordered
// message with a DedupKey or a delay). Publish calls CheckRow on every row
// before any SQL is sent; a non-empty reason refuses the batch with an
// error naming field (a field of the outbox's Message) and reason.
type RowChecker interface {
	CheckRow(r *Row) (field, reason string)
}

// Wake is the wake-up notification a publish statement sends.
type Wake struct {
	// Send is true when the statement notifies.
	Send bool
	// Payload is the notification's payload: "" from an Outbox that
	// notifies on every publish, the follow-up delay (see the outbox
	// package's Config.NotifyInterval) in microseconds, as decimal text,
	// from one that coalesces its notifications.
	Payload string
}

// Capabilities describes what a [Dialect]'s database supports.
type Capabilities struct {
	// Notify is true when Insert can fold a wake-up notification into the
	// statement (PostgreSQL NOTIFY).
	Notify bool
	// MaxParams is the most bind parameters one statement may carry.
	MaxParams int
	// ParamsPerRow is the most parameters Insert uses for one row.
	ParamsPerRow int
	// PollInterval, when not zero, is the relay's default poll interval
	// for this dialect (short where nothing wakes relays, as on SQLite).
	PollInterval time.Duration
	// MaxJSONDepth, when not zero, is the deepest nesting of arrays and
	// objects the database's JSON column accepts, when that is less than
	// MaxPayloadDepth (MariaDB's JSON_VALID refuses 32 levels): Publish
	// refuses deeper payloads before sending anything. Zero means
	// MaxPayloadDepth.
	MaxJSONDepth int
	// Ordered is true when the dialect delivers messages in order per key:
	// its Insert stores rows with Row.Ordered as described at
	// [OrderedDialect], which it implements.
	Ordered bool
	// AllTopics is true when the dialect's claims (Claim, and ClaimOrdered
	// when it orders) honour ClaimParams.AllTopics: a relay with a
	// catch-all handler needs it.
	AllTopics bool
	// AsyncCommit is true when the dialect's claims and settles honour
	// ClaimParams.AsyncCommit and SettleParams.AsyncCommit: their
	// statements commit without waiting for the database's log to reach
	// disk (PostgreSQL's synchronous_commit off, for that statement only).
	AsyncCommit bool
	// MinLease, when not zero, is the shortest lease (the outbox package's
	// RelayConfig.Lease) the dialect's relays accept while they renew
	// leases: longer than the relay's floor of one second where a renewal
	// may wait long for the database (SQLite's write lock, up to the busy
	// timeout), so that a live relay's renewal lands before its lease
	// lapses and no other claim runs the message beside its handler.
	// Zero means the floor.
	MinLease time.Duration
}

// Table is the validated name of the outbox table.
type Table struct {
	// Schema is empty for the connection's default schema.
	Schema string
	// Name is the table's name.
	Name string
}

// String returns the table as written in Config.Table: "schema.name" or "name".
func (t Table) String() string {
	if t.Schema == "" {
		return t.Name
	}
	return t.Schema + "." + t.Name
}

// DB is a connection pool, for the relay and the operations. Build one with
// an adapter: sqltx.FromDB(*sql.DB) or pgxtx.FromPool(*pgxpool.Pool). Each
// statement runs on its own, in autocommit: no relay statement ever holds a
// transaction open while a handler runs.
type DB interface {
	// QueryDB runs one statement outside any transaction.
	QueryDB(ctx context.Context, query string, args ...any) (Rows, error)
}

// PreparedDB is implemented by a [DB] that can keep statements prepared
// for reuse. A dialect whose database parses statements at a cost that
// matters (SQLite, in the same process) runs its hot statements through it;
// the others leave statement caching to the driver (pgx has its own).
// sqltx.DB implements it.
type PreparedDB interface {
	DB
	// QueryPrepared runs query like QueryDB, as a statement prepared the
	// first time and kept for the next calls.
	QueryPrepared(ctx context.Context, query string, args ...any) (Rows, error)
}

// TxDB is implemented by a [DB] that can run several statements in one
// short transaction on one connection, for dialects whose claim needs more
// than one statement (MySQL and MariaDB have no UPDATE ... RETURNING: they
// lock the due rows with SELECT ... FOR UPDATE SKIP LOCKED, then update
// them). sqltx.DB implements it. The relay never calls InTx itself and never
// holds the transaction while a handler runs: the dialect opens it and
// commits it inside one of its methods.
type TxDB interface {
	DB
	// InTx begins a transaction on one connection of the pool (with the
	// database's default isolation level), calls f with a DB whose QueryDB
	// runs on that transaction, then commits; when f returns an error it
	// rolls back and returns that error.
	InTx(ctx context.Context, f func(tx DB) error) error
}

// ExecDB is implemented by a [DB] that can report how many rows a statement
// changed; the DB that sqltx's InTx passes to f implements it. Where the
// database has no RETURNING, a dialect counts the rows its fenced writes
// changed: when every fence held, one statement was enough.
type ExecDB interface {
	// ExecDB runs one statement and returns the number of rows it changed.
	ExecDB(ctx context.Context, query string, args ...any) (int64, error)
}

// StoredLister is implemented by a [Dialect] whose Insert statement cannot
// return the ids of the rows it stored (MySQL has no INSERT ... RETURNING;
// its INSERT ... ON DUPLICATE KEY UPDATE skips duplicates without an
// error). When some message of a Publish has a DedupKey, Publish then runs
// Insert's statement with Tx.ExecTx and, on the same transaction, the
// statement StoredSQL returns, which must return the ids (as text) of
// those of ids that are stored in table t: the transaction sees its own
// rows, so these are the rows the INSERT stored. Publish sends these two
// statements instead of one; without a DedupKey it sends only the INSERT.
type StoredLister interface {
	StoredSQL(t Table, ids []ID) (query string, args []any)
}

// Listener is implemented by a [DB] that can wait for notifications on a
// dedicated connection (PostgreSQL LISTEN).
type Listener interface {
	// CanListen reports, without I/O, whether ListenDB can work: nil, an
	// error wrapping [ErrUnsupported] when the driver cannot listen (the
	// relay then polls only, or fails at construction with
	// RelayConfig.Listen ListenOn), or another error (such as a
	// [*ConfigError] for a pool too small to spare the listener its
	// connection) that makes the relay fail at construction.
	CanListen() error

	// ListenDB opens a dedicated connection, runs listenSQL on it, calls
	// wake once when listening (with payload "") and once per notification
	// (with its payload), and blocks until ctx ends (returning nil) or the
	// connection fails (returning the error).
	ListenDB(ctx context.Context, listenSQL string, wake func(payload string)) error
}

// RelayDialect is the part of a dialect the relay and the operations need.
// A dialect without it can publish but cannot relay.
type RelayDialect interface {
	Dialect

	// Claim takes at most p.Limit due messages of p.Topics (of every
	// topic with p.AllTopics) in
	// (available_at, id) order, skipping rows locked by other relays, in
	// one statement (or one short transaction) that commits before it
	// returns: each claimed row gets state processing, attempts + 1 and a
	// lease of p.Lease on the database clock. A row that already had
	// p.MaxAttempts attempts since its last redrive (attempts -
	// attempts_base >= p.MaxAttempts) is dead-lettered instead and
	// returned with Dead set, without its attempts growing.
	//
	// It also settles p.Done as successes (fenced as in Settle) and returns
	// the fences that applied: under load the relay writes its outcomes with
	// its next claim. PostgreSQL does both in one statement and one commit;
	// a dialect whose commits are cheap may use two statements. If Claim
	// fails, the relay writes p.Done again later (fenced, so harmlessly).
	// done may be p.Done itself (all applied) or share its memory: the
	// relay reads it before it reuses p.Done's buffer, and copies it for
	// anything that may keep it.
	Claim(ctx context.Context, db DB, t Table, p ClaimParams) (claimed []Claimed, done []Fence, err error)

	// Settle applies settlements, each fenced by (id, attempts) and state
	// processing, and returns the fences that applied.
	Settle(ctx context.Context, db DB, t Table, p SettleParams, s []Settlement) ([]Fence, error)

	// Renew extends the leases of held messages, fenced like Settle, and
	// returns the fences still held.
	Renew(ctx context.Context, db DB, t Table, lease time.Duration, held []Fence) ([]Fence, error)

	// Redrive makes dead messages (of topic, or all when topic is "")
	// pending again, due now, and returns how many. It keeps attempts (a
	// fence must never repeat: a stale relay's late outcome of an earlier
	// claim must not match a claim made after the redrive) and sets
	// attempts_base to attempts, so the message gets MaxAttempts new
	// attempts.
	Redrive(ctx context.Context, db DB, t Table, topic string) (int64, error)

	// Purge deletes messages in the given terminal states settled more than
	// olderThan ago, in bounded batches (each its own short statement, so a
	// large backlog never needs one long transaction and publishers
	// interleave), until a batch deletes fewer than its limit or ctx ends,
	// and returns how many it deleted: on an error, the count deleted so far
	// with the error.
	Purge(ctx context.Context, db DB, t Table, states []State, olderThan time.Duration) (int64, error)

	// Stats returns counts per topic.
	Stats(ctx context.Context, db DB, t Table) ([]TopicStats, error)

	// ListenSQL is the statement a listener runs, "" when the dialect has
	// no notifications.
	ListenSQL(t Table) string

	// Check makes sure, with one cheap read that changes nothing, that
	// table t exists and has the columns Claim needs. It returns an error
	// wrapping [ErrTableMissing] when the table does not exist, one
	// wrapping [ErrSchemaMismatch] when it lacks columns, and the driver's
	// error when it cannot tell (the database is unreachable, say). The
	// relay runs it when it starts.
	Check(ctx context.Context, db DB, t Table) error
}

// State is the state of a message row.
type State string

// The states of a message row.
const (
	StatePending    State = "pending"
	StateProcessing State = "processing"
	StateDelivered  State = "delivered"
	StateDead       State = "dead"
	// StateBlocked is an ordered message waiting behind the head of its
	// key (see [OrderedDialect]): no claim sees it; the settle of the
	// message before it makes it pending.
	StateBlocked State = "blocked"
)

// ClaimParams are the parameters of [RelayDialect.Claim].
type ClaimParams struct {
	// Topics are the topics to claim. With AllTopics, the claim takes
	// every topic, and Topics (the topics with handlers of their own,
	// possibly none) filter nothing: a dialect may use them to reuse
	// topic strings.
	Topics      []string
	AllTopics   bool
	Limit       int
	Lease       time.Duration
	MaxAttempts int
	// Done are successes to settle in the same commit, with Settle's
	// SettleParams.KeepDelivered.
	Done          []Fence
	KeepDelivered bool
	// AsyncCommit: the claim's statement commits without waiting for the
	// log flush (see Capabilities.AsyncCommit).
	AsyncCommit bool
	// Recent, when not zero, lets the claim skip rows that became due
	// more than Recent before it (their available_at): a dialect that
	// implements [WindowedClaimer] reads only the claim index's recent
	// end, not the entries of deleted rows before it that a held MVCC
	// horizon keeps. Zero claims every due row. A dialect without
	// WindowedClaimer ignores it.
	Recent time.Duration
}

// WindowedClaimer is implemented by a [RelayDialect] whose claims honour
// ClaimParams.Recent. The relay claims in windows that overlap and
// follow the claims it has made, and asks OldestDue now and then (away
// from its claims) whether a row due before its window is waiting: a
// publish committed late (its transaction's timestamps are older than
// the window), a NotBefore in the past, a row another statement held
// locked when the window passed it.
type WindowedClaimer interface {
	// OldestDue looks for the oldest due row of p's topics (of every
	// topic with p.AllTopics) as a claim without a window would, and
	// locks nothing.
	OldestDue(ctx context.Context, db DB, t Table, p ClaimParams) (Due, error)
}

// Due is what [WindowedClaimer.OldestDue] found.
type Due struct {
	// Found is false when no row is due; Age is how long ago the oldest
	// became due.
	Found bool
	Age   time.Duration
	// Took is the look's own time on the server: what a claim without a
	// window spends reading the index up to the first due row.
	Took time.Duration
}

// Claimed is a row returned by [RelayDialect.Claim].
type Claimed struct {
	ID      ID
	Topic   string
	Key     string
	Payload []byte
	Headers []byte
	// Attempts is the row's attempts column after the claim: the claims of
	// the message ever made, never reset (Redrive keeps it), so that with
	// ID it fences this claim and no later one.
	Attempts int
	// AttemptsBase is the row's attempts_base column: Attempts when the
	// message was last redriven, 0 if never. The attempt the handler sees,
	// and the one MaxAttempts bounds, is Attempts - AttemptsBase.
	AttemptsBase int
	CreatedAt    time.Time
	// Dead is true when the claim dead-lettered the row (max attempts).
	Dead bool
	// KeySeq is the row's place in its key's order (key_seq), 0 for an
	// unordered message. Set by [OrderedDialect.ClaimOrdered] only.
	KeySeq int64
	// Run, for an ordered head claimed by [OrderedDialect.ClaimOrdered],
	// are the messages that follow it in its key, in key order: blocked
	// rows the claim read without changing them (their Attempts are those
	// stored, not incremented). The head's claim (its ID and Attempts)
	// fences the whole run.
	Run []Claimed
}

// Fence identifies one claim of a message: settles and renewals apply only
// while the row still has these attempts and state processing.
type Fence struct {
	ID       ID
	Attempts int
}

// SettleKind is the outcome of a delivery.
type SettleKind int

// The outcomes of a delivery.
const (
	SettleDone  SettleKind = iota + 1 // handled: delete, or mark delivered
	SettleRetry                       // reschedule
	SettleDead                        // dead-letter (or delete when discarding)
)

// Settlement is one outcome to write.
type Settlement struct {
	Fence
	Kind  SettleKind
	Delay time.Duration // SettleRetry: from now on the database clock
	At    time.Time     // SettleRetry: absolute time, when not zero
	Error string        // recorded as last_error
}

// SettleParams are the relay settings Settle applies.
type SettleParams struct {
	KeepDelivered bool // mark done rows delivered instead of deleting them
	DiscardDead   bool // delete dead rows instead of keeping them
	AsyncCommit   bool // commit without waiting for the log flush (see Capabilities.AsyncCommit)
}

// TopicStats are the counts of one topic.
type TopicStats struct {
	Topic string
	// Subscriber is "" for the messages of Topic without subscribers,
	// else the subscriber whose copies these counts are (see the outbox
	// package's Config.Subscribers): a topic with subscribers has one
	// TopicStats per subscriber with copies stored.
	Subscriber string
	Pending    int64
	Processing int64
	Delivered  int64
	Dead       int64
	// Due are the pending messages that are due now (on the database
	// clock): Pending less those scheduled for later (a Delay, a retry's
	// backoff, a RetryAt).
	Due int64
	// OldestPending is the age of the oldest pending message that is due,
	// on the database clock; zero when none is.
	OldestPending time.Duration

	// The fields below are filled by [OrderedDialect.StatsOrdered] only.

	// Blocked are the ordered messages of the topic waiting behind the
	// head of their key.
	Blocked int64
	// HeldKeys are the keys whose head is a message of this topic and
	// that have messages waiting behind it.
	HeldKeys int64
	// BlockedKeys are the keys whose head is a message of this topic that
	// failed: dead under the Halt policy (the key waits for a redrive or
	// a skip), or pending a retry.
	BlockedKeys int64
	// OldestBlockedKey is the age (since it was published) of the oldest
	// head among BlockedKeys; zero when there is none.
	OldestBlockedKey time.Duration
}

// Cleanup is what keeps a table's deleted rows from being reclaimed, as
// read by [CleanupReader].
type Cleanup struct {
	// DeadRows is the table's dead row versions, as the database last
	// counted them (PostgreSQL: pg_stat_all_tables.n_dead_tup).
	DeadRows int64
	// AutovacuumOff is true when autovacuum is off for the server or the
	// table.
	AutovacuumOff bool
	// Holder names the oldest snapshot or transaction holding back
	// cleanup ("pid 4242 (idle in transaction, application psql)",
	// "replication slot s1", "prepared transaction g1"), "" when none is
	// open or none can be read.
	Holder string
	// HolderAge is how long the holder's transaction has been open, 0
	// when unknown (a replication slot, a standby).
	HolderAge time.Duration
	// HolderXIDs is the holder's xmin age, in transaction ids.
	HolderXIDs int64
}

// CleanupReader is implemented by a [RelayDialect] that can read what
// keeps a table's deleted rows (PostgreSQL).
type CleanupReader interface {
	ReadCleanup(ctx context.Context, db DB, t Table) (Cleanup, error)
}
