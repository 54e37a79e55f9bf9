package outbox_test

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// BenchmarkPublish measures Publish beside a raw hand-written INSERT of the
// same rows into the same table, on pgx through one connection, each
// sub-benchmark on a fresh table.
//
//   - stmt/...: the statement alone, inside an open transaction (committed
//     every 500 operations, alike for all): the marginal cost of Publish.
//   - tx/...: BEGIN, the statement, COMMIT: what one business transaction
//     that publishes pays.
//
// Compare ns/op of publish-* with raw-* of the same family:
//
//	go test ./outbox -run '^$' -bench Publish -count 6
func BenchmarkPublish(b *testing.B) {
	ctx := context.Background()
	payload := []byte(`{"order_id":"0193a1f2","email":"someone@example.com","total_cents":4200}`)
	msg := outbox.Message{Topic: "order.placed", Key: "0193a1f2", Payload: payload}
	batch := make([]outbox.Message, 100)
	for i := range batch {
		batch[i] = msg
	}
	type op func(ctx context.Context, tx pgx.Tx, ob *outbox.Outbox) error
	raw := func(n int) op {
		var q, table string
		args := make([]any, 4*n)
		return func(ctx context.Context, tx pgx.Tx, ob *outbox.Outbox) error {
			if table != ob.Table().String() {
				table = ob.Table().String()
				var sb strings.Builder
				sb.WriteString(`INSERT INTO ` + pgsql.QuoteTable(ob.Table()) + ` (id, topic, message_key, payload) VALUES `)
				for i := range n {
					if i > 0 {
						sb.WriteString(", ")
					}
					p := strconv.Itoa(4*i + 1)
					sb.WriteString("($" + p + ", $" + strconv.Itoa(4*i+2) + ", $" + strconv.Itoa(4*i+3) + ", $" + strconv.Itoa(4*i+4) + ")")
				}
				q = sb.String()
			}
			for i := range n {
				args[4*i], args[4*i+1], args[4*i+2], args[4*i+3] = outbox.NewID().String(), msg.Topic, msg.Key, string(msg.Payload)
			}
			_, err := tx.Exec(ctx, q, args...)
			return err
		}
	}
	rawReturning := func(ctx context.Context, tx pgx.Tx, ob *outbox.Outbox) error {
		rows, err := tx.Query(ctx, `INSERT INTO `+pgsql.QuoteTable(ob.Table())+` (id, topic, message_key, payload) VALUES ($1, $2, $3, $4) RETURNING id::text`,
			outbox.NewID().String(), msg.Topic, msg.Key, string(msg.Payload))
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	publish := func(ctx context.Context, tx pgx.Tx, ob *outbox.Outbox) error {
		_, err := ob.Publish(ctx, pgxtx.From(tx), msg)
		return err
	}
	publishBatch := func(ctx context.Context, tx pgx.Tx, ob *outbox.Outbox) error {
		_, err := ob.PublishBatch(ctx, pgxtx.From(tx), batch)
		return err
	}
	cases := []struct {
		name string
		cfg  outbox.Config
		op   op
	}{
		{"raw-insert", outbox.Config{}, raw(1)},
		{"raw-insert-returning", outbox.Config{}, rawReturning},
		{"publish-notify-off", outbox.Config{Notify: outbox.NotifyOff}, publish},
		{"publish-notify-on", outbox.Config{}, publish},
		{"raw-insert-100", outbox.Config{}, raw(100)},
		{"publish-batch-100", outbox.Config{Notify: outbox.NotifyOff}, publishBatch},
	}
	for _, family := range []string{"stmt", "tx"} {
		every := 500
		if family == "tx" {
			every = 1
		}
		for _, c := range cases {
			b.Run(family+"/"+c.name, func(b *testing.B) {
				e := newEnv(b, c.cfg)
				conn, err := pgx.Connect(ctx, pgtest.URL(b))
				if err != nil {
					b.Fatal(err)
				}
				defer conn.Close(ctx)
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := processCPU(b)
				tx, err := conn.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				for i := 0; i < b.N; i++ {
					if err := c.op(ctx, tx, e.ob); err != nil {
						b.Fatal(err)
					}
					if i%every == every-1 {
						if err := tx.Commit(ctx); err != nil {
							b.Fatal(err)
						}
						if tx, err = conn.Begin(ctx); err != nil {
							b.Fatal(err)
						}
					}
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// processCPU is the CPU time (user and system) this process has used, in
// nanoseconds.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkPublishSQL measures the client side alone: validating 100
// messages and building their statement, no database.
func BenchmarkPublishSQL(b *testing.B) {
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	msg := outbox.Message{Topic: "order.placed", Key: "0193a1f2", Payload: []byte(`{"order_id":"0193a1f2","email":"someone@example.com","total_cents":4200}`)}
	batch := make([]outbox.Message, 100)
	for i := range batch {
		batch[i] = msg
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ob.PublishSQL(batch...); err != nil {
			b.Fatal(err)
		}
	}
}
