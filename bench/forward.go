package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	_ "github.com/oncommit/oncommit/dialect/postgres" // fills in pgsql
	natsfwd "github.com/oncommit/oncommit/forward/nats"
	"github.com/oncommit/oncommit/forward/rabbitmq"
	"github.com/oncommit/oncommit/internal/pgsql"
	"github.com/oncommit/oncommit/outbox"
)

var (
	natsURL   = envOr("OUTBOX_TEST_NATS_URL", "nats://127.0.0.1:4222")
	rabbitURL = envOr("OUTBOX_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
)

// forwardBench measures the forwarders (forward/nats, forward/rabbitmq):
// a backlog of -n messages forwarded by one relay with the forwarder's
// batch handler, beside a hand-written loop on the same table (claim 100
// with SKIP LOCKED returning id, topic, payload, as rawLoop does; publish
// the 100 asynchronously with the id as dedup id / message-id; await
// every ack or confirm; delete by ids) with 1 and 4 workers, in
// alternating rounds.
func forwardBench(ctx context.Context, pool *pgxpool.Pool) {
	fmt.Printf("\n== forward: a backlog of %d messages forwarded to a broker, %d alternating rounds (msg/s, higher is better)\n", *n, *rounds)
	nc, err := nats.Connect(natsURL)
	check(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	check(err)
	const streamName, subject = "OCBENCH", "ocbench.bench"
	_ = js.DeleteStream(ctx, streamName)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: streamName, Subjects: []string{"ocbench.>"}, Storage: jetstream.FileStorage, Duplicates: 11 * time.Minute})
	check(err)
	defer js.DeleteStream(ctx, streamName)
	conn, err := amqp.Dial(rabbitURL)
	check(err)
	defer conn.Close()
	admin, err := conn.Channel()
	check(err)
	const queue = "ocbench"
	_, _ = admin.QueueDelete(queue, false, false, false)
	_, err = admin.QueueDeclare(queue, true, false, false, false, nil)
	check(err)
	defer admin.QueueDelete(queue, false, false, false)

	natsFwd, err := natsfwd.New(js, natsfwd.Config{Subject: func(outbox.Delivery) string { return subject }})
	check(err)
	rabbitFwd, err := rabbitmq.New(rabbitURL, rabbitmq.Config{RoutingKey: func(outbox.Delivery) string { return queue }})
	check(err)
	defer rabbitFwd.Close()

	type side struct {
		name string
		run  func(ob *outbox.Outbox)
	}
	type broker struct {
		name   string
		sides  []side
		stored func() int // messages on the broker
		reset  func()
	}
	brokers := []broker{
		{name: "NATS JetStream", sides: []side{
			{"oncommit natsfwd", func(ob *outbox.Outbox) { forwardRelay(ctx, ob, 0, natsFwd.Handler()) }},
			{"oncommit natsfwd, Concurrency 400", func(ob *outbox.Outbox) { forwardRelay(ctx, ob, 400, natsFwd.Handler()) }},
			{"hand loop, 1 worker", func(ob *outbox.Outbox) { handLoop(ctx, pool, ob, 1, natsPublisher(js, subject)) }},
			{"hand loop, 4 workers", func(ob *outbox.Outbox) { handLoop(ctx, pool, ob, 4, natsPublisher(js, subject)) }},
		}, stored: func() int {
			i, err := st.Info(ctx)
			check(err)
			return int(i.State.Msgs)
		}, reset: func() { check(st.Purge(ctx)) }},
		{name: "RabbitMQ", sides: []side{
			{"oncommit rabbitmq", func(ob *outbox.Outbox) { forwardRelay(ctx, ob, 0, rabbitFwd.Handler()) }},
			{"oncommit rabbitmq, Concurrency 400", func(ob *outbox.Outbox) { forwardRelay(ctx, ob, 400, rabbitFwd.Handler()) }},
			{"hand loop, 1 worker", func(ob *outbox.Outbox) { handLoop(ctx, pool, ob, 1, rabbitPublisher(conn, queue)) }},
			{"hand loop, 4 workers", func(ob *outbox.Outbox) { handLoop(ctx, pool, ob, 4, rabbitPublisher(conn, queue)) }},
		}, stored: func() int {
			q, err := admin.QueueDeclarePassive(queue, true, false, false, false, nil)
			check(err)
			return q.Messages
		}, reset: func() { _, err := admin.QueuePurge(queue, false); check(err) }},
	}
	got, cpus := map[string][]float64{}, map[string][]float64{}
	for round := 1; round <= *rounds; round++ {
		for _, b := range brokers {
			sides := slices.Clone(b.sides)
			if round%2 == 0 {
				slices.Reverse(sides)
			}
			for _, s := range sides {
				b.reset()
				ob := table(ctx, pool, "forward")
				fill(ctx, pool, ob, *n, "bench")
				cpu0 := processCPU()
				t0 := time.Now()
				s.run(ob)
				secs := time.Since(t0).Seconds()
				cpu := float64((processCPU() - cpu0).Nanoseconds()) / 1e3 / float64(*n)
				if left := remaining(ctx, pool, ob); left != 0 {
					check(fmt.Errorf("%s / %s left %d rows", b.name, s.name, left))
				}
				// RabbitMQ's queue count lags its confirms a little.
				stored := b.stored()
				for i := 0; stored < *n && i < 50; i++ {
					time.Sleep(20 * time.Millisecond)
					stored = b.stored()
				}
				if stored < *n {
					check(fmt.Errorf("%s / %s: %d messages on the broker, want %d", b.name, s.name, stored, *n))
				}
				k := b.name + " | " + s.name
				got[k] = append(got[k], float64(*n)/secs)
				cpus[k] = append(cpus[k], cpu)
				fmt.Printf("round %d %-52s %8.0f msg/s (%.2fs, %d on the broker)  client CPU %5.1f µs/msg\n", round, k, float64(*n)/secs, secs, stored, cpu)
			}
		}
	}
	fmt.Printf("\nmedians of %d rounds (min-max); ratios = oncommit / hand loop medians\n", *rounds)
	for _, b := range brokers {
		var hands []string
		for _, s := range b.sides {
			if strings.HasPrefix(s.name, "hand") {
				hands = append(hands, s.name)
			}
		}
		for _, s := range b.sides {
			v := got[b.name+" | "+s.name]
			c := cpus[b.name+" | "+s.name]
			line := fmt.Sprintf("%-16s %-36s %7.0f msg/s (%.0f-%.0f), client CPU %.1f µs/msg (%.1f-%.1f)", b.name, s.name, median(v), slices.Min(v), slices.Max(v), median(c), slices.Min(c), slices.Max(c))
			if !strings.HasPrefix(s.name, "hand") {
				for _, h := range hands {
					line += fmt.Sprintf("  vs %s %.2fx", strings.TrimPrefix(h, "hand loop, "), median(v)/median(got[b.name+" | "+h]))
				}
			}
			fmt.Println(line)
		}
	}
}

// forwardRelay runs one relay (default configuration, as relays() builds
// them, with Concurrency concurrency when not 0: with the default
// BatchSize of 100, 200 runs two batches at once, 400 four) with h for
// topic "bench" until the table is empty.
func forwardRelay(ctx context.Context, ob *outbox.Outbox, concurrency int, h outbox.BatchHandler) {
	p, err := pgxpool.New(ctx, *url)
	check(err)
	defer p.Close()
	check(p.Ping(ctx))
	var done atomic.Int64
	finished := make(chan struct{})
	r, err := ob.Relay(pgxtx.FromPool(p), outbox.RelayConfig{Logger: quiet, PollInterval: 20 * time.Millisecond, Listen: outbox.ListenOff, Concurrency: concurrency})
	check(err)
	check(r.HandleBatch("bench", func(ctx context.Context, ds []outbox.Delivery) []error {
		out := h(ctx, ds)
		var ok int64
		for _, err := range out {
			if err == nil {
				ok++
			} else {
				fmt.Fprintln(os.Stderr, "bench: forward:", err)
			}
		}
		if done.Add(ok) == int64(*n) {
			close(finished)
		}
		return out
	}))
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { check(r.Run(rctx)) })
	<-finished
	cancel()
	wg.Wait()
}

// publisher publishes one claimed batch and returns when the broker
// confirmed all of it.
type publisher func(ids [][16]byte, payloads [][]byte) error

// handLoop is the hand-written reference: claim 100 (rawLoop's claim),
// publish them through pub, delete them.
func handLoop(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, workers int, newPub func() publisher) {
	tbl := pgsql.QuoteTable(ob.Table())
	claim := `WITH due AS MATERIALIZED (SELECT id FROM ` + tbl + ` WHERE state IN ('pending','processing') AND available_at <= now() AND topic = 'bench'
		ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED)
		UPDATE ` + tbl + ` AS o SET state = 'processing', attempts = o.attempts + 1, available_at = now() + interval '30 seconds'
		FROM due WHERE o.id = due.id RETURNING o.id, o.topic, o.payload`
	del := `DELETE FROM ` + tbl + ` WHERE id = ANY($1)`
	var wg sync.WaitGroup
	for range workers {
		pub := newPub()
		wg.Go(func() {
			for {
				rows, err := pool.Query(ctx, claim)
				check(err)
				var ids [][16]byte
				var payloads [][]byte
				for rows.Next() {
					var id [16]byte
					var topic string
					var payload []byte
					check(rows.Scan(&id, &topic, &payload))
					ids = append(ids, id)
					payloads = append(payloads, payload)
				}
				check(rows.Err())
				if len(ids) == 0 {
					return
				}
				check(pub(ids, payloads))
				_, err = pool.Exec(ctx, del, ids)
				check(err)
			}
		})
	}
	wg.Wait()
}

// natsPublisher publishes asynchronously with Nats-Msg-Id = the id and
// awaits every PubAck.
func natsPublisher(js jetstream.JetStream, subject string) func() publisher {
	return func() publisher {
		return func(ids [][16]byte, payloads [][]byte) error {
			futs := make([]jetstream.PubAckFuture, len(ids))
			for i := range ids {
				m := &nats.Msg{Subject: subject, Data: payloads[i], Header: nats.Header{jetstream.MsgIDHeader: {outbox.ID(ids[i]).String()}}}
				f, err := js.PublishMsgAsync(m)
				if err != nil {
					return err
				}
				futs[i] = f
			}
			for _, f := range futs {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					return err
				case <-time.After(10 * time.Second):
					return fmt.Errorf("no PubAck")
				}
			}
			return nil
		}
	}
}

// rabbitPublisher publishes persistent, mandatory messages with
// message-id = the id on a confirm-mode channel of its own and awaits
// every confirm (returns are not looked at: every message routes).
func rabbitPublisher(conn *amqp.Connection, queue string) func() publisher {
	return func() publisher {
		ch, err := conn.Channel()
		check(err)
		check(ch.Confirm(false))
		return func(ids [][16]byte, payloads [][]byte) error {
			dcs := make([]*amqp.DeferredConfirmation, len(ids))
			for i := range ids {
				dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{
					DeliveryMode: amqp.Persistent, MessageId: outbox.ID(ids[i]).String(), Body: payloads[i],
				})
				if err != nil {
					return err
				}
				dcs[i] = dc
			}
			for _, dc := range dcs {
				if !dc.Wait() {
					return fmt.Errorf("nacked")
				}
			}
			return nil
		}
	}
}
