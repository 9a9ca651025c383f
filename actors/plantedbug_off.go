//go:build !plantedbug

package actors

// ackBeforeDurable is false in every real build. The torture test builds the
// server with the plantedbug tag, which makes replies leave before their writes
// are durable, to show that the torture checker catches lost acknowledged writes.
const ackBeforeDurable = false
