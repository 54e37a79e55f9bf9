package outbox

import "time"

// CheckJSON exposes checkJSON to the external tests.
var CheckJSON = checkJSON

// Silence makes o's publishes silent for d (plus NotifyInterval), as if
// one had notified d from now.
func Silence(o *Outbox, d time.Duration) {
	o.lastNotify.Store(int64(time.Since(o.epoch) + d))
}

// WindowProbes returns how many times r's probe found a due message before
// its claims' window.
func WindowProbes(r *Relay) int64 { return r.win.probes.Load() }

// AlwaysWindows makes r claim in windows whatever its probe measures.
func AlwaysWindows(r *Relay) {
	r.win.always = true
	r.win.on.Store(true)
}

// WarnHorizonAfter makes r warn about a holder of the MVCC horizon after d.
func WarnHorizonAfter(r *Relay, d time.Duration) { r.horizonWarn = d }
