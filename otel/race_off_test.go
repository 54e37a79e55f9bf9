//go:build !race

package oncommitotel_test

const raceEnabled = false
