package outbox

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
func NewID() ID { return ID(ulid.Make()) }

// String returns the canonical lower-case UUID form of id.
func (id ID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}

// IsZero reports whether id is the zero ID.
func (id ID) IsZero() bool { return id == ID{} }

// Time returns the creation time encoded in id, to the millisecond.
func (id ID) Time() time.Time { return ulid.Time(ulid.ULID(id).Time()) }

// MarshalText implements encoding.TextMarshaler with the form of [ID.String].
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler; it accepts the form
// [ID.String] returns, in either case.
func (id *ID) UnmarshalText(b []byte) error {
	p, err := ParseID(string(b))
	if err != nil {
		return err
	}
	*id = p
	return nil
}

// ParseID parses the UUID text form of an ID, as returned by [ID.String] or
// printed by the database.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, fmt.Errorf("outbox: parse id %q: want the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", s)
	}
	src := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:]
	if _, err := hex.Decode(id[:], []byte(src)); err != nil {
		return ID{}, fmt.Errorf("outbox: parse id %q: %w", s, err)
	}
	return id, nil
}
