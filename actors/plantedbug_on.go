//go:build plantedbug

package actors

// ackBeforeDurable: a deliberate bug for the torture tool's own test. Never ship.
const ackBeforeDurable = true

// PlantedBug: see plantedbug_off.go.
const PlantedBug = ackBeforeDurable
