// Package alarms will own the durable alarm index (time-ordered, in the object's
// partition, written in the same commit as the change that sets it) and the node's
// one scheduler that wakes objects through the normal routing.
//
// It holds no code yet: durable alarms arrive with it. It sits below actors.
package alarms
