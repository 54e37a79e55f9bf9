// Package oncommitotel instruments oncommit with OpenTelemetry: a span per
// published message whose context travels in the message's headers, a
// span per delivery linked to it, the messaging semantic conventions'
// metrics, and gauges of the queue (due, processing and dead messages, and
// the age of the oldest due one, per topic; with ordered delivery, blocked
// messages, held and blocked keys and the age of the oldest blocked key).
//
// It lives in a module of its own (github.com/oncommit/oncommit/otel), so
// that a service that does not import it gets no OpenTelemetry module.
//
//	tel, err := oncommitotel.New(oncommitotel.Config{})    // global providers
//	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Hook: tel})
//	relay, err := ob.Relay(db, outbox.RelayConfig{Observer: tel})
//	go tel.ObserveQueue(ctx, ob, db, oncommitotel.QueueConfig{Elector: oncommitotel.PostgresLock(sqlDB, 4242)})
//
// docs/observability.md lists every span, metric and attribute, and the
// alerts to set.
package oncommitotel
