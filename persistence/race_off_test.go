//go:build !race

package persistence

// raceEnabled: the tests run under the race detector.
const raceEnabled = false
