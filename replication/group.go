package replication

import (
	"fmt"
	"sync"
	"sync/atomic"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// GroupConfig describes the local replica of one group.
type GroupConfig struct {
	ID GroupID
	// Replica is the local replica's raft id (non-zero).
	Replica ReplicaID
	// Peers maps every replica of the group (the local one included) to its
	// node: the starting address book. Conf changes applied later update it
	// (their Context names the nodes of the replicas they add; confchange.go).
	Peers map[ReplicaID]NodeID
	// Storage is the group's log as the pipeline made it durable: raft reads
	// it, the pipeline writes it (before calling an append job's Done). Its
	// InitialState gives the HardState and the ConfState (the voters).
	Storage raft.Storage
	// Applied is the index the state machine has applied (durably): raft
	// re-emits committed entries above it. Storage's ConfState must be the
	// config at this index.
	Applied uint64
	// OnRemoved, if set, is called once when this replica applies a config
	// that no longer lists it: the group has then stopped and left the
	// engine, and the owner deletes the replica's data. It runs on an engine
	// worker: it must not block or call the engine back synchronously.
	OnRemoved func(GroupID, ReplicaID)
}

// Result is a proposal's outcome: its entry's index and term, committed and
// applied on this replica.
type Result struct {
	Index uint64
	Term  uint64
}

// Proposal states (proposal.state).
const (
	propQueued    int32 = iota // in the group's buffer
	propProposed               // handed to raft by the worker
	propAbandoned              // the caller gave up before the worker took it
)

// proposal is one Propose call waiting for its outcome.
type proposal struct {
	payload []byte
	cc      *raftpb.ConfChangeV2 // set for a conf change (ProposeConfChange)
	state   atomic.Int32
	done    chan outcome // buffered 1: finish never blocks
	// ProposeAsync's: cb replaces done; term, if not zero, is the term the
	// proposal is for; guard, if set, may refuse it as it is handed to raft.
	cb    func(Result, error)
	term  uint64
	guard func() error
	// committed, if set (ProposeCommitted), hears once that the entry is
	// committed, before this replica applies it; cb then tells the apply.
	committed func(Result)

	// Worker-owned, once proposed.
	seq        uint64
	index      uint64 // its entry's index, once seen in a MsgStorageAppend (0 before)
	toldCommit bool   // committed was called
}

// waitsApply says whether the proposal's caller waits for the apply (every
// proposal but ProposeCommitted's): its group's apply jobs are then Waited.
func (p *proposal) waitsApply() bool { return p.committed == nil }

type outcome struct {
	res Result
	err error
}

func (p *proposal) finish(res Result, err error) {
	if p.cb != nil {
		p.cb(res, err)
		return
	}
	p.done <- outcome{res, err}
}

// group is the local replica of one raft group.
//
// Ownership: the RawNode and every "worker-owned" field are touched only by
// the worker holding the group (the scheduler hands a group to one worker at
// a time; its mutex orders one holder's writes before the next one's reads).
// inbox and props are filled by any goroutine under mu. The status atomics are
// written by the holder and read by anyone.
type group struct {
	id      GroupID
	replica ReplicaID
	member  memberState // peers, config, removal (confchange.go)

	sched schedState // guarded by scheduler.mu

	mu      sync.Mutex
	inbox   []*raftpb.Message // received messages and storage responses, in arrival order
	props   []*proposal       // proposals not yet handed to raft
	spare   []*raftpb.Message // the previous inbox's backing array, reused
	unreach []ReplicaID       // peers the transport could not reach (ReportUnreachable)
	reads   []*readReq        // reads not yet handed to raft (reads.go)
	xfers   []*transferReq    // TransferLeader calls not yet handed to raft (lease.go)

	// Worker-owned.
	rn      *raft.RawNode
	pending map[uint64]*proposal // proposed, outcome not known yet, by seq
	// applyWaiters counts the proposals in pending whose caller waits for
	// the apply (waitsApply); addPending and dropPending keep it.
	applyWaiters int
	// readPending: reads handed to raft, not confirmed yet, by request
	// context; readWaiting: confirmed reads waiting for applied >= index.
	readPending map[string]*readReq
	readWaiting []*readReq
	applied     uint64 // last index applied (from MsgStorageApplyResp)
	lead        ReplicaID
	role        raft.StateType
	term        uint64
	failed      error
	// Lease and transfers (lease.go): the term of the last applied entry,
	// ticks since the replica started, a transfer in progress, its waiters.
	appliedTerm  uint64
	startTicks   int
	transferring bool
	transferWait []*transferReq
	confApplied  bool // a conf change entry was applied: the lease's voters may differ

	lease leaseState // its own lock (lease.go)

	// Published by the holder for Propose and Status.
	stLead    atomic.Uint64 // ReplicaID
	stTerm    atomic.Uint64
	stRole    atomic.Uint32 // raft.StateType
	stApplied atomic.Uint64
	stFailed  atomic.Pointer[error]
}

func newGroup(cfg GroupConfig, e *Engine) (*group, error) {
	if cfg.Replica == 0 {
		return nil, fmt.Errorf("replication: group %d: Replica must be non-zero", cfg.ID)
	}
	if _, ok := cfg.Peers[cfg.Replica]; !ok {
		return nil, fmt.Errorf("replication: group %d: Peers lacks the local replica %d", cfg.ID, cfg.Replica)
	}
	if cfg.Storage == nil {
		return nil, fmt.Errorf("replication: group %d: Storage is nil", cfg.ID)
	}
	peers := make(map[ReplicaID]NodeID, len(cfg.Peers))
	for r, n := range cfg.Peers {
		peers[r] = n
	}
	_, cs, err := cfg.Storage.InitialState()
	if err != nil {
		return nil, fmt.Errorf("replication: group %d: storage: %w", cfg.ID, err)
	}
	c := e.cfg
	rn, err := newRawNode(cfg, &raft.Config{
		ID:                        uint64(cfg.Replica),
		ElectionTick:              c.ElectionTick,
		HeartbeatTick:             c.HeartbeatTick,
		Storage:                   cfg.Storage,
		Applied:                   cfg.Applied,
		AsyncStorageWrites:        true,
		MaxSizePerMsg:             c.MaxSizePerMsg,
		MaxCommittedSizePerReady:  c.MaxCommittedSizePerReady,
		MaxUncommittedEntriesSize: c.MaxUncommittedEntriesSize,
		MaxInflightMsgs:           c.MaxInflightMsgs,
		MaxInflightBytes:          c.MaxInflightBytes,
		CheckQuorum:               true,
		PreVote:                   true,
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true,
		Logger:                    raftLogger{c.Logger.With("group", uint64(cfg.ID), "replica", uint64(cfg.Replica))},
	})
	if err != nil {
		return nil, fmt.Errorf("replication: group %d: %w", cfg.ID, err)
	}
	g := &group{
		id:          cfg.ID,
		replica:     cfg.Replica,
		rn:          rn,
		pending:     make(map[uint64]*proposal),
		readPending: make(map[string]*readReq),
		applied:     cfg.Applied,
		role:        raft.StateFollower,
	}
	g.lease.self, g.lease.expiry, g.lease.acks = cfg.Replica, never, make(map[ReplicaID]int64)
	g.stApplied.Store(cfg.Applied)
	g.member.peers.Store(&peers)
	g.member.onRemoved = cfg.OnRemoved
	g.member.storage = cfg.Storage
	g.setConf(raftpb.EnsureConfState(cs), nil)
	return g, nil
}

// push appends messages to the inbox; the caller then enqueues flagMessage.
func (g *group) push(ms ...*raftpb.Message) {
	g.mu.Lock()
	g.inbox = append(g.inbox, ms...)
	g.mu.Unlock()
}

// take empties the inbox and the proposal buffer (worker only).
func (g *group) take() ([]*raftpb.Message, []*proposal) {
	g.mu.Lock()
	msgs, props := g.inbox, g.props
	g.inbox, g.props, g.spare = g.spare[:0], nil, nil
	g.mu.Unlock()
	return msgs, props
}

// recycle returns a processed inbox's array for reuse (worker only).
func (g *group) recycle(msgs []*raftpb.Message) {
	clear(msgs)
	g.mu.Lock()
	if g.spare == nil && cap(msgs) <= 1024 {
		g.spare = msgs[:0]
	}
	g.mu.Unlock()
}

// notLeader builds the error for a proposal on a non-leader.
func (g *group) notLeader() *NotLeaderError {
	lead := ReplicaID(g.stLead.Load())
	node, _ := g.peer(lead)
	return &NotLeaderError{Group: g.id, Leader: node, Term: g.stTerm.Load()}
}

// publish makes the worker's view of leadership visible to Propose and Status.
func (g *group) publish() {
	g.stLead.Store(uint64(g.lead))
	g.stTerm.Store(g.term)
	g.stRole.Store(uint32(g.role))
}

// resolveApplied settles pending proposals against entries the state machine
// just applied (worker only, before stepping their MsgStorageApplyResp).
//
// An entry carrying our header completes its proposal. Once the applied index
// reaches a pending proposal's index and the entry there was not ours, another
// leader's entry took the slot: the proposal was not written and never will
// be (an entry is proposed once, and raft never moves an entry to another
// index), so it fails with ErrNotWritten, never with a success.
func (g *group) resolveApplied(ents []*raftpb.Entry, incarnation uint64) {
	for _, ent := range ents {
		idx := ent.GetIndex()
		if h, ok := entryHeader(ent); ok && h.Proposer == g.replica && h.Incarnation == incarnation {
			if p := g.pending[h.Seq]; p != nil {
				g.dropPending(h.Seq, p)
				p.finish(Result{Index: idx, Term: ent.GetTerm()}, nil)
			}
		}
		if idx > g.applied { // a snapshot may have covered it already
			g.applied, g.appliedTerm = idx, ent.GetTerm()
		}
	}
	g.stApplied.Store(g.applied)
	for seq, p := range g.pending {
		if p.index != 0 && p.index <= g.applied {
			g.dropPending(seq, p)
			p.finish(Result{}, fmt.Errorf("%w: group %d: index %d holds another leader's entry", ErrNotWritten, g.id, p.index))
		}
	}
}

// addPending and dropPending put a proposal handed to raft into pending and
// take it out (worker only), keeping applyWaiters.
func (g *group) addPending(p *proposal) {
	g.pending[p.seq] = p
	if p.waitsApply() {
		g.applyWaiters++
	}
}

func (g *group) dropPending(seq uint64, p *proposal) {
	delete(g.pending, seq)
	if p.waitsApply() {
		g.applyWaiters--
	}
}

// noteCommitted tells the ProposeCommitted proposals among ents, entries
// raft just handed to the apply thread (so committed: durable on a majority,
// and final at their index), that they are committed (worker only). An
// entry at a pending proposal's index that is not ours tells nothing here:
// resolveApplied fails the proposal once it is applied.
func (g *group) noteCommitted(ents []*raftpb.Entry, incarnation uint64) {
	if len(g.pending) == g.applyWaiters {
		return // nobody listens for commits
	}
	for _, ent := range ents {
		h, ok := entryHeader(ent)
		if !ok || h.Proposer != g.replica || h.Incarnation != incarnation {
			continue
		}
		if p := g.pending[h.Seq]; p != nil && p.committed != nil && !p.toldCommit {
			p.toldCommit = true
			p.committed(Result{Index: ent.GetIndex(), Term: ent.GetTerm()})
		}
	}
}

// noteAppended records the index of our pending proposals' entries as raft
// hands them to the append thread (worker only).
func (g *group) noteAppended(ents []*raftpb.Entry, incarnation uint64) {
	if len(g.pending) == 0 {
		return
	}
	for _, ent := range ents {
		h, ok := entryHeader(ent)
		if !ok || h.Proposer != g.replica || h.Incarnation != incarnation {
			continue
		}
		if p := g.pending[h.Seq]; p != nil {
			p.index = ent.GetIndex()
		}
	}
}

// failPending settles every proposal handed to raft with err (worker only).
func (g *group) failPending(err error) {
	for seq, p := range g.pending {
		g.dropPending(seq, p)
		p.finish(Result{}, err)
	}
}

// failAll settles every pending and buffered proposal with err (worker, or
// Close once no worker runs).
func (g *group) failAll(proposed, buffered error) {
	for seq, p := range g.pending {
		g.dropPending(seq, p)
		p.finish(Result{}, proposed)
	}
	_, props := g.take()
	for _, p := range props {
		if p.state.CompareAndSwap(propQueued, propProposed) {
			p.finish(Result{}, buffered)
		}
	}
}

// newRawNode is raft.NewRawNode with raft's panic (a storage that does not
// hold what its state says: an applied index outside its log, a log that
// was ended) returned as ErrGroupFailed: the replica does not start, and the
// node goes on (a cluster node restarted with a removed replica still in
// its table would otherwise stop at the first start of it).
func newRawNode(cfg GroupConfig, rc *raft.Config) (rn *raft.RawNode, err error) {
	defer func() {
		if r := recover(); r != nil {
			rn, err = nil, fmt.Errorf("%w: replica %d cannot start: %v", ErrGroupFailed, cfg.Replica, r)
		}
	}()
	return raft.NewRawNode(rc)
}
