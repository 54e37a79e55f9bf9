package outbox

import (
	"strconv"
	"time"
)

// wakePayload is the payload asking relays to claim again after d: its
// microseconds as decimal text (at least 1).
func wakePayload(d time.Duration) string {
	return strconv.FormatInt(max(1, d.Microseconds()), 10)
}

// followUp reads a Wake payload (see wakePayload): the delay after which a
// relay woken by the notification should claim again, 0 when it asks for
// none.
func followUp(payload string) time.Duration {
	if payload == "" || len(payload) > 12 {
		return 0
	}
	us, err := strconv.ParseInt(payload, 10, 64)
	if err != nil || us <= 0 {
		return 0
	}
	return time.Duration(us) * time.Microsecond
}
