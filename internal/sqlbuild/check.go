package sqlbuild

// Columns are the outbox table's columns that every dialect's relay reads
// or writes.
const Columns = "id, topic, message_key, payload, headers, dedup_key, state, attempts, attempts_base, available_at, created_at, settled_at, last_error"

// CheckSQL is a read of every column of the quoted table that returns no
// row: it fails when the table or one of the columns is missing.
func CheckSQL(quoted string) string {
	return "SELECT " + Columns + " FROM " + quoted + " WHERE 1 = 0"
}

// Drain reads rows to their end and closes them, returning the first
// error.
func Drain(rows interface {
	Next() bool
	Err() error
	Close() error
}) error {
	for rows.Next() {
	}
	err := rows.Err()
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	return err
}
