// Package replication is Holdfast's multi-raft core (issue 27; design in
// docs/replication-design.md, sections 1.1-1.3 and 2). An Engine hosts the
// local replicas of many raft groups (one go.etcd.io/raft/v3 RawNode each)
// for one node; groups share the node's workers, its storage pipeline and its
// transport. Step 1 runs in process only: replicationtest supplies an
// in-memory pipeline and a simulated network.
//
// # Goroutines and their owners
//
//   - Workers (Config.Workers), owned by the Engine (Start, Close): each pops
//     a ready group from the scheduler, Ticks it once per queued tick (capped
//     at MaxQueuedTicks), Steps its inbox, hands its buffered proposals to
//     raft as one MsgProp, takes one Ready and routes its messages: the
//     MsgStorageAppend to Pipeline.Append, the MsgStorageApply to
//     Pipeline.Apply, the rest to the Transport, one batch per destination
//     node per pass. Advance is never called (AsyncStorageWrites).
//   - The ticker (one), owned by the Engine: every TickInterval it marks every
//     group "tick" in the scheduler; it never touches a RawNode.
//   - The pipeline's goroutines (the append and apply "threads") belong to the
//     Pipeline; the transport's to the Transport. Both call back into the
//     engine only through Job.Done and Engine.Receive, which only queue.
//
// The scheduler (scheduler.go) is a de-duplicated FIFO of groups: a group is
// queued at most once and held by at most one worker; work that arrives
// while a worker holds it re-queues it when the worker lets go. So a group's
// RawNode and its pending proposals are touched by one goroutine at a time.
//
// # The seams
//
//   - Pipeline (seams.go): Append and Apply, each one FIFO per engine. An
//     append job's Done comes only once its entries and HardState are durable
//     and readable through the group's raft.Storage; an apply job's Done once
//     its entries are applied. Done delivers the responses raft attached to
//     the job (votes, MsgAppResps, MsgStorageAppendResp): that is how "persist
//     before send" holds with async writes.
//   - Transport (seams.go): Send(node, batch of Envelopes) out, Engine.Receive
//     in. Envelope carries the group id beside the raftpb.Message.
//     NetTransport (transport.go) is the one between nodes: a queue bounded
//     in bytes and a sender goroutine per destination node, one frame
//     (frame.go) per send, heartbeats coalesced per node pair with their send
//     times (heartbeat.go), over a Carrier (TCPCarrier, tcpcarrier.go). It
//     tells a group through Engine.ReportUnreachable when it drops a message
//     on a full queue or fails to send it.
//
// # Proposals and the output gate
//
// Propose works on the leader only (DisableProposalForwarding: a stale
// leader's write is never forwarded to whoever leads now); elsewhere it
// returns *NotLeaderError with a leader hint. Each proposal becomes one entry
// whose data starts with a Header (proposer replica, engine incarnation,
// sequence number; proposal.go). Propose returns when the entry is committed
// AND applied by this replica, with its index and term. When the applied index
// passes a proposal's index and the entry there is someone else's, the
// proposal fails with ErrNotWritten: a proposal is never reported applied
// unless its own entry was.
//
// # Storage and the actors
//
// WALPipeline (walpipeline.go) is the Pipeline over persistence's
// write-ahead log: appends are raft jobs of the persistence committer (one
// record and one sync for every group's appends and local writes), applies
// go to its applier (a normal entry's payload is a write's changes,
// persistence.AppendChanges), into a database opened replicated. Badger keeps
// no raft state: a replica restarts from the start of its log, with the
// configuration recorded there (Bootstrap, truncations), and applies again
// every committed entry the log holds; its log is truncated to just above
// what Badger holds in synced tables (persistence.Pipeline.RaftFlushed) once
// KeepEntries more were applied.
//
// Proposer (proposer.go) is what the actors' host takes instead of a single
// node's persistence.Pipeline: a Write goes to its partition's group, in the
// term its Epoch names; its Ticket completes when the entry is committed
// (ProposeCommitted: durable on a majority, as a single node's ticket
// completes once durable) and is marked applied once applied here (the
// actors' overlay serves the write until then); a failed write refuses the
// rest of its chain (ProposeAsync's guard, on the group's worker).
// Completing at commit took the leader's apply off every write's path: with
// it, one writer's RF=3 p50 fell from 3.45 ms to about 1.1 ms (the apply
// cost one more hand-off, and the applier's 2 ms wait for more; Waited on an
// apply job now marks only the applies someone waits for: Propose, reads, a
// new leader's first entry).
//
// # Reads
//
// ReadIndex (reads.go) works on the leader only (elsewhere *NotLeaderError)
// and makes a linearizable read possible: raft's ReadIndex with ReadOnlySafe
// (never ReadOnlyLeaseBased) records the leader's commit index and confirms
// it with a heartbeat round to a quorum; a new leader confirms nothing before
// it has committed an entry of its own term. The worker takes the confirmed
// Ready.ReadStates by their request context (engine incarnation and a
// sequence number) and ReadIndex returns once this replica has applied that
// index: the caller's state machine then holds every write acknowledged
// before the call. A read raft has not confirmed fails with
// ErrReadNotConfirmed, never a success, when the replica stops leading or
// changes term (raft drops its rounds then), at Close, or when its context
// ends; a confirmed read waiting for apply stays valid after a step-down.
//
// The leader lease (lease.go, design section 3) makes most reads free of that
// round: LeaseValid(g) (any goroutine, a locked snapshot) holds while no
// other replica can lead a later term, and this replica has applied an entry
// of its own term, so its applied state holds every write of an earlier
// term, and every Propose of this one, acknowledged before the call (a
// ProposeCommitted write of this term may still be on its way to the apply:
// its caller serves it meanwhile). It runs until the quorum-th newest acknowledged heartbeat
// SEND time + (ElectionTick-1) ticks - (one tick + 10%), this replica
// counting as now (CheckQuorum's followers refuse votes for ElectionTick
// ticks after hearing from the leader). Send times come back through
// OnBeatAck (NetConfig.OnBeatAck; replicationtest's Network stamps them the
// same way). Acks of heartbeats sent before the term began or before a
// transfer ended never count; a step-down ends the lease in the pass that
// sees it, before that pass's messages leave; TransferLeader ends it when
// the transfer starts, and after an abandoned transfer it stays off until
// the transferee acked a later heartbeat (its MsgTimeoutNow may still be on
// its way). A replica that starts grants no vote of a higher term for
// ElectionTick ticks (it may have acked a heartbeat a lease counts). Without
// a lease, reads take ReadIndex.
//
// # Membership and snapshots (confchange.go, snapshot.go)
//
// Raft's ConfState is authoritative. ProposeConfChange (leader only) checks a
// ConfChangeV2 against the applied config with NextConfState (a change raft
// could not apply fails with ErrNotWritten instead of panicking every
// replica), proposes it, and returns when it is applied here, like Propose;
// raft drops a second change while one is unapplied or a joint config is not
// left (ErrNotWritten). A conf change entry's Context is the proposal header
// followed by PeersContext (replica -> node of the replicas it adds), so
// every replica learns where new replicas live. When an apply job is Done,
// the worker calls RawNode.ApplyConfChange for each conf change entry, in
// order, before stepping the job's MsgStorageApplyResp, and keeps the group's
// config and address book (GroupConfig.Peers at first) current; Membership
// shows them. NextConfState gives the same ConfState as raft (tested on
// random sequences): the persistent applier stores it with the applied index,
// and a restart gives it back through Storage.InitialState.
//
// ReplaceVoter is the leader's move (design section 5): add a learner, wait
// until its Match reaches the commit index, then one ConfChangeV2 that
// promotes it and removes the replaced voter with ConfChangeTransitionAuto
// (raft leaves the joint config by itself). A new replica starts empty (no
// log, empty ConfState): it cannot campaign, and it learns the group only
// from a snapshot whose config lists it as a learner. A group's initial
// configuration must therefore be in a snapshot at an index of at least 1
// (replicationtest's Bootstrap), never only in an index-0 snapshot a leader
// could answer with log entries from index 1.
//
// StepDownOnRemoval is set. A replica that applies a config without itself
// stops: its proposals and reads fail, the group leaves the engine (Status
// and Propose then answer ErrUnknownGroup) and GroupConfig.OnRemoved tells
// the owner, which deletes its data. Since a leader stops replicating to a
// replica once its removal is applied, it sends a removed replica the entries
// up to its removal, with their commit, a few more times (a MsgApp raft could
// have sent: refused if the log does not match). A removed replica that still
// misses them (cut off meanwhile, leadership moved, the entries compacted)
// campaigns once its election timeout passes; every replica that applied its
// removal answers a message from it with a removal notice (Envelope.Removed,
// the frame's optional last list) instead of stepping it, and the notice
// retires it as RemoveGroup does. A removed learner never campaigns: its
// owner stops it (RemoveGroup, from the placement table).
//
// Snapshots travel inline unless the transport streams them: raft's MsgSnap
// carries Storage.Snapshot()
// (state, index, term, ConfState); the transport calls ReportSnapshot when
// the send ended; the receiver's MsgStorageAppend carries the snapshot and
// the Pipeline installs it (state machine and log replaced, applied index =
// the snapshot's) before Done; the worker then moves the group's applied
// index and config to the snapshot's, and proposals at or below it end with
// ErrOutcomeUnknown. Storage.Snapshot() must describe the state at the
// applied index (a snapshot older than the change that added a learner is
// refused by the learner). NetTransport with NetConfig.Snapshots streams
// the data out of band (snapstream.go; the WALPipeline is source and sink,
// walsnapshot.go): the MsgSnap then carries metadata and a reference only.
//
// # Invariants (checked by replicationtest's model test)
//
//   - No two replicas of a group apply different entries at one index.
//   - A replica's applied index goes up by one, never back, across restarts.
//   - An acknowledged proposal (Propose's, or ProposeCommitted's committed
//     callback) is durable on a majority: it survives any
//     crash that loses only unsynced state, and is applied on a majority once
//     the cluster heals.
//   - A proposal reported ErrNotWritten is never applied.
//   - A successful ReadIndex's index covers every proposal acknowledged
//     before the read was issued, and the replica has applied it.
//   - While LeaseValid holds on a replica, no replica leads a later term,
//     and its applied index covers every proposal Propose acknowledged
//     before (not every ProposeCommitted one: its own caller serves that
//     write until applied, and WaitPartition covers it).
//   - Replicas at one applied index hold the same state and config; an
//     installed snapshot holds the group's state and config at its index.
//   - A replica is a learner in the first config naming it (and in the
//     first config a new replica learns), and never campaigns before a
//     config made it a voter.
//
// A raft panic (a broken invariant, e.g. a log that lost acknowledged
// entries) fails that group only (ErrGroupFailed, Engine.Err); the node and
// its other groups go on.
package replication
