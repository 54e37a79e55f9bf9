package outbox

import (
	"strconv"
	"time"
)

// maxFollowUpStep bounds the follow-up step a coalescing publisher's
// notification asks for (see Config.NotifyInterval): how long a silent
// publish committed while relays are following up waits for the next
// claim, at most. Notifications are coalesced for the publishers' sake
// (their commits); the follow-ups are the relays' claims, short enough
// that the wait stays under the time a claim takes on a busy server.
const maxFollowUpStep = 2 * time.Millisecond

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

// wakeDecay sets how long a relay keeps claiming at short intervals after
// a coalescing publisher's wake-up (see Config.NotifyInterval): after a
// claim that did not fill its limit, it claims again after the follow-up
// the notification asked for, or after an eighth of the time since the
// wake-up (or since a follow-up claim last found messages), whichever is
// longer, until that reaches its poll interval.
//
// A publish made silent by coalescing is found within about an eighth of
// the time its transaction committed after the wake-up, so the longer
// transactions that open the hole are covered too, and an idle relay
// pays about 8 + 8.5*ln(PollInterval/step) claims per wake-up window
// (61 with the defaults' 2ms step and 1s poll, over 8 s, where polling
// alone makes 8) instead of one per step: 8 at the step, then one each
// time the time since the wake-up grows by an eighth (1/ln(9/8) = 8.5 per
// factor e) from 8 steps to 8 poll intervals.
const wakeDecay = 8

// nextFollowUp returns the delay before a woken relay's next claim, given
// the follow-up step the wake-up asked for and the time since the relay
// was woken (or a follow-up last found messages); hot is false once that
// delay reaches poll, when the relay is back to its poll interval.
func nextFollowUp(step, since, poll time.Duration) (d time.Duration, hot bool) {
	d = max(step, since/wakeDecay)
	if d >= poll {
		return poll, false
	}
	return d, true
}
