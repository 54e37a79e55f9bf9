// Package mysql is the MySQL and MariaDB dialect of oncommit: all of its SQL
// text.
//
// Use it through database/sql with github.com/go-sql-driver/mysql and
// adapters/sqltx. It needs MySQL 8.0.13+ or MariaDB 10.6+: FOR UPDATE SKIP
// LOCKED came in MySQL 8.0.1 and MariaDB 10.6, and the migrations' expression
// defaults, DEFAULT (UTC_TIMESTAMP(6)), in MySQL 8.0.13. It is tested on
// MariaDB 10.11 and written to hold on MySQL 8 (docs/dialects.md says what
// was verified where).
//
// Publish stores messages with one INSERT on the caller's transaction. With
// a DedupKey it is INSERT ... ON DUPLICATE KEY UPDATE id = id, which skips a
// row whose dedup key is taken without an error (and without INSERT
// IGNORE, which would also turn real errors into warnings), followed by a
// SELECT of the generated ids to learn which rows were stored: MySQL has no
// INSERT ... RETURNING (see [outboxdriver.StoredLister]). Times come from the
// database clock, UTC_TIMESTAMP(6) (microseconds, UTC whatever the
// session's time zone), evaluated per statement. There is no NOTIFY:
// relays poll, every [DefaultPollInterval] unless configured.
//
// The claim is one short transaction on the relay's pool (the pool must
// implement [outboxdriver.TxDB], as sqltx.FromDB does): a plain read (which takes
// no locks) of the next due ids of the relay's topics through the claim
// index (topic, claim_at, id), then SELECT ... FOR UPDATE SKIP LOCKED of
// those ids by primary key, UPDATE, COMMIT, before any handler runs. Every
// statement that reads or changes given rows (the claim's lock and update,
// settles, renewals, the writes of redrive and purge) reaches them through
// a derived table of ids joined by primary key ([keys]), never a
// WHERE id IN (...) that the optimizer may turn into a scan, so a relay
// locks only the rows it takes, settles or renews. Settles and renewals
// lock their rows with SELECT ... FOR UPDATE where they must, so the fence
// (id, attempts, state processing) is checked on rows nobody else can
// change until the commit, and the fences that applied are known exactly
// without UPDATE ... RETURNING.
//
// Under the default REPEATABLE READ, locking reads of a missing row lock
// the gap where it would be; the relay's locking reads name existing rows
// by primary key, so publishers do not wait for claims. A relay
// transaction that still loses a deadlock (error 1213) or times out
// waiting for a lock (1205) is run again, up to Config.LockRetries times
// with a short backoff, and each rerun is reported to Config.OnLockRetry.
// The dialect never retries the caller's statements: Publish returns such
// errors (classified by [outboxdriver.Dialect.Classify]).
//
// Ordered delivery (Config.OrderByKey) needs migrations 0005 and 0006. An
// ordered publish is three statements on the caller's transaction, with no
// trigger: the INSERT stores the ordered rows blocked, then
// [outboxdriver.Sequencer]'s statements take the key rows in key order
// (locks held to the commit) and number the rows from them. Two publishers
// creating new keys in one gap of the keys table can lose a deadlock
// (1213), which Publish returns for the caller to retry; docs/dialects.md
// says why, and what the claim and the settles of runs do.
//
// The relay's statements carry their values as SQL literals (integers,
// ids in their canonical form, and text as hexadecimal literals, topics
// compared byte for byte with CAST(topic AS BINARY)) rather
// than bind parameters, so each is one round trip whatever the DSN's
// interpolateParams setting; nothing a user writes is ever spliced into SQL
// text. Publish binds its values as parameters.
package mysql

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/oncommit/oncommit/internal/oerr"
	"github.com/oncommit/oncommit/internal/sqlbuild"
	"github.com/oncommit/oncommit/outboxdriver"
)

// maxParams is the most bind parameters one MySQL statement may carry.
const maxParams = 65535

// paramsPerRow is the most parameters one inserted row uses: id, topic,
// key, payload, headers, dedup key, and a delay or not-before time.
const paramsPerRow = 7

// MaxJSONDepth is the deepest nesting of arrays and objects a payload may
// have on MySQL/MariaDB: MariaDB's JSON_VALID, which checks the JSON column,
// refuses 32 levels or more (MySQL 8 refuses more than 100). Publish
// refuses deeper payloads before sending anything.
const MaxJSONDepth = 31

// DefaultPollInterval is the relay's default poll interval on MySQL: with
// no notifications, a relay finds new messages only by polling.
const DefaultPollInterval = 200 * time.Millisecond

// DefaultLockRetries is the default of Config.LockRetries.
const DefaultLockRetries = 5

// now is the database clock as stored: UTC with microseconds.
const now = `UTC_TIMESTAMP(6)`

// Config configures the dialect. The zero value works.
type Config struct {
	// LockRetries is how many times the dialect runs one of the relay's
	// transactions again after it lost a deadlock (error 1213) or timed
	// out waiting for a lock (error 1205). Negative means never. Defaults
	// to DefaultLockRetries (5).
	LockRetries int

	// OnLockRetry, when not nil, is called before each such rerun with the
	// operation ("claim", "settle", "renew", "redrive", "purge"), the
	// number of the rerun (1, 2, ...) and the error. It must not block.
	// Count the calls to watch lock contention. Defaults to nil.
	OnLockRetry func(op string, retry int, err error)
}

// Dialect returns the MySQL/MariaDB dialect with the default Config.
func Dialect() outboxdriver.Dialect { return New(Config{}) }

// New returns the MySQL/MariaDB dialect configured by cfg.
func New(cfg Config) outboxdriver.Dialect {
	if cfg.LockRetries == 0 {
		cfg.LockRetries = DefaultLockRetries
	}
	return &dialect{cfg: cfg, insert: &sqlbuild.Insert{
		Placeholder: func(b *strings.Builder, _ int) { b.WriteByte('?') },
		Now:         now,
		Delay: func(b *strings.Builder, p func()) {
			b.WriteString(now + " + INTERVAL ")
			p()
			b.WriteString(" MICROSECOND")
		},
		NotBefore: func(b *strings.Builder, p func()) {
			b.WriteString("GREATEST(" + now + ", CAST(")
			p()
			b.WriteString(" AS DATETIME(6)))")
		},
		DelayArg:     func(r *outboxdriver.Row) any { return r.Delay.Microseconds() },
		NotBeforeArg: func(r *outboxdriver.Row) any { return r.NotBefore.UTC().Format(datetime) },
		OnConflict:   ` ON DUPLICATE KEY UPDATE id = id`,
		// Ordered rows are numbered after the INSERT (SequenceStatements).
		OrderedBlocked: true,
	}}
}

// datetime is the text form of a DATETIME(6) value.
const datetime = "2006-01-02 15:04:05.999999"

type dialect struct {
	cfg    Config
	insert *sqlbuild.Insert
}

func (*dialect) Name() string { return "mysql" }

func (*dialect) Capabilities() outboxdriver.Capabilities {
	// MinLease: the relay's floor. A renewal is one short transaction that
	// locks only the rows it renews, by primary key.
	return outboxdriver.Capabilities{MaxParams: maxParams, ParamsPerRow: paramsPerRow, PollInterval: DefaultPollInterval, MaxJSONDepth: MaxJSONDepth, AllTopics: true, Ordered: true, MinLease: time.Second}
}

// quoteTable returns t as a quoted, possibly database-qualified, identifier.
func quoteTable(t outboxdriver.Table) string {
	if t.Schema == "" {
		return "`" + t.Name + "`"
	}
	return "`" + t.Schema + "`.`" + t.Name + "`"
}

// Insert builds the publish statement, for example, for one message with a
// key, a payload and a DedupKey:
//
//	INSERT INTO `outbox` (id, topic, message_key, payload, dedup_key) VALUES (?, ?, ?, ?, ?)
//	ON DUPLICATE KEY UPDATE id = id
//
// Only the columns some message sets are listed; the ON DUPLICATE KEY
// clause is present only when some message has a DedupKey. Its no-op
// update leaves the stored row as it was and raises no error. available_at
// is left to its default, UTC_TIMESTAMP(6), unless some message is
// scheduled: then UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND for a Delay
// and GREATEST(UTC_TIMESTAMP(6), CAST(? AS DATETIME(6))) for a NotBefore,
// each parameter in its row's place.
func (d *dialect) Insert(t outboxdriver.Table, rows []outboxdriver.Row, _ outboxdriver.Wake) (string, []any) {
	return d.insert.Build(quoteTable(t), t, rows, outboxdriver.Wake{}, func(b []byte) any { return string(b) })
}

// StoredSQL returns the statement Publish runs after an INSERT with a
// DedupKey: the ids among ids now in the table, which the transaction
// itself stored (a generated id cannot belong to anyone else's row).
//
//	SELECT id FROM `outbox` WHERE id IN (?, ?)
func (*dialect) StoredSQL(t outboxdriver.Table, ids []outboxdriver.ID) (string, []any) {
	var b strings.Builder
	b.WriteString("SELECT id FROM " + quoteTable(t) + " WHERE id IN (")
	args := make([]any, len(ids))
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('?')
		args[i] = id.String()
	}
	b.WriteByte(')')
	return b.String(), args
}

// MySQL error numbers the dialect knows.
const (
	errLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	errDeadlock        = 1213 // ER_LOCK_DEADLOCK
	errNoSuchTable     = 1146 // ER_NO_SUCH_TABLE
	errReadOnlyTx      = 1792 // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
	errReadOnlyServer  = 1290 // ER_OPTION_PREVENTS_STATEMENT (--read-only)
)

// Classify maps MySQL errors to the outbox sentinels by error number:
// 1792 (read-only transaction) and 1290 (server running read-only) to
// ErrReadOnlyTx, 1146 (no such table) to ErrTableMissing, 1213 (deadlock:
// InnoDB has rolled the whole transaction back) to ErrTxAborted. A lock
// wait timeout (1205) rolls back only the statement and is returned as is.
// MySQL keeps a transaction usable after the other errors.
func (*dialect) Classify(err error) error {
	var me *mysql.MySQLError
	if err == nil || !errors.As(err, &me) {
		return err
	}
	var sentinel error
	switch me.Number {
	case errReadOnlyTx, errReadOnlyServer:
		sentinel = outboxdriver.ErrReadOnlyTx
	case errNoSuchTable:
		sentinel = outboxdriver.ErrTableMissing
	case errDeadlock: // InnoDB rolled the whole transaction back
		return oerr.Wrap(err, outboxdriver.ErrRetryTx, outboxdriver.ErrTxAborted)
	case errLockWaitTimeout: // the statement was rolled back
		sentinel = outboxdriver.ErrRetryTx
	default:
		return err
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}

// lockConflict reports whether err is a deadlock or a lock wait timeout,
// after which a relay transaction is run again.
func lockConflict(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == errDeadlock || me.Number == errLockWaitTimeout)
}

// text writes s as a hexadecimal utf8mb4 literal: any bytes, no quoting,
// whatever the session's sql_mode.
func text(b *strings.Builder, s string) {
	if s == "" {
		b.WriteString("''")
		return
	}
	b.WriteString("_utf8mb4 X'")
	b.WriteString(hex.EncodeToString([]byte(s)))
	b.WriteString("' COLLATE utf8mb4_bin")
}

// binary writes s as a hexadecimal binary-string literal, X'...'. Compared
// with CAST(column AS BINARY) it matches byte for byte: utf8mb4_bin, the
// columns' collation, is PAD SPACE on MySQL and MariaDB ('t' = 't '), and
// topics that differ only by trailing spaces are different topics.
func binary(b *strings.Builder, s string) {
	b.WriteString("X'")
	b.WriteString(hex.EncodeToString([]byte(s)))
	b.WriteByte('\'')
}

// topicIs is the byte-exact comparison of the topic column with binary
// literals: topicIs + "(X'...', ...)" or topicIs + "= X'...'".
const topicIs = "CAST(topic AS BINARY) "

// micros writes d as an interval: INTERVAL n MICROSECOND.
func micros(b *strings.Builder, d time.Duration) {
	b.WriteString("INTERVAL ")
	b.WriteString(strconv.FormatInt(d.Microseconds(), 10))
	b.WriteString(" MICROSECOND")
}
