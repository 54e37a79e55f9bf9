package outbox

import (
	"testing"
	"time"
)

// TestOverlapGauge: claims overlap while an overlapped claim takes less
// than overlapGain times one made alone, not when it takes longer (a busy
// database), and every probeEvery full claims the gauge tries the other
// way for probeClaims claims, so a database that becomes idle (or busy)
// is noticed.
func TestOverlapGauge(t *testing.T) {
	var g overlapGauge
	if !g.pays() {
		t.Fatal("with no sample, overlapping should be tried")
	}
	g.record(2*time.Millisecond, false)
	g.record(2600*time.Microsecond, true) // 1.3x: two claims in 1.3 claims' time
	if !g.pays() {
		t.Errorf("overlapped %v against alone %v: should overlap", g.over, g.solo)
	}
	for range 40 {
		g.record(5*time.Millisecond, true) // 2.5x: the database is busy
	}
	if g.pays() {
		t.Errorf("overlapped %v against alone %v: should not overlap", g.over, g.solo)
	}
	// Claims alone until the probe: then probeClaims overlapped ones.
	k := 0
	for g.pays() == false {
		g.record(2*time.Millisecond, false)
		if k++; k > probeEvery {
			t.Fatalf("no probe after %d claims", k)
		}
	}
	for range probeClaims {
		if !g.pays() {
			t.Fatal("the probe should overlap claims")
		}
		g.record(2500*time.Microsecond, true) // the database has room again: 1.25x
	}
	if !g.pays() {
		t.Errorf("after a probe that found overlapping pays (overlapped %v, alone %v), claims should overlap", g.over, g.solo)
	}
	// And the probe while overlapping: claims alone, from a fresh average.
	k = 0
	for g.pays() {
		g.record(2500*time.Microsecond, true)
		if k++; k > probeEvery {
			t.Fatalf("no probe after %d claims", k)
		}
	}
	for range probeClaims {
		if g.pays() {
			t.Fatal("the probe should make claims alone")
		}
		g.record(time.Millisecond, false) // alone is much faster now: the database is busy
	}
	if g.pays() {
		t.Errorf("after a probe that found overlapping does not pay (overlapped %v, alone %v), claims should not overlap", g.over, g.solo)
	}
}
