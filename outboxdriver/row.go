package outboxdriver

import "time"

// Row is a validated message ready to be written, handed to a [Dialect] by the outbox package's Publish.
type Row struct {
	ID        ID
	Topic     string
	Key       string // "" means NULL
	Payload   []byte // nil means NULL
	Headers   []byte // JSON object, nil means NULL
	DedupKey  string // "" means NULL
	Delay     time.Duration
	NotBefore time.Time // UTC; zero means none
	// Ordered is true when the message is delivered in order within its
	// Key (never with an empty Key): it comes from an Outbox with
	// Config.OrderByKey, through a dialect whose Capabilities.Ordered is
	// true. See [OrderedDialect] for what Insert does with such rows.
	Ordered bool
}
