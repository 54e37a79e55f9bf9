package outboxdriver

import (
	"encoding/hex"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"
)

// ID identifies one message. It is a ULID: 48 bits of milliseconds then 80
// bits of randomness, generated monotonically within a process so ids sort by
// creation time and the claim index stays local.
//
// An ID has exactly one text form, the canonical UUID form
// (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, lower case). It is what
// [ID.String] returns, what a handler sees and what PostgreSQL prints for
// the uuid column, so the id in a log line can be pasted into SQL.
// Use it as the idempotency key of side effects.
type ID [16]byte

// NewID returns a new, time-ordered ID. It is safe for concurrent use.
func NewID() ID {
	var id ID
	NewIDs(1, func(_ int, v ID) { id = v })
	return id
}

// String returns the canonical lower-case UUID form of id.
func (id ID) String() string {
	var b [36]byte
	return string(id.AppendText(b[:0]))
}

// AppendText implements encoding.TextAppender: it appends the form of
// [ID.String] to b.
func (id ID) AppendText(b []byte) []byte {
	b = hex.AppendEncode(b, id[0:4])
	b = append(b, '-')
	b = hex.AppendEncode(b, id[4:6])
	b = append(b, '-')
	b = hex.AppendEncode(b, id[6:8])
	b = append(b, '-')
	b = hex.AppendEncode(b, id[8:10])
	b = append(b, '-')
	return hex.AppendEncode(b, id[10:])
}

// IsZero reports whether id is the zero ID.
func (id ID) IsZero() bool { return id == ID{} }

// Time returns the creation time encoded in id, to the millisecond.
func (id ID) Time() time.Time { return ulid.Time(ulid.ULID(id).Time()) }

// MarshalText implements encoding.TextMarshaler with the form of [ID.String].
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler; it accepts the form
// [ID.String] returns, in either case.
// It allocates nothing (a relay decodes every claimed id with it).
func (id *ID) UnmarshalText(b []byte) error {
	p, err := parseID(b)
	if err != nil {
		return err
	}
	*id = p
	return nil
}

// ParseID parses the UUID text form of an ID, as returned by [ID.String] or
// printed by the database.
func ParseID(s string) (ID, error) { return parseID(s) }

func parseID[T string | []byte](s T) (ID, error) {
	var id ID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, fmt.Errorf("outbox: parse id %q: want the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", string(s))
	}
	// The groups of hex digits and where their bytes go.
	for _, g := range [...]struct{ from, to, at int }{{0, 8, 0}, {9, 13, 4}, {14, 18, 6}, {19, 23, 8}, {24, 36, 10}} {
		for i := g.from; i < g.to; i += 2 {
			hi, ok1 := unhex(s[i])
			lo, ok2 := unhex(s[i+1])
			if !ok1 || !ok2 {
				return ID{}, fmt.Errorf("outbox: parse id %q: invalid hex digit", string(s))
			}
			id[g.at+(i-g.from)/2] = hi<<4 | lo
		}
	}
	return id, nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
