// Package alarms owns the durable alarm index and the node's one scheduler.
//
// The index is time-ordered, one per partition, kept under the partition's
// prefix (persistence.PartitionIndexPrefix with IndexKind):
//
//	index prefix | due time (ms, u64 BE, sign flipped) | object (length-prefixed
//	app, type, key) | alarm name  ->  the occurrence's generation (u64 BE)
//
// An object writes its index entries in the same commit as the change that sets
// them (package actors owns the alarm records themselves). The Scheduler keeps
// only the near future in memory: every index entry due at or before its horizon
// is resident, later ones stay on disk until the horizon reaches them. It wakes
// an object by calling Config.Fire, which routes like any other message; an
// object checks a wake-up against its own record, so a stale or repeated wake-up
// is harmless. No goroutine or timer exists per object or per alarm.
package alarms
