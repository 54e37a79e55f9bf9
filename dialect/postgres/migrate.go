package postgres

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/oncommit/oncommit/internal/migrate"
	"github.com/oncommit/oncommit/migrations"
	"github.com/oncommit/oncommit/outboxdriver"
)

// Migrate creates or upgrades the outbox table named table ("" means
// outboxdriver.DefaultTable; "schema.name" creates the schema too) by applying the
// embedded migrations that have not run yet.
//
// Everything happens in one transaction that first takes an advisory lock
// (pg_advisory_xact_lock) keyed on the table, so replicas that start together
// apply each migration exactly once: the others wait, then find nothing to do.
// Applied versions are recorded in the table oncommit_migrations, in the
// same schema. pgx users can pass stdlib.OpenDBFromPool(pool).
func Migrate(ctx context.Context, db *sql.DB, table string) (err error) {
	t, migs, err := migrate.Prepare(migrations.Postgres(), table)
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	track := `"oncommit_migrations"`
	if t.Schema != "" {
		track = `"` + t.Schema + `".` + track
	}
	if _, err = tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('oncommit.migrate'), hashtext(`+quoteLiteral(t.String())+`))`); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	if t.Schema != "" {
		if _, err = tx.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS "`+t.Schema+`"`); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
	}
	if err = migrate.Apply(ctx, tx, track, t.Name, migs, "$1, $2, $3"); err != nil {
		return err
	}
	if err = tx.Commit(); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	return nil
}

// TopicIndexSQL returns the statement that creates the optional topic claim
// index of table ("" for the default, as in Migrate):
//
//	CREATE INDEX CONCURRENTLY IF NOT EXISTS "outbox_topic_claim_idx"
//	    ON "outbox" (topic, available_at, id) WHERE state IN ('pending', 'processing')
//
// A relay that takes one topic (one Handle) claims with topic = $1, which
// this index serves in claim order: it never reads the due rows of other
// topics, however many there are (50 due rows behind 200,000 of another
// topic: 5.4 ms against 32.6 ms to deliver them in the bench's skew
// scenario, whose idle relay claims 100 at a time; a busy relay's claims of
// a few rows cost more without it, 50-65 ms each in docs/operations.md,
// "Topic skew"). Without it the claim index (available_at, id) walks them.
// Migrate does not create it: every publish and claim writes one more
// index entry, which cost 5-16% of publish and drain throughput in the
// bench (docs/benchmarks.md). Create it when relays take subsets of a
// table's topics and one topic can pile up ahead of the others. Claims of
// several topics never use it.
//
// CONCURRENTLY does not block publishes, and cannot run inside a
// transaction: run the statement on its own (db.ExecContext). In a
// migration tool that wraps each file in a transaction, drop CONCURRENTLY,
// and publishes wait while the index builds. A concurrent build that fails
// or is cancelled leaves an invalid index, which IF NOT EXISTS then keeps
// (it costs every write and serves no claim): check pg_index.indisvalid,
// and DROP INDEX CONCURRENTLY it before running the statement again.
//
// A bad or too long table name (the index's name must fit PostgreSQL's 63
// bytes) is a *outboxdriver.ConfigError.
func TopicIndexSQL(table string) (string, error) {
	if table == "" {
		table = outboxdriver.DefaultTable
	}
	t, err := outboxdriver.ParseTable(table)
	if err != nil {
		return "", err
	}
	const suffix = "_topic_claim_idx"
	if len(t.Name)+len(suffix) > 63 {
		// PostgreSQL would cut the index's name to 63 bytes, and at 63 the
		// cut name is the table's own: IF NOT EXISTS would create nothing.
		return "", &outboxdriver.ConfigError{Field: "Table", Reason: fmt.Sprintf("%q: the index name %q would pass PostgreSQL's 63 bytes", table, t.Name+suffix)}
	}
	// An index is created in its table's schema: its name is not qualified.
	return `CREATE INDEX CONCURRENTLY IF NOT EXISTS "` + t.Name + suffix + `" ON ` + QuoteTable(t) +
		` (topic, available_at, id) WHERE state IN ('pending', 'processing')`, nil
}
