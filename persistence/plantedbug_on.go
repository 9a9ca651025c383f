//go:build plantedbug

package persistence

import "time"

// plantedCommitDelay: part of a deliberate bug for the torture tool's own test
// (see actors/plantedbug_off.go). Never ship.
const plantedCommitDelay = 50 * time.Millisecond
