// Package backoff computes retry delays: capped exponential growth with a
// configurable fraction of full jitter.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy is a capped exponential backoff with jitter.
type Policy struct {
	Base   time.Duration // delay before the first retry, before jitter
	Cap    time.Duration // largest delay, before jitter
	Jitter float64       // fraction of the delay that is random, in [0, 1]
}

// Delay returns the delay before retry n (1 for the first retry): the
// exponential delay d = min(Cap, Base * 2^(n-1)), of which a fraction Jitter
// is drawn uniformly at random: d*(1-Jitter) + rand[0, d*Jitter]. With
// Jitter 1 this is "full jitter".
func (p Policy) Delay(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	if p.Base <= 0 {
		return 0
	}
	d := p.Cap
	if n <= 62 {
		if exp := p.Base << (n - 1); exp > 0 && exp>>(n-1) == p.Base && exp < p.Cap {
			d = exp
		}
	}
	if d <= 0 {
		return 0
	}
	random := time.Duration(float64(d) * p.Jitter)
	fixed := d - random
	if random <= 0 {
		return fixed
	}
	return fixed + rand.N(random+1)
}
