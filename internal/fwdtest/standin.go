package fwdtest

import (
	"context"

	"github.com/oncommit/oncommit/outbox"
)

// handleBatch stands in for Relay.HandleBatch until the core has it: one
// delivery per batch.
func handleBatch(r *outbox.Relay, topic string, h BatchHandler) error {
	return r.Handle(topic, func(ctx context.Context, d outbox.Delivery) error {
		return h(ctx, []outbox.Delivery{d})[0]
	})
}
