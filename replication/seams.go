package replication

import (
	"go.etcd.io/raft/v3/raftpb"
)

// GroupID names a raft group (a partition). NodeID names a node (an Engine).
// ReplicaID is a replica's raft id inside its group; in step 1 the caller
// picks them (the tests use the node id), placement assigns them later.
type (
	GroupID   uint64
	NodeID    uint64
	ReplicaID uint64
)

// Envelope is one raft message on the wire: raftpb.Message has no group field,
// so the group travels beside it. Msg.To and Msg.From are replica ids.
//
// Removed marks a removal notice, not a raft message: replica Msg.From of
// Group applied a committed configuration without replica Msg.To (Msg.Term is
// its term; Msg.Type is unset). The receiver retires that replica, as
// RemoveGroup would (confchange.go, tellGone).
type Envelope struct {
	Group   GroupID
	Msg     *raftpb.Message
	Removed bool
}

// Transport carries raft messages between engines (design section 4).
//
// Send hands over one batch for node to; the engine calls it once per
// destination per processing pass and from the pipeline's response delivery.
// It must not block for long (queue, or drop: raft retransmits) and must not
// call back into the engine on the caller's goroutine. The engine does not
// touch the envelopes or messages after Send, and the receiver must not share
// them with the sender (a real transport serialises them).
//
// The receiving side hands what arrives to Engine.Receive.
type Transport interface {
	Send(to NodeID, batch []Envelope)
}

// Pipeline is the node's storage seam, raft's "local append thread" and
// "local apply thread" (raft's doc.go, "Usage with Asynchronous Storage
// Writes"). Step 1 backs it with replicationtest.MemPipeline; step 2 with
// persistence's WAL (the committer appends, the applier applies).
//
// Append and Apply only queue: they never block on I/O and may be called from
// any engine worker. Each of the two is one FIFO for the whole engine: jobs of
// one group are handled in the order they were queued (jobs of different
// groups may share one sync).
type Pipeline interface {
	// Append queues job.Msg, a MsgStorageAppend: its Entries (which may
	// overwrite a suffix of the log), its HardState fields (Term, Vote,
	// Commit: all set or all unset) and its Snapshot (installed: the state
	// machine, its ConfState and applied index become the snapshot's, the
	// log restarts after it; entries of earlier apply jobs at or below its
	// index are then skipped). Once all of it is
	// durable AND visible through the group's raft.Storage, call job.Done
	// exactly once; the engine then delivers job.Msg.Responses. Jobs that
	// are never durable (a crash, Close) never see Done.
	Append(job Job)
	// Apply queues job.Msg, a MsgStorageApply: its Entries are committed and
	// locally durable; apply them to the state machine in order, then call
	// job.Done exactly once. Entries whose Type is not EntryNormal are
	// configuration changes: the state machine keeps the ConfState after
	// them (NextConfState) with its applied index (the engine hands them to
	// raft after Done). The group's raft.Storage must return that ConfState
	// from InitialState, and from Snapshot the state at the applied index.
	Apply(job Job)
}

// Job is one storage message of one group.
type Job struct {
	Group GroupID
	Msg   *raftpb.Message
	// Done is the engine's: it delivers Msg.Responses (to the group's own
	// inbox or to the transport). Safe to call from any goroutine, once.
	Done func()
	// Waited, on an apply job, says a caller waits for its entries (the
	// replica leads, or has proposals or reads pending): a pipeline that
	// batches applies should not hold it back for more.
	Waited bool
}
