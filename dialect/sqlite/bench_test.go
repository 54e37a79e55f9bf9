package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
)

// BenchmarkPublish measures one Publish inside an open transaction on a
// SQLite file (WAL, synchronous=NORMAL) beside a raw INSERT of the same row
// into the same table, committing every 500 operations alike:
//
//	go test ./dialect/sqlite -run '^$' -bench Publish -count 6
func BenchmarkPublish(b *testing.B) {
	payload := []byte(`{"order_id":"0193a1f2","email":"someone@example.com","total_cents":4200}`)
	msg := outbox.Message{Topic: "order.placed", Key: "0193a1f2", Payload: payload}
	for _, mode := range []string{"raw-insert", "publish"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			db, err := sql.Open("sqlite", "file:"+filepath.Join(b.TempDir(), "b.db")+dsnOpts+"&_pragma=synchronous(NORMAL)")
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			if err := sqlite.Migrate(ctx, db, ""); err != nil {
				b.Fatal(err)
			}
			ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{})
			tx, _ := db.BeginTx(ctx, nil)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if mode == "raw-insert" {
					_, err = tx.ExecContext(ctx, `INSERT INTO "outbox" (id, topic, message_key, payload) VALUES (?1, ?2, ?3, ?4)`,
						outbox.NewID().String(), msg.Topic, msg.Key, string(msg.Payload))
				} else {
					_, err = ob.Publish(ctx, sqltx.From(tx), msg)
				}
				if err != nil {
					b.Fatal(err)
				}
				if i%500 == 499 {
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
					tx, _ = db.BeginTx(ctx, nil)
				}
			}
			tx.Commit()
		})
	}
}
