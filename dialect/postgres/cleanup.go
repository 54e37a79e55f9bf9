package postgres

import (
	"context"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// cleanupSQL reads table $1's dead rows, whether autovacuum is off for
// the server or the table, and the oldest xmin holding back cleanup: a
// session's snapshot (its pid, state and application, when this role may
// read them: pg_stat_activity hides other roles' from a role without
// pg_read_all_stats), a replication slot, a standby's feedback, a
// prepared transaction. Sessions of other databases hold back only the
// shared catalogs: they are left out.
const cleanupSQL = `SELECT
    coalesce((SELECT n_dead_tup FROM pg_stat_all_tables WHERE relid = to_regclass($1)), 0),
    current_setting('autovacuum') <> 'on' OR coalesce((SELECT coalesce(reloptions, '{}') @> ARRAY['autovacuum_enabled=false'] FROM pg_class WHERE oid = to_regclass($1)), false),
    coalesce(h.name, ''), coalesce(h.age_s, 0), coalesce(h.xids, 0)
FROM (SELECT 1) AS one LEFT JOIN LATERAL (
    SELECT * FROM (
        SELECT 'pid ' || pid || ' (' || coalesce(state, 'unknown state') || CASE WHEN application_name <> '' THEN ', application ' || application_name ELSE '' END || ')' AS name,
            extract(epoch FROM now() - xact_start)::float8 AS age_s, age(backend_xmin)::bigint AS xids
        FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() AND datname = current_database()
        UNION ALL
        SELECT 'replication slot ' || slot_name, NULL, age(xmin)::bigint FROM pg_replication_slots WHERE xmin IS NOT NULL
        UNION ALL
        SELECT 'standby ' || application_name || ' (hot_standby_feedback)', NULL, age(backend_xmin)::bigint FROM pg_stat_replication WHERE backend_xmin IS NOT NULL
        UNION ALL
        SELECT 'prepared transaction ' || gid, extract(epoch FROM now() - prepared)::float8, age(transaction)::bigint FROM pg_prepared_xacts WHERE database = current_database()
    ) AS x ORDER BY xids DESC LIMIT 1) AS h ON true`

// ReadCleanup implements outboxdriver.CleanupReader.
func (d *dialect) ReadCleanup(ctx context.Context, db outboxdriver.DB, t outboxdriver.Table) (outboxdriver.Cleanup, error) {
	var c outboxdriver.Cleanup
	var age float64
	rows, err := db.QueryDB(ctx, cleanupSQL, quoteTable(t))
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(&c.DeadRows, &c.AutovacuumOff, &c.Holder, &age, &c.HolderXIDs); err != nil {
			return c, err
		}
	}
	c.HolderAge = time.Duration(max(age, 0) * float64(time.Second))
	return c, rows.Err()
}
