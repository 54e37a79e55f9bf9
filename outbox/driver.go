package outbox

import "github.com/oncommit/oncommit/outboxdriver"

// The types a user of this package meets in its signatures, defined with
// the plug-in API in package outboxdriver (which dialects and adapters
// implement, as database/sql/driver is to database/sql) and given here
// under the same names.
type (
	// ID identifies one message; see [outboxdriver.ID].
	ID = outboxdriver.ID
	// Tx is the caller's transaction, from an adapter (sqltx.From,
	// pgxtx.From, pgxtx.FromConn); see [outboxdriver.Tx].
	Tx = outboxdriver.Tx
	// DB is a pool for the relay and the operations, from an adapter
	// (sqltx.FromDB, pgxtx.FromPool); see [outboxdriver.DB].
	DB = outboxdriver.DB
	// Dialect is a database's SQL, from a dialect package
	// (postgres.Dialect(), sqlite.Dialect(), mysql.Dialect()).
	Dialect = outboxdriver.Dialect
	// Table is the validated name of the outbox table.
	Table = outboxdriver.Table
	// State is the state of a message row.
	State = outboxdriver.State
	// TopicStats are the counts of one topic, from [Outbox.Stats].
	TopicStats = outboxdriver.TopicStats
	// ConfigError reports an invalid configuration field; it wraps
	// [ErrInvalidConfig].
	ConfigError = outboxdriver.ConfigError
)

// The states of a message row.
const (
	StatePending    = outboxdriver.StatePending
	StateProcessing = outboxdriver.StateProcessing
	StateDelivered  = outboxdriver.StateDelivered
	StateDead       = outboxdriver.StateDead
)

// NewID returns a new, time-ordered message id.
func NewID() ID { return outboxdriver.NewID() }

// ParseID parses the text form of an id (the canonical UUID form).
func ParseID(s string) (ID, error) { return outboxdriver.ParseID(s) }

// ParseTable validates a table name of the form "name" or "schema.name".
func ParseTable(s string) (Table, error) { return outboxdriver.ParseTable(s) }

// Sentinel errors; see package outboxdriver for who returns each. Match
// them with [errors.Is].
var (
	ErrNilTx            = outboxdriver.ErrNilTx
	ErrNotInTransaction = outboxdriver.ErrNotInTransaction
	ErrTxDone           = outboxdriver.ErrTxDone
	ErrTxAborted        = outboxdriver.ErrTxAborted
	ErrReadOnlyTx       = outboxdriver.ErrReadOnlyTx
	ErrRetryTx          = outboxdriver.ErrRetryTx
	ErrTableMissing     = outboxdriver.ErrTableMissing
	ErrSchemaMismatch   = outboxdriver.ErrSchemaMismatch
	ErrInvalidConfig    = outboxdriver.ErrInvalidConfig
	ErrUnsupported      = outboxdriver.ErrUnsupported
)
