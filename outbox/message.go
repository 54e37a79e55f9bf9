package outbox

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits that apply to every message, whatever the dialect.
const (
	// MaxTopicBytes is the longest topic accepted, in bytes.
	MaxTopicBytes = 255
	// MaxKeyBytes is the longest Key accepted, in bytes.
	MaxKeyBytes = 255
	// MaxDedupKeyBytes is the longest DedupKey accepted, in bytes. It keeps
	// the unique index entry well under the database's limits.
	MaxDedupKeyBytes = 512
	// MaxHeadersBytes is the largest accepted size of the headers, encoded as JSON.
	MaxHeadersBytes = 64 << 10
	// MaxPayloadDepth is the deepest nesting of arrays and objects accepted
	// in a payload.
	MaxPayloadDepth = 512
)

// Message is one side effect to run after the caller's transaction commits.
type Message struct {
	// Topic routes the message to its handler, for example "order.placed".
	// Required: 1 to MaxTopicBytes bytes of valid UTF-8, not blank, no NUL.
	// It is stored verbatim.
	Topic string

	// Key is an optional business key (an order id, say). It is stored in
	// the message_key column for handlers, operators and CDC tools. It is
	// not an ordering guarantee.
	Key string

	// Payload is the message body: a JSON document, stored in a JSON column.
	// Nil or empty means no payload (SQL NULL); the JSON text null is stored
	// as JSON null. It must be valid UTF-8 JSON, without the \u0000 escape
	// (PostgreSQL's jsonb refuses it), nested at most MaxPayloadDepth deep,
	// and at most Config.MaxPayloadBytes long.
	Payload []byte

	// Headers are optional string metadata (trace ids, content type).
	Headers map[string]string

	// DedupKey, when not empty, makes the message unique among the stored
	// messages with a DedupKey: publishing a second message with the same
	// key while the first is still stored (pending, processing, dead, or
	// delivered and kept) stores nothing and reports Duplicate in the
	// [Result]. Both transactions stay usable.
	DedupKey string

	// Delay makes the message due this long after the transaction's start on
	// the database clock. Must not be negative; zero means due at once.
	Delay time.Duration

	// NotBefore makes the message due at this instant (it is never due
	// before the database's now()). Zero means no such bound. Set at most
	// one of Delay and NotBefore.
	NotBefore time.Time
}

// Result tells the caller what Publish did with one message.
type Result struct {
	// ID is the id the stored message carries. It is the zero ID when the
	// message was a duplicate and nothing was stored.
	ID ID
	// Duplicate is true when a stored message already had the same DedupKey,
	// so this one was not stored.
	Duplicate bool
}

// Row is a validated message ready to be written, handed to a [Dialect].
type Row struct {
	ID        ID
	Topic     string
	Key       string // "" means NULL
	Payload   []byte // nil means NULL
	Headers   []byte // JSON object, nil means NULL
	DedupKey  string // "" means NULL
	Delay     time.Duration
	NotBefore time.Time // UTC; zero means none
}

// earliest and latest bound NotBefore so every database can store it.
var (
	earliest = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	latest   = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
)

func checkText(idx int, field, s string, max int, required bool) error {
	switch {
	case s == "" && !required:
		return nil
	case s == "":
		return &MessageError{idx, field, "must not be empty"}
	case strings.TrimSpace(s) == "":
		return &MessageError{idx, field, "must not be blank"}
	case len(s) > max:
		return &MessageError{idx, field, "longer than the limit of " + strconv.Itoa(max) + " bytes"}
	case !utf8.ValidString(s):
		return &MessageError{idx, field, "not valid UTF-8"}
	case strings.IndexByte(s, 0) >= 0:
		return &MessageError{idx, field, "contains a NUL byte"}
	}
	return nil
}

// toRow validates m and returns the row to store.
func toRow(idx int, m *Message, maxPayload int) (Row, error) {
	if err := checkText(idx, "Topic", m.Topic, MaxTopicBytes, true); err != nil {
		return Row{}, err
	}
	if err := checkText(idx, "Key", m.Key, MaxKeyBytes, false); err != nil {
		return Row{}, err
	}
	if err := checkText(idx, "DedupKey", m.DedupKey, MaxDedupKeyBytes, false); err != nil {
		return Row{}, err
	}
	if len(m.Payload) > maxPayload {
		return Row{}, &MessageError{idx, "Payload", "larger than the limit of " + strconv.Itoa(maxPayload) + " bytes"}
	}
	if len(m.Payload) > 0 {
		if reason := checkJSON(m.Payload); reason != "" {
			return Row{}, &MessageError{idx, "Payload", reason}
		}
	}
	var headers []byte
	if len(m.Headers) > 0 {
		for k, v := range m.Headers {
			if err := checkText(idx, "Headers", k, MaxHeadersBytes, true); err != nil {
				err.(*MessageError).Reason = "key: " + err.(*MessageError).Reason
				return Row{}, err
			}
			if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
				return Row{}, &MessageError{idx, "Headers", "value of " + k + ": not valid UTF-8 or contains a NUL byte"}
			}
		}
		var err error
		if headers, err = json.Marshal(m.Headers); err != nil {
			return Row{}, &MessageError{idx, "Headers", err.Error()}
		}
		if len(headers) > MaxHeadersBytes {
			return Row{}, &MessageError{idx, "Headers", "larger than the limit of " + strconv.Itoa(MaxHeadersBytes) + " bytes"}
		}
	}
	if m.Delay < 0 {
		return Row{}, &MessageError{idx, "Delay", "must not be negative"}
	}
	nb := m.NotBefore
	if !nb.IsZero() {
		if m.Delay != 0 {
			return Row{}, &MessageError{idx, "NotBefore", "set at most one of Delay and NotBefore"}
		}
		nb = nb.UTC()
		if nb.Before(earliest) || nb.After(latest) {
			return Row{}, &MessageError{idx, "NotBefore", "outside the years 1970 to 9999"}
		}
	}
	var payload []byte
	if len(m.Payload) > 0 {
		payload = m.Payload
	}
	return Row{
		ID: NewID(), Topic: m.Topic, Key: m.Key, Payload: payload, Headers: headers,
		DedupKey: m.DedupKey, Delay: m.Delay, NotBefore: nb,
	}, nil
}

// checkJSON returns why p cannot be stored in a JSON column, or "".
func checkJSON(p []byte) string {
	if !utf8.Valid(p) {
		return "not valid UTF-8"
	}
	if !json.Valid(p) {
		return "not valid JSON"
	}
	// p is valid JSON: backslashes occur only inside strings, quotes only
	// delimit strings or follow a backslash.
	depth, inString := 0, false
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case inString && c == '\\':
			if p[i+1] == 'u' && string(p[i+2:i+6]) == "0000" {
				return `contains the \u0000 escape, which JSON columns refuse`
			}
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			if depth++; depth > MaxPayloadDepth {
				return "nested deeper than " + strconv.Itoa(MaxPayloadDepth) + " levels"
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return ""
}
