//go:build !plantedbug

package actors

// ackBeforeDurable is false in every real build. The torture test builds the
// server with the plantedbug tag, which makes replies leave before their writes
// are durable, to show that the torture checker catches lost acknowledged writes.
const ackBeforeDurable = false

// PlantedBug says whether this binary was built with the plantedbug tag: a
// binary that acknowledges writes before they are durable, for the torture
// tool's own test. `holdfast serve` refuses to run one unless told it is a test.
const PlantedBug = ackBeforeDurable
