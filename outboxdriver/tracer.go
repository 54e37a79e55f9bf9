package outboxdriver

import "context"

// RelayTracer observes a relay (the outbox package's
// RelayConfig.Tracer), with the dialect's rows: tests and benchmarks use
// it; telemetry uses the outbox package's RelayObserver. Its methods are called from the relay's
// goroutines and must not block.
type RelayTracer interface {
	// TraceClaim is called after each claim with the rows it took.
	TraceClaim(ctx context.Context, claimed []Claimed, err error)
	// TraceSettle is called after each settle statement with the
	// settlements it wrote and the fences that applied (a settlement whose
	// fence is missing was fenced off: another claim had taken the row).
	// Each message has its own settlement and fence, the run of an ordered
	// head's included (the outbox package's Config.OrderByKey): a run member's Attempts are its
	// attempts after this delivery, and its fence applied when its head's
	// did.
	TraceSettle(ctx context.Context, s []Settlement, applied []Fence, err error)
}
