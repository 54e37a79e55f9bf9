package outbox

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// decodeHeaders decodes a claimed message's headers (a JSON object of
// strings); an error dead-letters the message. (Apart from deliver, so
// that only messages with headers pay for the map: decoding into
// &d.Headers moved every Delivery to the heap.)
//
// Headers as the databases return them (a flat object of plain strings,
// such as a traceparent) are read by hand, with two allocations: the map
// and one string holding every key and value. Anything else (escapes, a
// non-string value, bytes that are not plain UTF-8, bad JSON) goes to
// json.Unmarshal, so the result is always what json.Unmarshal gives.
func decodeHeaders(b []byte) (map[string]string, error) {
	if h, ok := plainHeaders(b); ok {
		return h, nil
	}
	var h map[string]string
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, DeadLetter(fmt.Errorf("invalid headers: %w", err))
	}
	return h, nil
}

// plainHeaders decodes b when it is a JSON object whose keys and values are
// strings without escapes or control characters, in valid UTF-8, with
// distinct keys; ok is false otherwise (and for null), and the caller then
// decodes b with json.Unmarshal.
func plainHeaders(b []byte) (h map[string]string, ok bool) {
	// First pass: check the shape and count the pairs.
	pairs, i := 0, skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		if skipSpace(b, i+1) != len(b) {
			return nil, false
		}
		return map[string]string{}, true
	}
	for {
		var ok bool
		if _, _, i, ok = plainString(b, i); !ok {
			return nil, false
		}
		if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
			return nil, false
		}
		if _, _, i, ok = plainString(b, skipSpace(b, i+1)); !ok {
			return nil, false
		}
		pairs++
		if i = skipSpace(b, i); i >= len(b) {
			return nil, false
		}
		if b[i] == '}' {
			if skipSpace(b, i+1) != len(b) {
				return nil, false
			}
			break
		}
		if b[i] != ',' {
			return nil, false
		}
		i = skipSpace(b, i+1)
	}
	// Second pass: one string for all, keys and values sliced from it.
	s := string(b)
	h = make(map[string]string, pairs)
	i = skipSpace(b, 0) + 1
	for n := 0; n < pairs; n++ {
		ks, ke, j, _ := plainString(b, skipSpace(b, i))
		j = skipSpace(b, j) + 1 // ':'
		vs, ve, j, _ := plainString(b, skipSpace(b, j))
		k := s[ks:ke]
		if _, dup := h[k]; dup {
			return nil, false // json.Unmarshal keeps the last: leave it the case
		}
		h[k] = s[vs:ve]
		i = skipSpace(b, j) + 1 // ',' or '}'
	}
	return h, true
}

// plainString reads the JSON string at b[i] if it has no escape and no
// control character and is valid UTF-8: its contents are b[start:end], and
// next is the index after its closing quote.
func plainString(b []byte, i int) (start, end, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, 0, 0, false
	}
	start = i + 1
	ascii := true
	for j := start; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			if !ascii && !utf8.Valid(b[start:j]) {
				return 0, 0, 0, false
			}
			return start, j, j + 1, true
		case c == '\\' || c < 0x20:
			return 0, 0, 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return 0, 0, 0, false
}
