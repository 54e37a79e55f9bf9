package rabbitmq

import (
	"context"

	"github.com/oncommit/oncommit/outbox"
)

// BatchHandler is a stand-in for outbox.BatchHandler until the core has it.
type BatchHandler = func(ctx context.Context, ds []outbox.Delivery) []error
