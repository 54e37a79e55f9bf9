package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// claimBacklog times the ordered claim statement (the dialect's
// ClaimOrdered, with a relay's defaults: 100 heads, a run budget of 400)
// at a backlog of 10,000 and of 1,000,000 ordered rows, each seeded in
// SQL as keys of 10 messages (the first pending, the others blocked). The
// claims alternate between the two tables in blocks; after each, its heads
// and runs are settled as successes (SettleRuns, untimed: the next message
// of a key whose run was cut becomes its head) and as many rows as were
// settled are published again as new keys, so the backlog keeps its size.
// It prints p50 and p99 of each and the ratio of the p99s.
func claimBacklog(ctx context.Context, pool *pgxpool.Pool) {
	const per, blocks, perBlock, warm = 10, 10, 30, 10
	sizes := []int{10_000, 1_000_000}
	fmt.Printf("\n== ordered claim-1m: the ordered claim at a backlog of %d and %d rows (keys of %d), %d claims each (ms, lower is better)\n", sizes[0], sizes[1], per, blocks*perBlock)
	d := postgres.Dialect().(outboxdriver.OrderedDialect)
	db := pgxtx.FromPool(pool)
	type backlog struct {
		ob       *outbox.Outbox
		next     int // the next new key's number
		debt     int // rows settled and not published again yet
		claims   []float64
		seedSecs float64
	}
	bs := make([]*backlog, len(sizes))
	for i, size := range sizes {
		ob := orderedTable(ctx, pool, fmt.Sprintf("claim%d", i), true)
		t0 := time.Now()
		seedOrdered(ctx, pool, ob, 0, size/per, per)
		_, err := pool.Exec(ctx, `VACUUM ANALYZE `+pgsql.QuoteTable(ob.Table()))
		check(err)
		bs[i] = &backlog{ob: ob, next: size / per, seedSecs: time.Since(t0).Seconds()}
	}
	p := outboxdriver.ClaimParams{Topics: []string{"bench"}, Limit: outbox.DefaultBatchSize, Lease: 30 * time.Second, MaxAttempts: 10}
	claimOne := func(b *backlog, timed bool) {
		t0 := time.Now()
		claimed, _, err := d.ClaimOrdered(ctx, db, b.ob.Table(), p, 4*outbox.DefaultBatchSize)
		check(err)
		if timed {
			b.claims = append(b.claims, float64(time.Since(t0).Microseconds())/1000)
		}
		runs := make([]outboxdriver.RunOutcome, len(claimed))
		for i, c := range claimed {
			runs[i] = outboxdriver.RunOutcome{Head: outboxdriver.Fence{ID: c.ID, Attempts: c.Attempts}, Key: c.Key, Done: []outboxdriver.ID{c.ID}}
			for _, m := range c.Run {
				runs[i].Done = append(runs[i].Done, m.ID)
			}
			b.debt += len(runs[i].Done)
		}
		if len(runs) == 0 {
			check(fmt.Errorf("claim-1m: the claim of %s took nothing", b.ob.Table()))
		}
		_, _, err = d.SettleRuns(ctx, db, b.ob.Table(), outboxdriver.SettleParams{}, runs)
		check(err)
		if keys := b.debt / per; keys > 0 {
			seedOrdered(ctx, pool, b.ob, b.next, keys, per)
			b.next += keys
			b.debt -= keys * per
		}
	}
	for _, b := range bs {
		for range warm {
			claimOne(b, false)
		}
	}
	for range blocks {
		for _, b := range bs {
			for range perBlock {
				claimOne(b, true)
			}
		}
	}
	for i, b := range bs {
		fmt.Printf("backlog %9d rows (seeded in %.1fs): claim p50 %6.2f ms  p99 %6.2f ms\n", sizes[i], b.seedSecs, percentile(b.claims, 0.50), percentile(b.claims, 0.99))
	}
	fmt.Printf("p99 ratio 1M / 10k: %.2fx (p50 ratio %.2fx)\n",
		percentile(bs[1].claims, 0.99)/percentile(bs[0].claims, 0.99), percentile(bs[1].claims, 0.50)/percentile(bs[0].claims, 0.50))
}

// seedOrdered stores keys x per ordered messages of topic "bench" in ob's
// table in SQL, as ordered publishes would leave them: keys from key-<from>,
// message 1 of each key pending (its head), the others blocked behind it,
// inserted message j of every key before message j+1 of any; and their key
// rows. The ids grow in insertion order, seed after seed, as the ULIDs of
// publishes made one after another do (the claim takes heads in
// (available_at, id) order, so with the relay's ids a claim's heads lie on
// few heap pages): the statement's time in microseconds, then the row's
// place. With -claim-random-ids they are random (gen_random_uuid), as the
// bench seeded them before: heads claimed in an order unrelated to where
// they lie, one heap page each.
func seedOrdered(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, from, keys, per int) {
	tx, err := pool.Begin(ctx)
	check(err)
	defer tx.Rollback(ctx)
	id := `(lpad(to_hex((extract(epoch FROM statement_timestamp()) * 1000000)::bigint), 14, '0') || lpad(to_hex(row_number() OVER (ORDER BY s, k)), 18, '0'))::uuid`
	if *claimRandomIDs {
		id = `gen_random_uuid()`
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+pgsql.QuoteTable(ob.Table())+` (id, topic, message_key, payload, key_seq, state)
SELECT `+id+`, 'bench', 'key-' || k, '{"n":1}', s, CASE WHEN s = 1 THEN 'pending' ELSE 'blocked' END
FROM generate_series(1, $3::int) s, generate_series($1::int, $1::int + $2::int - 1) k ORDER BY s, k`, from, keys, per)
	check(err)
	_, err = tx.Exec(ctx, `INSERT INTO `+pgsql.QuoteTable(outboxdriver.KeysTable(ob.Table()))+` (message_key, last_seq, live)
SELECT 'key-' || k, $3::int, $3::int FROM generate_series($1::int, $1::int + $2::int - 1) k`, from, keys, per)
	check(err)
	check(tx.Commit(ctx))
}
