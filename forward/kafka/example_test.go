package kafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/oncommit/oncommit/forward/kafka"
	"github.com/oncommit/oncommit/outbox"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Forward a relay's messages to Kafka: register the forwarder's handler,
// usually as the catch-all, on a relay,
//
//	relay.HandleBatch(outbox.AllTopics, f.Handler())
//
// and every claim's messages are produced with one round trip. Here the
// handler is called as a relay would, against an in-process Kafka
// (kfake): each outcome is nil once Kafka acknowledged the record, which
// carries the message's key, payload and id.
func ExampleForwarder_Handler() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders.v1"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		panic(err)
	}
	defer client.Close()

	f, err := kafka.New(client, kafka.Config{
		Topic: func(topic string) string { return topic + ".v1" }, // outbox topic "orders" -> Kafka topic "orders.v1"
	})
	if err != nil {
		panic(err)
	}
	id := outbox.NewID()
	errs := f.Handler()(context.Background(), []outbox.Delivery{
		{ID: id, Topic: "orders", Key: "A-1", Payload: []byte(`{"order_id":"A-1"}`), Attempt: 1, CreatedAt: time.Now()},
	})
	fmt.Println("outcomes:", errs)

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders.v1"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer consumer.Close()
	r := consumer.PollFetches(context.Background()).Records()[0]
	fmt.Printf("%s key=%s value=%s\n", r.Topic, r.Key, r.Value)
	fmt.Println("oncommit-id is the message id:", r.Headers[0].Key == kafka.IDHeader && string(r.Headers[0].Value) == id.String())
	// Output:
	// outcomes: [<nil>]
	// orders.v1 key=A-1 value={"order_id":"A-1"}
	// oncommit-id is the message id: true
}
