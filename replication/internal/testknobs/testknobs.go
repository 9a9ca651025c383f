// Package testknobs lets replicationtest plant bugs in a replication.Engine
// without exporting them: only packages under replication/ can import it.
// Package replication fills the hooks at init. Nothing else may call them.
package testknobs

import "time"

// StaleReads, set by package replication, plants the stale-read bug in an
// engine (a *replication.Engine) before its Start: ReadIndex is answered from
// the replica's own commit index, without a quorum round, so a leader cut off
// from the majority keeps serving reads while a new leader takes writes. The
// model test must catch it.
var StaleReads func(engine any)

// LeaseClock, set by package replication, replaces an engine's lease clock
// (time.Now) before its Start, so that a test can skew it.
var LeaseClock func(engine any, now func() time.Time)

// LeaseIgnoresTransfer, set by package replication, plants the bug "the lease
// is not ended when a leadership transfer starts" in an engine before its
// Start: the transferee's forced campaign bypasses the followers' lease, so
// the old leader serves lease reads while the new one takes writes. The model
// test must catch it.
var LeaseIgnoresTransfer func(engine any)

// TruncateApplied, set by package replication, plants the truncation bug in
// a pipeline (a *replication.WALPipeline) before its first apply: a replica's
// log is truncated to start after its APPLIED index instead of after what
// Badger holds in synced tables (RaftFlushed), so entries Badger holds only
// in memtables leave the log. The power-cut test must catch it.
var TruncateApplied func(pipeline any)
