package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/oncommit/oncommit/dialect/postgres" // fills in pgsql
	"github.com/oncommit/oncommit/internal/pgsql"
)

// variants times claim statement variants, each followed by the raw delete.
func variants(ctx context.Context, pool *pgxpool.Pool) {
	for round := 1; round <= *rounds; round++ {
		var line []string
		for _, v := range []string{"raw", "ours", "ours-ids-only", "ours-no-case"} {
			ob := table(ctx, pool, "var")
			fill(ctx, pool, ob, *n, "bench")
			tbl := pgsql.QuoteTable(ob.Table())
			q := pgsql.ClaimSQL(ob.Table(), 1)
			args := []any{"bench", 100, 30.0, 10, 0.0} // 0.0: no window
			switch v {
			case "raw":
				q = `WITH due AS MATERIALIZED (SELECT id FROM ` + tbl + ` WHERE state IN ('pending','processing') AND available_at <= now() AND topic = 'bench'
		ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED)
		UPDATE ` + tbl + ` AS o SET state = 'processing', attempts = o.attempts + 1, available_at = now() + interval '30 seconds'
		FROM due WHERE o.id = due.id RETURNING o.id::text`
				args = nil
			case "ours-ids-only":
				q = q[:strings.LastIndex(q, "SELECT")] + "SELECT id::text FROM claimed"
			case "ours-no-case":
				q = `WITH due AS MATERIALIZED (SELECT id FROM ` + tbl + ` WHERE state IN ('pending','processing') AND available_at <= now() AND topic = $1
		ORDER BY available_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)
		UPDATE ` + tbl + ` AS o SET state = 'processing', attempts = o.attempts + 1, available_at = now() + make_interval(secs => $3::float8)
		WHERE o.id = ANY (ARRAY(SELECT id FROM due)) AND $4::int > 0 RETURNING o.id::text, o.topic, o.message_key, o.payload::text, o.headers::text, o.attempts, o.state, o.created_at`
				args = args[:4]
			}
			del := `DELETE FROM ` + tbl + ` WHERE id = ANY($1::uuid[])`
			t0 := time.Now()
			for {
				rows, err := pool.Query(ctx, q, args...)
				check(err)
				var ids []string
				for rows.Next() {
					vals, err := rows.Values()
					check(err)
					ids = append(ids, vals[0].(string))
				}
				check(rows.Err())
				if len(ids) == 0 {
					break
				}
				_, err = pool.Exec(ctx, del, ids)
				check(err)
			}
			line = append(line, fmt.Sprintf("%s %.2fs", v, time.Since(t0).Seconds()))
		}
		fmt.Printf("round %d: %s\n", round, strings.Join(line, ", "))
	}
}
