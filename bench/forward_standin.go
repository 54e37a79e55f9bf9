package main

import (
	"context"

	"github.com/oncommit/oncommit/outbox"
)

// handleBatch stands in for Relay.HandleBatch until the core has it.
func handleBatch(r *outbox.Relay, topic string, h func(context.Context, []outbox.Delivery) []error) error {
	return r.Handle(topic, func(ctx context.Context, d outbox.Delivery) error { return h(ctx, []outbox.Delivery{d})[0] })
}
