package outbox

import "time"

// CheckJSON exposes checkJSON to the external tests.
var CheckJSON = checkJSON

// Silence makes o's publishes silent for d (plus NotifyInterval), as if
// one had notified d from now.
func Silence(o *Outbox, d time.Duration) {
	o.lastNotify.Store(int64(time.Since(o.epoch) + d))
}
