package kafka_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncommit/oncommit/forward/kafka"
	"github.com/oncommit/oncommit/outbox"
)

func fakeCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// fakeClient returns a client with opts of a fresh fakeCluster, closed
// when t ends.
func fakeClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(fakeCluster(t).ListenAddrs()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TestNewRefusesManualFlushing: a client with kgo.ManualFlushing never
// sends what the forwarder produces (it never flushes): New refuses it
// rather than leave every batch waiting for its context.
func TestNewRefusesManualFlushing(t *testing.T) {
	if _, err := kafka.New(fakeClient(t, kgo.ManualFlushing()), kafka.Config{}); err == nil {
		t.Fatal("New accepted a ManualFlushing client")
	}
}

// TestTopicPanicOnHandlerGoroutine: Config.Topic runs on the handler's
// goroutine for every record (a key's later records included, which are
// produced from Kafka's callbacks), so a panic in it reaches the relay's
// recover instead of crashing the process.
func TestTopicPanicOnHandlerGoroutine(t *testing.T) {
	var n atomic.Int64
	f, err := kafka.New(fakeClient(t), kafka.Config{Topic: func(string) string {
		if n.Add(1) == 2 {
			panic("mapping bug")
		}
		return "orders"
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	defer func() {
		if p := recover(); p != "mapping bug" {
			t.Errorf("recovered %v on the handler's goroutine, want the mapping's panic", p)
		}
	}()
	f.Handler()(ctx, []outbox.Delivery{{ID: outbox.NewID(), Topic: "orders", Key: "k"}, {ID: outbox.NewID(), Topic: "orders", Key: "k"}})
	t.Error("the handler returned: the mapping did not panic on its goroutine")
}
