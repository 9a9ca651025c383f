//go:build race

package replicationtest

// raceEnabled: the tests run under the race detector.
const raceEnabled = true
