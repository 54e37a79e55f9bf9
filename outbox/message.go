package outbox

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oncommit/oncommit/outboxdriver"
)

// Limits that apply to every message, whatever the dialect.
const (
	// MaxTopicBytes is the longest topic accepted, in bytes.
	MaxTopicBytes = 255
	// MaxKeyBytes is the longest Key accepted, in bytes.
	MaxKeyBytes = 255
	// MaxDedupKeyBytes is the longest DedupKey accepted, in bytes.
	MaxDedupKeyBytes = 512
	// MaxHeadersBytes is the largest accepted size of the headers, encoded as JSON.
	MaxHeadersBytes = 64 << 10
	// MaxPayloadDepth is the deepest nesting of arrays and objects accepted
	// in a payload; a dialect may accept less (MySQL/MariaDB: 31).
	MaxPayloadDepth = 512
)

// Message is one side effect to run after the caller's transaction commits.
type Message struct {
	// Topic routes the message to its handler, for example "order.placed".
	// Required: 1 to MaxTopicBytes bytes of valid UTF-8, not blank, no NUL.
	Topic string

	// Key is an optional business key (an order id, say). With
	// Config.OrderByKey, the messages of one Key are delivered in commit
	// order; otherwise it orders nothing. At most MaxKeyBytes, no NUL, no
	// U+001F (reserved for subscribers' copies, as in DedupKey).
	Key string

	// Payload is the message body, a JSON document; nil or empty stores
	// SQL NULL. It must be at most Config.MaxPayloadBytes of valid UTF-8
	// JSON that every supported database stores: no \u0000 escape,
	// surrogate escapes only as pairs, numbers PostgreSQL's numeric holds,
	// nesting at most MaxPayloadDepth (docs/dialects.md has the rules).
	Payload []byte

	// Headers are optional string metadata (trace ids, content type).
	Headers map[string]string

	// DedupKey, when not empty, makes the message unique among the stored
	// messages (in any state): a second one with the same key is not stored
	// and its [Result] says Duplicate.
	DedupKey string

	// Delay makes the message due this long after the transaction's start
	// on the database clock. Must not be negative.
	Delay time.Duration

	// NotBefore makes the message due at this instant (never before the
	// database's now()). Not with Delay.
	NotBefore time.Time
}

// Result tells the caller what Publish did with one message.
type Result struct {
	// ID is the stored message's id; zero for a duplicate. For a topic
	// with subscribers (Config.Subscribers): the first stored copy's.
	ID ID
	// Duplicate is true when a stored message had the same DedupKey (for
	// a topic with subscribers: when every copy had).
	Duplicate bool
	// Copies, for a topic with subscribers, are the ids of the copies, in
	// the order of the topic's subscribers in Config.Subscribers (zero
	// for a copy not stored, a duplicate). Nil for other topics.
	Copies []ID
}

// earliest and latest bound NotBefore so every database can store it.
var (
	earliest = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	latest   = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
)

func checkText(idx int, field, s string, max int, required bool) error {
	if len(s) <= max && plainText(s) {
		return nil
	}
	return checkTextFull(idx, field, s, max, required)
}

// checkTextFull is checkText without its fast path for plain ASCII.
func checkTextFull(idx int, field, s string, max int, required bool) error {
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

// plainText reports whether s passes checkText at once, in one pass: not
// empty, all ASCII (so valid UTF-8), no NUL, and not all white space. It
// may refuse texts checkText accepts (any with a byte of 0x80 or above),
// which then take checkText's full checks.
func plainText(s string) bool {
	visible := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == 0 || c >= utf8.RuneSelf {
			return false
		}
		// TrimSpace's ASCII white space: \t \n \v \f \r and space.
		visible = visible || c > ' ' || c < '\t' || c > '\r' && c < ' '
	}
	return visible
}

// toRow validates m and writes the row to store into r, all but its ID.
func toRow(r *outboxdriver.Row, idx int, m *Message, maxPayload, maxDepth int) error {
	if err := checkText(idx, "Topic", m.Topic, MaxTopicBytes, true); err != nil {
		return err
	}
	if err := checkText(idx, "Key", m.Key, MaxKeyBytes, false); err != nil {
		return err
	}
	if err := checkText(idx, "DedupKey", m.DedupKey, MaxDedupKeyBytes, false); err != nil {
		return err
	}
	if len(m.Payload) > maxPayload {
		return &MessageError{idx, "Payload", "larger than the limit of " + strconv.Itoa(maxPayload) + " bytes"}
	}
	if len(m.Payload) > 0 {
		if reason := checkJSON(m.Payload, maxDepth); reason != "" {
			return &MessageError{idx, "Payload", reason}
		}
	}
	var headers []byte
	if len(m.Headers) > 0 {
		for k, v := range m.Headers {
			if err := checkText(idx, "Headers", k, MaxHeadersBytes, true); err != nil {
				err.(*MessageError).Reason = "key: " + err.(*MessageError).Reason
				return err
			}
			if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
				return &MessageError{idx, "Headers", "value of " + k + ": not valid UTF-8 or contains a NUL byte"}
			}
		}
		var err error
		if headers, err = json.Marshal(m.Headers); err != nil {
			return &MessageError{idx, "Headers", err.Error()}
		}
		if len(headers) > MaxHeadersBytes {
			return &MessageError{idx, "Headers", "larger than the limit of " + strconv.Itoa(MaxHeadersBytes) + " bytes"}
		}
	}
	if m.Delay < 0 {
		return &MessageError{idx, "Delay", "must not be negative"}
	}
	nb := m.NotBefore
	if !nb.IsZero() {
		if m.Delay != 0 {
			return &MessageError{idx, "NotBefore", "set at most one of Delay and NotBefore"}
		}
		nb = nb.UTC()
		if nb.Before(earliest) || nb.After(latest) {
			return &MessageError{idx, "NotBefore", "outside the years 1970 to 9999"}
		}
	}
	var payload []byte
	if len(m.Payload) > 0 {
		payload = m.Payload
	}
	*r = outboxdriver.Row{
		Topic: m.Topic, Key: m.Key, Payload: payload, Headers: headers,
		DedupKey: m.DedupKey, Delay: m.Delay, NotBefore: nb,
	}
	return nil
}
