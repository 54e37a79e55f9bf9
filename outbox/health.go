package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// ListenerState says whether a relay is listening for wake-up
// notifications.
type ListenerState int

// The states of a relay's listener.
const (
	// ListenerOff: the relay polls only, or Run is not running.
	ListenerOff ListenerState = iota
	// ListenerConnecting: opening the listening connection.
	ListenerConnecting
	// ListenerListening: LISTEN is in force; publishes wake the relay.
	ListenerListening
	// ListenerDown: the connection was lost; the relay polls and
	// reconnects.
	ListenerDown
)

func (s ListenerState) String() string {
	switch s {
	case ListenerOff:
		return "off"
	case ListenerConnecting:
		return "connecting"
	case ListenerListening:
		return "listening"
	case ListenerDown:
		return "down"
	}
	return fmt.Sprintf("ListenerState(%d)", int(s))
}

// Errors of [Health.Err].
var (
	// ErrRelayNotRunning: Run has not been called, or has returned.
	ErrRelayNotRunning = errors.New("outbox: relay is not running")
	// ErrRelayDraining: Run's context has ended.
	ErrRelayDraining = errors.New("outbox: relay is shutting down")
	// ErrRelayFailing: the relay's last claims failed; the error also
	// wraps the last one.
	ErrRelayFailing = errors.New("outbox: relay cannot claim")
)

// unhealthyAfter is the number of failed claims in a row after which
// [Health.Err] reports the relay as failing. The relay retries a failed
// claim with backoff (100 ms, 200 ms, 400 ms... up to the poll interval or
// 10 s), so three failures span about a second of trouble.
const unhealthyAfter = 3

// Health is a snapshot of a relay's state, from [Relay.Health].
type Health struct {
	// Running is true from the start of Run until it returns.
	Running bool
	// Draining is true once Run's context has ended.
	Draining bool
	// LastClaim is when the last successful claim ended.
	LastClaim time.Time
	// ConsecutiveErrors counts the claims that failed since the last
	// success; LastError is the last of them.
	ConsecutiveErrors int
	LastError         error
	// Listener is the state of the wake-up listener.
	Listener ListenerState
	// ListenerConnects counts the connections LISTEN took effect on since
	// Run started.
	ListenerConnects int
	// Running handlers, at the time of the snapshot.
	InFlight int
	// Stream is the relay's reading of its dialect's message stream
	// (PostgreSQL's WAL transport); zero without one.
	Stream StreamHealth
	// Cleanup is the relay's last reading of what keeps the table's
	// deleted rows (PostgreSQL); zero with other dialects.
	Cleanup CleanupHealth
}

// CleanupHealth is what keeps the outbox table's deleted rows from being
// reclaimed, in [Health]: the relay reads it every ten poll intervals
// (between half a second and 30 seconds). While an old snapshot is open
// (a long REPEATABLE READ transaction, pg_dump, a session idle in
// transaction, a replication slot or a hot standby's feedback), VACUUM
// cannot remove the rows delivered messages leave; the relay logs one
// warning when a holder has held for a minute. Its errors are not
// [Health.Err]'s.
type CleanupHealth struct {
	// CheckedAt is when the relay last read it; zero when it never did.
	CheckedAt time.Time
	// DeadRows is the table's dead row versions, as the database last
	// counted them (PostgreSQL: pg_stat_all_tables.n_dead_tup).
	DeadRows int64
	// AutovacuumOff is true when autovacuum is off for the server or the
	// table: nothing removes the dead rows but a VACUUM someone runs.
	AutovacuumOff bool
	// Holder names the oldest snapshot or transaction holding back
	// cleanup ("pid 4242 (idle in transaction, application psql)",
	// "replication slot s1", "standby s2 (hot_standby_feedback)",
	// "prepared transaction g1"), "" when none is open. A session of
	// another role shows no state unless the relay's role may read it
	// (pg_read_all_stats).
	Holder string
	// HolderAge is how long the holder has held: its transaction's age
	// for a session or a prepared transaction, else how long this relay
	// has seen it.
	HolderAge time.Duration
	// HolderXIDs is the holder's xmin age in transaction ids.
	HolderXIDs int64
	// LastError is the last reading's error, nil when it succeeded.
	LastError error
}

// StreamHealth is a relay's reading of its dialect's message stream, in
// [Health]. Its errors are not [Health.Err]'s: the relay goes on claiming
// from the table while it tries the stream again.
type StreamHealth struct {
	// Reading is true while this relay reads the stream; one relay at a
	// time does, the others stand by.
	Reading bool
	// Lag is how far the reading is behind, while Reading: the bytes the
	// database keeps for the stream past its settled position, and when
	// the oldest message read and not settled was committed.
	Lag StreamLag
	// ConsecutiveErrors counts the failed opens and reads of the stream
	// since it was last opened (another relay reading it is none);
	// LastError is the last of them.
	ConsecutiveErrors int
	LastError         error
}

// Err returns nil when the relay is running and claiming, else
// [ErrRelayNotRunning], [ErrRelayDraining] or, after three failed claims in
// a row, [ErrRelayFailing]. A listener that is down is no error.
func (h Health) Err() error {
	switch {
	case !h.Running:
		return ErrRelayNotRunning
	case h.Draining:
		return ErrRelayDraining
	case h.ConsecutiveErrors >= unhealthyAfter:
		return &failingError{h.ConsecutiveErrors, h.LastError}
	}
	return nil
}

// failingError is ErrRelayFailing with the last claim error.
type failingError struct {
	n    int
	last error
}

func (e *failingError) Error() string {
	s := fmt.Sprintf("%s: %d claims failed in a row", ErrRelayFailing, e.n)
	if e.last != nil {
		s += "; the last: " + strings.TrimPrefix(e.last.Error(), prefix)
	}
	return s
}

func (e *failingError) Unwrap() []error { return []error{ErrRelayFailing, e.last} }

// health is the state Relay.Health reports, written by the relay's loops.
type health struct {
	mu sync.Mutex
	h  Health
}

func (hs *health) set(f func(h *Health)) {
	hs.mu.Lock()
	f(&hs.h)
	hs.mu.Unlock()
}

// claimed records the end of a claim.
func (hs *health) claimed(err error) {
	hs.mu.Lock()
	if err == nil {
		hs.h.LastClaim = time.Now()
		hs.h.ConsecutiveErrors, hs.h.LastError = 0, nil
	} else {
		hs.h.ConsecutiveErrors++
		hs.h.LastError = err
	}
	hs.mu.Unlock()
}

// listener records the listener's state; connected counts a connection
// that reached LISTEN.
func (hs *health) listener(s ListenerState, connected bool) {
	hs.mu.Lock()
	hs.h.Listener = s
	if connected {
		hs.h.ListenerConnects++
	}
	hs.mu.Unlock()
}

// Health returns a snapshot of the relay's state, cheaply, from any
// goroutine; for a readiness probe:
//
//	http.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
//		if err := relay.Health().Err(); err != nil {
//			http.Error(w, err.Error(), http.StatusServiceUnavailable)
//		}
//	})
func (r *Relay) Health() Health {
	r.health.mu.Lock()
	h := r.health.h
	r.health.mu.Unlock()
	h.InFlight = r.inflightCount()
	if l, reading, err := r.StreamLag(context.Background()); reading && err == nil {
		h.Stream.Lag = l
	}
	return h
}
