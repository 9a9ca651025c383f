package replication

import "go.etcd.io/raft/v3"

// Snapshots (design section 6; streaming: snapstream.go, walsnapshot.go). Raft
// emits a MsgSnap when a follower needs entries the leader's log no longer
// has (or a new replica needs everything): the snapshot it carries is
// Storage.Snapshot(), data inline. The transport carries it like any message
// and, once the send ended, calls ReportSnapshot; the receiver's RawNode puts
// it in a MsgStorageAppend, whose job the Pipeline installs (state machine
// and log replaced, applied index = the snapshot's) before calling Done; the
// job's MsgStorageAppendResp then carries the snapshot back and the worker
// moves the group's applied index and config to the snapshot's
// (installedSnapshot, confchange.go). With a streaming transport the data go
// out of band and the MsgSnap carries a reference: the engine side is the
// same.

// snapReport is one ReportSnapshot call waiting for the worker.
type snapReport struct {
	to     ReplicaID
	status raft.SnapshotStatus
}

// ReportSnapshot tells group g's replica (a leader) how sending a snapshot to
// replica to ended: raft.SnapshotFinish once it was handed over, or
// raft.SnapshotFailure if it was lost; raft pauses sending to a follower
// until it hears one or the other (or the follower's answer). It only
// queues, so it is safe from any goroutine (the transport's). Unknown
// groups are ignored.
func (e *Engine) ReportSnapshot(g GroupID, to ReplicaID, status raft.SnapshotStatus) {
	if e.closed.Load() {
		return
	}
	grp := e.group(g)
	if grp == nil || to == grp.replica {
		return
	}
	grp.mu.Lock()
	grp.member.snapReports = append(grp.member.snapReports, snapReport{to: to, status: status})
	grp.mu.Unlock()
	e.sched.enqueue(grp, flagMessage)
}

// reportSnapshots hands the queued snapshot outcomes to raft (worker only).
func (g *group) reportSnapshots() {
	g.mu.Lock()
	rs := g.member.snapReports
	g.member.snapReports = nil
	g.mu.Unlock()
	for _, r := range rs {
		g.rn.ReportSnapshot(uint64(r.to), r.status)
	}
}
