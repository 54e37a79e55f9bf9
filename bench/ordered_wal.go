package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// publishWAL reads, through pg_walinspect, the WAL that publishing one
// message per transaction writes, ordered against unordered, on one
// connection (so no other load can change it): 8 keys in turn, after a
// warm-up of 50 transactions per key. A transaction's records are those
// with its xid, plus the records without an xid (pruning, ...) on the
// bench database's relations in the same LSN range. It prints records,
// bytes and full-page-image bytes per transaction, by record type, and
// the share of HOT updates of the keys table.
func publishWAL(ctx context.Context, pool *pgxpool.Pool) {
	const keys, warm, n = 8, 50, 800
	fmt.Printf("\n== ordered publish-wal: WAL per transaction of a publish of one message, %d keys in turn, %d transactions on one connection (pg_walinspect)\n", keys, n)
	_, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
	check(err)
	for _, ordered := range []bool{false, true} {
		ob := orderedTable(ctx, pool, "ordered", ordered)
		conn, err := pool.Acquire(ctx)
		check(err)
		publish := func(i int, xids []string) []string {
			tx, err := conn.Begin(ctx)
			check(err)
			_, err = ob.Publish(ctx, pgxtx.From(tx), outbox.Message{Topic: "bench", Key: fmt.Sprintf("producer-%d", i%keys), Payload: []byte(`{"n":1}`)})
			check(err)
			if xids != nil {
				var x string
				check(tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&x))
				v, err := strconv.ParseUint(x, 10, 64)
				check(err)
				xids = append(xids, strconv.FormatUint(v%(1<<32), 10)) // the WAL's 32-bit xid
			}
			check(tx.Commit(ctx))
			return xids
		}
		for i := range keys * warm {
			publish(i, nil)
		}
		var start, end string
		check(conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&start))
		xids := make([]string, 0, n)
		for i := range n {
			xids = publish(i, xids)
		}
		check(conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end))
		rows, err := conn.Query(ctx, `SELECT resource_manager || ' ' || record_type, count(*), sum(record_length), sum(fpi_length)
FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
WHERE xid::text = ANY($3::text[])
   OR (xid::text = '0' AND block_ref LIKE '%/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/%')
GROUP BY 1 ORDER BY 1`, start, end, xids)
		check(err)
		side := map[bool]string{false: "unordered", true: "ordered"}[ordered]
		var recs, bytes, fpi float64
		for rows.Next() {
			var kind string
			var c, b, f int64
			check(rows.Scan(&kind, &c, &b, &f))
			recs, bytes, fpi = recs+float64(c), bytes+float64(b), fpi+float64(f)
			fmt.Printf("  %-9s %-24s %5.2f records %6.1f bytes %6.1f fpi bytes per tx\n", side, kind, float64(c)/n, float64(b)/n, float64(f)/n)
		}
		check(rows.Err())
		rows.Close()
		fmt.Printf("%-9s total: %.2f records, %.0f bytes (%.0f of full-page images) per transaction\n", side, recs/n, bytes/n, fpi/n)
		if ordered {
			var upd, hot int64
			check(conn.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass`,
				postgres.QuoteTable(outboxdriver.KeysTable(ob.Table()))).Scan(&upd, &hot))
			fmt.Printf("ordered   keys table: %d updates, %d HOT\n", upd, hot)
		}
		conn.Release()
	}
}
