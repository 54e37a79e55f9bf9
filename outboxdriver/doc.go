// Package outboxdriver is oncommit's plug-in API: the interfaces that
// dialects (dialect/postgres, dialect/sqlite, dialect/mysql) and adapters
// (adapters/sqltx, adapters/pgxtx) implement, and the values the outbox
// package hands them, as database/sql/driver is to database/sql.
//
// Users of oncommit do not need this package: the outbox package gives
// them the few types they meet (ID, Tx, DB, Dialect, State, TopicStats,
// ConfigError and the sentinel errors) under the same names. Write against
// it to add a database or a driver: a [Dialect] holds all the SQL text of
// one database (a [RelayDialect] can also claim, settle, renew, redrive,
// purge and count), an adapter turns a driver's transaction into a [Tx]
// (never a pool: the method names are chosen so that no pool type satisfies
// it) and a driver's pool into a [DB], with optional capabilities found by
// type assertion ([PreparedDB], [TxDB], [ExecDB], [Listener]). A new
// dialect passes the conformance suite in internal/dialecttest before it
// ships.
//
// This package depends on no other package of oncommit.
package outboxdriver
