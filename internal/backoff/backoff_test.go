package backoff

import (
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	for _, tc := range []struct {
		p        Policy
		n        int
		min, max time.Duration
	}{
		{Policy{time.Second, time.Minute, 0}, 1, time.Second, time.Second},
		{Policy{time.Second, time.Minute, 0}, 3, 4 * time.Second, 4 * time.Second},
		{Policy{time.Second, time.Minute, 0}, 7, time.Minute, time.Minute},
		{Policy{time.Second, time.Minute, 0}, 1000, time.Minute, time.Minute},
		{Policy{time.Second, time.Minute, 0}, 0, time.Second, time.Second},
		{Policy{time.Second, time.Minute, 1}, 3, 0, 4 * time.Second},
		{Policy{time.Second, time.Minute, 0.5}, 3, 2 * time.Second, 4 * time.Second},
		{Policy{time.Hour, 1 << 62, 0}, 40, 1 << 62, 1 << 62},
		{Policy{0, time.Minute, 1}, 5, 0, 0},
	} {
		for range 200 {
			if d := tc.p.Delay(tc.n); d < tc.min || d > tc.max {
				t.Fatalf("%+v Delay(%d) = %v, want in [%v, %v]", tc.p, tc.n, d, tc.min, tc.max)
			}
		}
	}
	// Full jitter spreads: over many draws both halves of the range occur.
	p := Policy{time.Second, time.Minute, 1}
	low, high := 0, 0
	for range 1000 {
		if p.Delay(3) < 2*time.Second {
			low++
		} else {
			high++
		}
	}
	if low < 100 || high < 100 {
		t.Errorf("full jitter not spread: %d low, %d high", low, high)
	}
}
