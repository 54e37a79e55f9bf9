package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	_ "github.com/oncommit/oncommit/dialect/postgres" // fills in pgsql
	"github.com/oncommit/oncommit/internal/pgsql"
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
			// The statistics of this connection's updates reach
			// pg_stat_user_tables when it flushes them (PostgreSQL 15:
			// at most once a second); ask for it now. Older servers lack
			// the function: their counts may then be behind.
			if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
				fmt.Printf("ordered   (pg_stat_force_next_flush: %v; the counts below may be behind)\n", err)
			}
			var upd, hot int64
			check(conn.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass`,
				pgsql.QuoteTable(outboxdriver.KeysTable(ob.Table()))).Scan(&upd, &hot))
			fmt.Printf("ordered   keys table: %d updates, %d HOT\n", upd, hot)
		}
		conn.Release()
	}
}

// publishCPU measures the CPU a publish of one message per transaction
// costs, ordered against unordered, 8 producers on 8 keys (as
// publish-keys) through the pool: this process's (getrusage) and that of
// the server backends of the bench database (/proc, so only with the server
// on this host), per message, in alternating rounds of 8 x 1,000
// transactions after a warm-up of 8 x 20. CPU per message moves less with
// the host's load than throughput does, but it still moves (caches,
// contention): compare medians of the same run.
func publishCPU(ctx context.Context, pool *pgxpool.Pool) {
	const producers, warm, per = 8, 20, 1000
	fmt.Printf("\n== ordered publish-cpu: CPU per message of a publish 1/tx, %d producers on %d keys, %d alternating rounds (microseconds, lower is better)\n", producers, producers, *rounds)
	side := map[bool]string{false: "unordered", true: "ordered"}
	client, server := map[bool][]float64{}, map[bool][]float64{}
	for round := 1; round <= *rounds; round++ {
		order := []bool{false, true}
		if round%2 == 0 {
			order = []bool{true, false}
		}
		for _, ordered := range order {
			ob := orderedTable(ctx, pool, "ordered", ordered)
			publishKeys(ctx, pool, ob, producers, warm, false)
			s0, c0 := backendCPU(ctx, pool), processCPU()
			publishKeys(ctx, pool, ob, producers, per, false)
			c1, s1 := processCPU(), backendCPU(ctx, pool)
			n := float64(producers * per)
			c, s := float64((c1-c0).Microseconds())/n, float64((s1-s0).Microseconds())/n
			client[ordered], server[ordered] = append(client[ordered], c), append(server[ordered], s)
			fmt.Printf("round %d %-9s client %6.1f server %6.1f us/msg\n", round, side[ordered], c, s)
		}
	}
	for _, ordered := range []bool{false, true} {
		c, s := client[ordered], server[ordered]
		fmt.Printf("%-9s client %.1f (%.1f-%.1f) server %.1f (%.1f-%.1f) us/msg, medians (min-max)\n", side[ordered],
			median(c), slices.Min(c), slices.Max(c), median(s), slices.Min(s), slices.Max(s))
	}
}

// backendCPU is the CPU time (user and system) of the server backends
// connected to the bench database, read from /proc (0 for those not
// visible: a server on another host).
func backendCPU(ctx context.Context, pool *pgxpool.Pool) time.Duration {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	check(err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	check(err)
	var ticks int64
	for _, pid := range pids {
		if comm, f := procStat(strconv.Itoa(pid)); comm != "" {
			ticks += statTicks(f, 14, 15) // utime, stime
		}
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}
