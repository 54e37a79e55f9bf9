package outbox

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
	// statement returns are ignored. When notify is true the statement also
	// sends the wake-up notification (inside the same transaction). rows
	// holds at least one row and at most
	// Capabilities().MaxParams / Capabilities().ParamsPerRow.
	Insert(table Table, rows []Row, notify bool) (query string, args []any)

	// Classify maps an error returned by the driver for a statement of this
	// dialect to one of the outbox sentinels (ErrTxAborted, ErrReadOnlyTx,
	// ErrTableMissing...), wrapping both; it returns err unchanged when it
	// knows no better.
	Classify(err error) error
}

// Capabilities describes what a [Dialect]'s database supports.
type Capabilities struct {
	// Notify is true when Insert can fold a wake-up notification into the
	// statement (PostgreSQL NOTIFY).
	Notify bool
	// SkipLocked is true when claims can use FOR UPDATE SKIP LOCKED.
	SkipLocked bool
	// MaxParams is the most bind parameters one statement may carry.
	MaxParams int
	// ParamsPerRow is the most parameters Insert uses for one row.
	ParamsPerRow int
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
