//go:build race

package oncommitotel_test

// raceEnabled: under the race detector sync.Pool drops a share of what it
// is given, so allocation counts are not asserted.
const raceEnabled = true
