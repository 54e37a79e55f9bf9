package outbox

import (
	"testing"
	"time"
)

func TestNextFollowUp(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name              string
		step, since, poll time.Duration
		want              time.Duration
		hot               bool
	}{
		{"just woken", 5 * ms, 0, time.Second, 5 * ms, true},
		{"within eight steps", 5 * ms, 39 * ms, time.Second, 5 * ms, true},
		{"an eighth of the time since", 5 * ms, 200 * ms, time.Second, 25 * ms, true},
		{"back to the poll", 5 * ms, 8 * time.Second, time.Second, time.Second, false},
		{"past the window", 5 * ms, time.Hour, time.Second, time.Second, false},
		{"step as long as the poll", time.Second, 0, time.Second, time.Second, false},
		{"long poll", 5 * ms, 2 * time.Second, time.Minute, 250 * ms, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, hot := nextFollowUp(tc.step, tc.since, tc.poll)
			if got != tc.want || hot != tc.hot {
				t.Fatalf("nextFollowUp(%v, %v, %v) = %v, %v; want %v, %v", tc.step, tc.since, tc.poll, got, hot, tc.want, tc.hot)
			}
		})
	}
}

// TestFollowUpWindow: an idle relay woken once claims a bounded number of
// times before it is back to its poll interval, the count written in
// wakeDecay's comment.
func TestFollowUpWindow(t *testing.T) {
	for _, tc := range []struct {
		step, poll time.Duration
		claims     int // at most, the waking claim included
		window     time.Duration
	}{
		{DefaultNotifyInterval, DefaultPollInterval, 55, 9 * time.Second},
		{DefaultNotifyInterval, time.Minute, 90, 9 * time.Minute},
		{time.Second, time.Second, 1, time.Second},
	} {
		since, claims := time.Duration(0), 1
		for {
			d, hot := nextFollowUp(tc.step, since, tc.poll)
			if !hot {
				break
			}
			since += d
			claims++
		}
		t.Logf("step %v poll %v: %d claims over %v", tc.step, tc.poll, claims, since)
		if claims > tc.claims || since > tc.window {
			t.Fatalf("step %v poll %v: %d claims over %v, want at most %d over %v", tc.step, tc.poll, claims, since, tc.claims, tc.window)
		}
	}
}
