package fwd

import (
	"strings"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

// DefaultSource is a forwarder's Source when its configuration leaves it
// empty: the CloudEvents source and, in plain mode, the sender's name
// (RabbitMQ's app-id).
const DefaultSource = "oncommit"

// SpecVersion is the CloudEvents version of the binary content mode.
const SpecVersion = "1.0"

// JSON is the content type of an outbox payload (the outbox stores JSON).
const JSON = "application/json"

// Envelope is what every forwarder puts around a message's payload, one
// rule for all: the id (equal to the broker's deduplication id), the topic
// as the event type, the source, the creation time, the content type and
// the key. Each forwarder maps the attributes onto its broker's message:
// in plain mode with its own header names, in CloudEvents mode (binary
// content mode) as the protocol binding for the broker says.
type Envelope struct {
	// ID is the outbox message id.
	ID string
	// Type is the message's topic.
	Type string
	// Source is the forwarder's configured source.
	Source string
	// Time is the message's creation time, RFC 3339 in UTC with the
	// database's precision.
	Time string
	// ContentType is JSON, or "" for a message without a payload.
	ContentType string
	// Key is the message's key ("" for none): in CloudEvents mode the
	// partitioning extension's partitionkey.
	Key string
}

// EnvelopeOf returns d's envelope, with source ("" for DefaultSource).
func EnvelopeOf(d *outbox.Delivery, source string) Envelope {
	if source == "" {
		source = DefaultSource
	}
	e := Envelope{ID: d.ID.String(), Type: d.Topic, Source: source, Time: d.CreatedAt.UTC().Format(time.RFC3339Nano), Key: d.Key}
	if len(d.Payload) > 0 {
		e.ContentType = JSON
	}
	return e
}

// Attribute is one CloudEvents attribute: its name and value.
type Attribute struct{ Name, Value string }

// CloudEvents returns e's CloudEvents attributes in a fixed order: id,
// source, specversion, type, time, then partitionkey when e has a key.
// datacontenttype is not among them: each binding maps it on its own
// (Kafka's content-type header, AMQP's content-type property, NATS's
// ce-datacontenttype header).
func (e Envelope) CloudEvents() []Attribute {
	a := []Attribute{{"id", e.ID}, {"source", e.Source}, {"specversion", SpecVersion}, {"type", e.Type}, {"time", e.Time}}
	if e.Key != "" {
		a = append(a, Attribute{"partitionkey", e.Key})
	}
	return a
}

// PercentEncode encodes v for a NATS header value as the CloudEvents NATS
// binding says: space, double quote, percent and every byte outside
// printable ASCII as %XY (upper case), each byte of a character's UTF-8
// encoding on its own.
func PercentEncode(v string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c <= ' ' || c == '"' || c == '%' || c >= 0x7f {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
