package outbox_test

import (
	"context"
	"testing"

	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// nopTx takes every statement and sends nothing.
type nopTx struct{}

func (nopTx) CheckTx() error { return nil }
func (nopTx) QueryTx(context.Context, string, ...any) (outboxdriver.Rows, error) {
	return nil, nil
}
func (nopTx) ExecTx(context.Context, string, ...any) error { return nil }

// BenchmarkPublishClient measures the client side of Publish alone, on a Tx
// that sends nothing: validation, the id, the statement and its arguments.
// raw is what a hand-written INSERT of the bench's raw system does before
// its Exec (an id as text, the argument slice):
//
//	go test ./outbox -run '^$' -bench PublishClient -count 6
func BenchmarkPublishClient(b *testing.B) {
	ctx := context.Background()
	payload := []byte(`{"seq":1,"order_id":"0193a1f2","email":"someone@example.com","total_cents":4200}`)
	msg := outbox.Message{Topic: "bench", Key: "0193a1f2", Payload: payload}
	for _, c := range []struct {
		name string
		cfg  outbox.Config
	}{{"defaults", outbox.Config{}}, {"notify-off", outbox.Config{Notify: outbox.NotifyOff}}} {
		b.Run(c.name, func(b *testing.B) {
			ob, err := outbox.New(postgres.Dialect(), c.cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ob.Publish(ctx, nopTx{}, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// A batch of 100 as the bench's publish-100 scenario makes it (the
	// messages built in the loop, as a caller builds them), and raw-100, its
	// raw system's arguments.
	b.Run("batch-100", func(b *testing.B) {
		ob, err := outbox.New(postgres.Dialect(), outbox.Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			msgs := make([]outbox.Message, 100)
			for i := range msgs {
				msgs[i] = msg
			}
			if _, err := ob.PublishBatch(ctx, nopTx{}, msgs); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw-100", func(b *testing.B) {
		b.ReportAllocs()
		var tx outboxdriver.Tx = nopTx{}
		for b.Loop() {
			p := string(payload)
			args := make([]any, 400)
			for i := range 100 {
				args[4*i], args[4*i+1], args[4*i+2], args[4*i+3] = outbox.NewID().String(), "bench", "0193a1f2", p
			}
			_ = tx.ExecTx(ctx, "q", args...)
		}
	})
	b.Run("raw", func(b *testing.B) {
		b.ReportAllocs()
		var tx outboxdriver.Tx = nopTx{}
		for b.Loop() {
			args := make([]any, 4)
			args[0], args[1], args[2], args[3] = outbox.NewID().String(), "bench", "0193a1f2", string(payload)
			_ = tx.ExecTx(ctx, "q", args...)
		}
	})
}
