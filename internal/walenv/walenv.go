// Package walenv is the envelope a message of PostgreSQL's WAL transport
// travels in. The content of one transactional logical decoding message
// (pg_logical_emit_message) is the envelopes of a publish's messages, back
// to back: one WAL record per publish. It has no dependencies beyond the
// SPI, so the sqlmock kit can read what Publish sends.
package walenv

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/oncommit/oncommit/outboxdriver"
)

// Envelope is one message as it travels through the WAL.
type Envelope struct {
	ID      outboxdriver.ID
	Topic   string
	Key     string // "" means none
	Payload []byte // nil means NULL
	Headers []byte // JSON object, nil means none
	// Ordered is true when the message is delivered in order within Key.
	Ordered bool
}

// version is the first byte of every envelope; a reader refuses others.
const version = 1

const flagOrdered = 1

// ErrEnvelope reports content that is not an envelope of this version.
var ErrEnvelope = errors.New("walenv: malformed envelope")

// Append appends e's encoding to dst: version, flags, the id, then topic,
// key, headers and payload, each as a uvarint of its length plus one (0 for nil) and its
// bytes.
func Append(dst []byte, e Envelope) []byte {
	var flags byte
	if e.Ordered {
		flags |= flagOrdered
	}
	dst = append(dst, version, flags)
	dst = append(dst, e.ID[:]...)
	dst = appendField(dst, []byte(e.Topic), true)
	dst = appendField(dst, []byte(e.Key), true)
	dst = appendField(dst, e.Headers, e.Headers != nil)
	return appendField(dst, e.Payload, e.Payload != nil)
}

func appendField(dst, b []byte, present bool) []byte {
	if !present {
		return binary.AppendUvarint(dst, 0)
	}
	dst = binary.AppendUvarint(dst, uint64(len(b))+1)
	return append(dst, b...)
}

// Decode decodes one envelope Append wrote, and nothing after it. The
// byte slices of the result alias b.
func Decode(b []byte) (Envelope, error) {
	e, rest, err := decodeOne(b)
	if err == nil && len(rest) != 0 {
		return Envelope{}, fmt.Errorf("%w: %d trailing bytes", ErrEnvelope, len(rest))
	}
	return e, err
}

// DecodeAll decodes the envelopes of one message's content: one or more,
// back to back, as successive Appends wrote them. The byte slices of the
// result alias b.
func DecodeAll(b []byte) ([]Envelope, error) {
	var out []Envelope
	for {
		e, rest, err := decodeOne(b)
		if err != nil {
			return nil, fmt.Errorf("envelope %d: %w", len(out), err)
		}
		out = append(out, e)
		if len(rest) == 0 {
			return out, nil
		}
		b = rest
	}
}

// decodeOne decodes the envelope at the start of b and returns the bytes
// after it.
func decodeOne(b []byte) (Envelope, []byte, error) {
	var e Envelope
	const head = 2 + len(outboxdriver.ID{})
	if len(b) < head {
		return e, nil, fmt.Errorf("%w: %d bytes", ErrEnvelope, len(b))
	}
	if b[0] != version {
		return e, nil, fmt.Errorf("%w: version %d", ErrEnvelope, b[0])
	}
	e.Ordered = b[1]&flagOrdered != 0
	copy(e.ID[:], b[2:])
	rest := b[head:]
	var fields [4][]byte
	for i := range fields {
		n, k := binary.Uvarint(rest)
		if k <= 0 || n > uint64(len(rest)-k)+1 {
			return Envelope{}, nil, fmt.Errorf("%w: field %d", ErrEnvelope, i)
		}
		rest = rest[k:]
		if n == 0 {
			continue
		}
		fields[i], rest = rest[:n-1:n-1], rest[n-1:]
	}
	if len(fields[0]) == 0 {
		return Envelope{}, nil, fmt.Errorf("%w: no topic", ErrEnvelope)
	}
	e.Topic, e.Key, e.Headers, e.Payload = string(fields[0]), string(fields[1]), fields[2], fields[3]
	return e, rest, nil
}
