package replication

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/internal/owner"
)

// Engine hosts the local replicas of many raft groups for one node.
//
// Methods are safe for concurrent use. New starts nothing; Start starts the
// workers and the ticker; Close stops them and waits.
type Engine struct {
	cfg         Config
	transport   Transport
	pipeline    Pipeline
	log         *slog.Logger
	incarnation uint64 // random per engine: tells this run's proposals from an earlier one's
	seq         atomic.Uint64

	sched *scheduler

	mu     sync.RWMutex
	groups map[GroupID]*group
	list   atomic.Pointer[[]*group] // copy on write, for the ticker

	started atomic.Bool
	closed  atomic.Bool
	owner   *owner.Group // workers and ticker; created by Start

	failMu   sync.Mutex
	failures []error

	// staleReads is the planted stale-read bug (testknobs.StaleReads).
	staleReads atomic.Bool

	// The lease's clock (lease.go): clock is time.Now unless a test set
	// another before Start (testknobs.LeaseClock); times are ns since epoch.
	clock func() time.Time
	epoch time.Time
	// leaseIgnoresTransfer is the planted bug testknobs.LeaseIgnoresTransfer.
	leaseIgnoresTransfer atomic.Bool

	stats engineStats
}

// engineStats are the engine's counters (Stats).
type engineStats struct {
	proposed, committed, applied, elected, steppedDown atomic.Uint64
	coalesced                                          atomic.Uint64
}

// Stats is a snapshot of an engine's counters, over all its groups since it
// started: entries proposed by this node's leaders (handed to raft),
// entries committed and applied by its replicas, leaderships won,
// leaderships lost, and commit-only appends not sent because a later append
// of the same Ready carried them (coalesce.go).
type Stats struct {
	Proposed, Committed, Applied, Elected, SteppedDown uint64
	Coalesced                                          uint64
}

// Stats returns the engine's counters. Safe from any goroutine.
func (e *Engine) Stats() Stats {
	s := &e.stats
	return Stats{Proposed: s.proposed.Load(), Committed: s.committed.Load(), Applied: s.applied.Load(),
		Elected: s.elected.Load(), SteppedDown: s.steppedDown.Load(), Coalesced: s.coalesced.Load()}
}

// New returns an engine for cfg.Node that sends through transport and stores
// through pipeline. It starts no goroutine.
func New(cfg Config, transport Transport, pipeline Pipeline) (*Engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if transport == nil || pipeline == nil {
		return nil, errors.New("replication: New: transport and pipeline are required")
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	e := &Engine{
		cfg:         cfg,
		transport:   transport,
		pipeline:    pipeline,
		log:         cfg.Logger.With("node", uint64(cfg.Node)),
		incarnation: binary.LittleEndian.Uint64(b[:]) | 1,
		sched:       newScheduler(cfg.MaxQueuedTicks),
		groups:      make(map[GroupID]*group),
		clock:       time.Now,
		epoch:       time.Now(),
	}
	e.list.Store(new([]*group))
	return e, nil
}

// Node returns the engine's node id.
func (e *Engine) Node() NodeID { return e.cfg.Node }

// AddGroup creates the local replica of a group (before or after Start).
func (e *Engine) AddGroup(cfg GroupConfig) error {
	if e.closed.Load() {
		return ErrClosed
	}
	g, err := newGroup(cfg, e)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.groups[cfg.ID]; ok {
		return fmt.Errorf("%w: %d", ErrGroupExists, cfg.ID)
	}
	e.groups[cfg.ID] = g
	list := append(append([]*group(nil), *e.list.Load()...), g)
	e.list.Store(&list)
	return nil
}

func (e *Engine) group(id GroupID) *group {
	e.mu.RLock()
	g := e.groups[id]
	e.mu.RUnlock()
	return g
}

// Start starts the scheduler's workers and the ticker, owned by the engine
// until Close.
func (e *Engine) Start() error {
	if e.closed.Load() {
		return ErrClosed
	}
	if !e.started.CompareAndSwap(false, true) {
		return errors.New("replication: engine already started")
	}
	e.owner = owner.New(nil)
	for range e.cfg.Workers {
		e.owner.Go(func(context.Context) { e.work() })
	}
	e.owner.Go(e.tick)
	return nil
}

// Close stops the ticker and the workers and waits for them. Proposals still
// buffered fail with ErrClosed (not written); proposals handed to raft fail
// with ErrOutcomeUnknown; reads not finished fail with ErrReadNotConfirmed.
// Responses the pipeline delivers afterwards are
// dropped. Close does not close the pipeline or the transport.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	e.sched.close()
	if e.owner != nil {
		if err := e.owner.Close(context.Background()); err != nil {
			return fmt.Errorf("replication: close: %w", err)
		}
	}
	for _, g := range *e.list.Load() {
		g.failAll(fmt.Errorf("%w: %w", ErrOutcomeUnknown, ErrClosed), fmt.Errorf("%w: %w", ErrClosed, ErrNotWritten))
		g.failReads(fmt.Errorf("%w: %w", ErrReadNotConfirmed, ErrClosed))
		g.failTransfers(ErrClosed)
	}
	return nil
}

// Err returns the first group failure (a raft panic, recovered), or nil.
func (e *Engine) Err() error {
	e.failMu.Lock()
	defer e.failMu.Unlock()
	return errors.Join(e.failures...)
}

// tick is the ticker goroutine: every TickInterval it marks every group for a
// tick. It never ticks a RawNode itself. time.Ticker drops ticks the goroutine
// was too slow to take, so ticks are never early.
func (e *Engine) tick(ctx context.Context) {
	t := time.NewTicker(e.cfg.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.sched.tickAll(*e.list.Load())
		}
	}
}

// worker holds the per-worker batch of outgoing messages of one pass.
type worker struct {
	out map[NodeID][]Envelope
	// skip is scratch space for redundantAppends.
	skip []bool
}

func (e *Engine) work() {
	w := &worker{out: make(map[NodeID][]Envelope)}
	for {
		g, _, ticks := e.sched.next()
		if g == nil {
			return
		}
		e.process(w, g, ticks)
		e.flush(w)
		e.sched.done(g)
	}
}

// flush sends the pass's messages, one batch per destination node.
func (e *Engine) flush(w *worker) {
	for node, batch := range w.out {
		if len(batch) > 0 {
			e.transport.Send(node, batch)
		}
		delete(w.out, node)
	}
}

// process runs one pass over g: ticks, received messages, proposals, then one
// Ready whose messages go to the pipeline's append and apply FIFOs and to the
// transport. Advance is never called (AsyncStorageWrites). A raft panic fails
// the group, not the node.
func (e *Engine) process(w *worker, g *group, ticks int) {
	if g.member.retired.Load() {
		return // removed from the group: late storage responses land here
	}
	if g.failed != nil {
		g.failAll(g.failed, g.failed)
		g.failReads(g.failed)
		g.failTransfers(g.failed)
		if g.member.removeAsked.Load() {
			e.retire(g) // its raft state is not touched again
		}
		return
	}
	defer func() {
		if r := recover(); r != nil {
			e.failGroup(w, g, r)
		}
	}()
	for range ticks {
		g.rn.Tick()
	}
	g.startTicks += ticks
	if ticks > 0 {
		g.sayGoodbyes(w)
	}
	for _, r := range g.takeUnreachable() {
		g.rn.ReportUnreachable(uint64(r))
	}
	g.reportSnapshots()
	g.runCalls()
	msgs, props := g.take()
	for _, m := range msgs {
		switch m.GetType() {
		case raftpb.MsgStorageApplyResp:
			e.stats.applied.Add(uint64(len(m.GetEntries())))
			g.applyConfChanges(m.GetEntries())
			g.resolveApplied(m.GetEntries(), e.incarnation)
			g.releaseReads()
			g.noteConfApplied(m.GetEntries()) // lease.go: after applyConfChanges
		case raftpb.MsgStorageAppendResp:
			if snap := m.GetSnapshot(); snap != nil {
				g.installedSnapshot(snap)
				g.releaseReads()
			}
			if PlantedRaftBug { // plantedraftbug_on.go; compiled out otherwise
				g.plantedAckAppended(m)
			}
		}
		if len(g.member.gone) > 0 && g.tellGone(w, m) {
			continue // from a replica the group removed: told so, not stepped
		}
		if g.holdVote(m, e.cfg.ElectionTick) {
			continue // lease.go: a replica that just started grants no vote yet
		}
		if err := g.rn.Step(m); err != nil {
			e.log.Debug("replication: step", "group", uint64(g.id), "type", m.GetType().String(), "from", m.GetFrom(), "err", err)
		}
	}
	g.recycle(msgs)
	if len(props) > 0 {
		e.propose(g, props)
	}
	if reads := g.takeReads(); len(reads) > 0 {
		e.issueReads(g, reads)
	}
	if ts := g.takeTransfers(); len(ts) > 0 {
		e.startTransfers(g, ts)
	}
	if g.member.removed {
		defer e.retire(g) // after this pass's Ready: its messages still leave
	}
	if !g.rn.HasReady() {
		e.leaseStep(g)
		return
	}
	rd := g.rn.Ready()
	wasLeader, prevTerm := g.role == raft.StateLeader, g.term
	if rd.SoftState != nil {
		g.lead, g.role = ReplicaID(rd.SoftState.Lead), rd.SoftState.RaftState
	}
	if rd.HardState != nil {
		g.term = rd.HardState.GetTerm()
	}
	if isLeader := g.role == raft.StateLeader; isLeader != wasLeader {
		if isLeader {
			e.stats.elected.Add(1)
		} else {
			e.stats.steppedDown.Add(1)
		}
	}
	e.stats.committed.Add(uint64(len(rd.CommittedEntries)))
	if wasLeader && g.role != raft.StateLeader && g.term == prevTerm {
		// A leader that steps down in its own term (CheckQuorum: cut off
		// from the majority) may not hear what became of its entries while
		// the cut lasts: answer now rather than then. (One that saw a later
		// term hears from its new leader: its entries are applied, or
		// found overwritten, soon.)
		g.failPending(fmt.Errorf("%w: group %d: this replica stopped leading (cut off from the majority) before its entry was applied", ErrOutcomeUnknown, g.id))
	}
	g.publish()
	e.leaseStep(g) // before any message of this Ready leaves
	if len(rd.ReadStates) > 0 || len(g.readPending) > 0 {
		g.readStates(rd.ReadStates)
	}
	skip := redundantAppends(rd.Messages, w.skip)
	if skip != nil {
		w.skip = skip
	}
	for i, m := range rd.Messages {
		if skip != nil && skip[i] {
			e.stats.coalesced.Add(1)
			continue
		}
		switch to := m.GetTo(); to {
		case raft.LocalAppendThread:
			g.noteAppended(m.GetEntries(), e.incarnation)
			e.pipeline.Append(Job{Group: g.id, Msg: m, Done: e.doneFunc(g, m)})
		case raft.LocalApplyThread:
			g.noteCommitted(m.GetEntries(), e.incarnation)
			// Who waits for this apply: Propose's callers, reads, and a
			// leader's first entry of its term (its lease, and so its
			// serving, starts once applied). ProposeCommitted's callers
			// heard at commit: their applies may wait to be batched.
			waited := g.applyWaiters > 0 || len(g.readPending) > 0 || len(g.readWaiting) > 0 ||
				(g.role == raft.StateLeader && g.appliedTerm != g.term)
			e.pipeline.Apply(Job{Group: g.id, Msg: m, Done: e.doneFunc(g, m), Waited: waited})
		case uint64(g.replica):
			g.push(m)
			e.sched.enqueue(g, flagMessage)
		default:
			// MsgHeartbeat and MsgHeartbeatResp go with the rest: the network
			// transport coalesces them per node pair (heartbeat.go).
			node, ok := g.peer(ReplicaID(to))
			if !ok {
				e.log.Warn("replication: message to an unknown replica dropped", "group", uint64(g.id), "to", to)
				continue
			}
			w.out[node] = append(w.out[node], Envelope{Group: g.id, Msg: m})
		}
	}
}

// propose hands the buffered proposals to raft as one MsgProp (one entry
// each), on the leader only.
func (e *Engine) propose(g *group, props []*proposal) {
	if g.role != raft.StateLeader {
		err := g.notLeader()
		for _, p := range props {
			if p.state.CompareAndSwap(propQueued, propProposed) {
				p.finish(Result{}, err)
			}
		}
		return
	}
	ents := make([]*raftpb.Entry, 0, len(props))
	taken := props[:0]
	for _, p := range props {
		if !p.state.CompareAndSwap(propQueued, propProposed) {
			continue // abandoned by its caller
		}
		if p.term != 0 && p.term != g.term {
			p.finish(Result{}, fmt.Errorf("%w: group %d: the proposal is for term %d, this replica leads term %d", ErrNotWritten, g.id, p.term, g.term))
			continue
		}
		if p.guard != nil {
			if err := p.guard(); err != nil {
				p.finish(Result{}, fmt.Errorf("%w: group %d: %w", ErrNotWritten, g.id, err))
				continue
			}
		}
		p.seq = e.seq.Add(1)
		h := Header{Proposer: g.replica, Incarnation: e.incarnation, Seq: p.seq}
		if p.cc != nil {
			ent, err := g.confEntry(h, p.cc)
			if err != nil {
				p.finish(Result{}, err)
				continue
			}
			ents = append(ents, ent)
			taken = append(taken, p)
			continue
		}
		data := appendEntry(make([]byte, 0, maxHeaderLen+len(p.payload)), h, p.payload)
		ents = append(ents, &raftpb.Entry{Data: data})
		taken = append(taken, p)
	}
	if len(ents) == 0 {
		return
	}
	err := g.rn.Step(&raftpb.Message{Type: raftpb.MsgProp.Enum(), From: new(uint64(g.replica)), Entries: ents})
	if err != nil {
		err = fmt.Errorf("%w: group %d: %w", ErrNotWritten, g.id, err)
		for _, p := range taken {
			p.finish(Result{}, err)
		}
		return
	}
	e.stats.proposed.Add(uint64(len(taken)))
	for i, p := range taken {
		if p.cc != nil && ents[i].GetType() == raftpb.EntryNormal {
			// raft replaced a conf change it refuses by an empty entry
			// (m.Entries[i], our slice): it will never be applied.
			p.finish(Result{}, fmt.Errorf("%w: group %d: %w", ErrNotWritten, g.id, errConfRefused))
			continue
		}
		g.addPending(p)
	}
}

// doneFunc returns the Done of a storage job: deliver m's responses.
func (e *Engine) doneFunc(g *group, m *raftpb.Message) func() {
	return func() { e.deliver(g, m.GetResponses()) }
}

// deliver routes a storage job's responses once the job is durable (or
// applied): to the group's own inbox (its MsgStorage*Resp, a leader's own
// MsgAppResp) or to the transport (a follower's MsgAppResp, votes). Runs on
// the pipeline's goroutines; after Close it drops them.
func (e *Engine) deliver(g *group, resps []*raftpb.Message) {
	if e.closed.Load() || len(resps) == 0 {
		return
	}
	self := false
	type nodeBatch struct {
		node  NodeID
		batch []Envelope
	}
	var out []nodeBatch // this job's responses per destination node (usually one MsgAppResp)
	for _, m := range resps {
		to := m.GetTo()
		if to == uint64(g.replica) {
			g.push(m)
			self = true
			continue
		}
		node, ok := g.peer(ReplicaID(to))
		if !ok {
			continue
		}
		env := Envelope{Group: g.id, Msg: m}
		i := 0
		for i < len(out) && out[i].node != node {
			i++
		}
		if i == len(out) {
			out = append(out, nodeBatch{node: node})
		}
		out[i].batch = append(out[i].batch, env)
	}
	for _, b := range out {
		e.transport.Send(b.node, b.batch)
	}
	if self {
		e.sched.enqueue(g, flagMessage)
	}
}

// Receive steps messages that arrived from other nodes into their groups
// (asynchronously: it only queues). Messages for unknown groups or for
// another replica id are dropped. Safe from any goroutine; never blocks on
// raft.
func (e *Engine) Receive(batch []Envelope) {
	if e.closed.Load() {
		return
	}
	for _, env := range batch {
		g := e.group(env.Group)
		if g == nil || env.Msg.GetTo() != uint64(g.replica) {
			continue
		}
		if env.Removed {
			if !g.member.removeAsked.Swap(true) {
				e.log.Info("replication: told by the group that it removed this replica", "group", uint64(g.id), "replica", uint64(g.replica), "by", env.Msg.GetFrom())
			}
			e.askRemove(g)
			continue
		}
		if raft.IsLocalMsg(env.Msg.GetType()) {
			continue // only our own pipeline may send storage messages
		}
		g.push(env.Msg)
		e.sched.enqueue(g, flagMessage)
	}
}

// failGroup records a raft panic: the group stops (its proposals fail with
// ErrGroupFailed) and Err reports it. Raft panics on a broken invariant
// (typically a log that lost what it acknowledged); going on would be unsafe.
func (e *Engine) failGroup(w *worker, g *group, r any) {
	err := fmt.Errorf("%w: node %d group %d: %v", ErrGroupFailed, e.cfg.Node, g.id, r)
	e.log.Error("replication: group failed", "group", uint64(g.id), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	g.failed = err
	g.stFailed.Store(&err)
	clear(w.out) // nothing of a broken pass leaves
	g.failAll(err, err)
	g.failReads(err)
	g.failTransfers(err)
	g.endLease()
	e.failMu.Lock()
	e.failures = append(e.failures, err)
	e.failMu.Unlock()
}

// Propose replicates payload through group id, on its leader only, and waits
// until its entry is committed (durable on a majority) AND applied by this
// replica: the output gate. On a replica that does not lead it returns a
// *NotLeaderError at once.
//
// Errors: errors.Is(err, ErrNotWritten) means the payload is not and will
// never be in the log (safe to retry); ErrOutcomeUnknown means it may still
// commit (ctx ended, or Close). ErrUnknownGroup, ErrClosed, ErrGroupFailed as
// named.
func (e *Engine) Propose(ctx context.Context, id GroupID, payload []byte) (Result, error) {
	return e.propose1(ctx, id, payload, nil)
}

// propose1 is Propose for a payload or (cc set) a conf change.
func (e *Engine) propose1(ctx context.Context, id GroupID, payload []byte, cc *raftpb.ConfChangeV2) (Result, error) {
	if e.closed.Load() {
		return Result{}, ErrClosed
	}
	g := e.group(id)
	if g == nil {
		return Result{}, fmt.Errorf("%w: %d", ErrUnknownGroup, id)
	}
	if f := g.stFailed.Load(); f != nil {
		return Result{}, *f
	}
	if raft.StateType(g.stRole.Load()) != raft.StateLeader {
		return Result{}, g.notLeader()
	}
	p := &proposal{payload: payload, cc: cc, done: make(chan outcome, 1)}
	g.mu.Lock()
	g.props = append(g.props, p)
	g.mu.Unlock()
	e.sched.enqueue(g, flagPropose)
	if e.closed.Load() && p.state.CompareAndSwap(propQueued, propAbandoned) {
		return Result{}, fmt.Errorf("%w: %w", ErrClosed, ErrNotWritten) // Close may have drained the buffer before we queued
	}
	select {
	case o := <-p.done:
		return o.res, o.err
	case <-ctx.Done():
		if p.state.CompareAndSwap(propQueued, propAbandoned) {
			return Result{}, fmt.Errorf("%w: %w", ErrNotWritten, ctx.Err())
		}
		return Result{}, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
	}
}

// ProposeAsync is Propose without waiting: cb gets its outcome, once, on
// an engine goroutine (it must not block). term, if not zero, is the term the
// proposal belongs to: when the group is handed it in another term (or this
// replica does not lead), it fails with ErrNotWritten and is never in the
// log. guard, if set, runs on the group's worker as the proposal is handed
// to raft, after every earlier proposal of the group was handed over or
// failed; an error refuses it (ErrNotWritten). A proposal cannot be
// abandoned: at Close it fails like Propose's.
func (e *Engine) ProposeAsync(id GroupID, term uint64, payload []byte, guard func() error, cb func(Result, error)) {
	e.proposeAsync(id, term, payload, guard, nil, cb)
}

func (e *Engine) proposeAsync(id GroupID, term uint64, payload []byte, guard func() error, committed func(Result), cb func(Result, error)) {
	if e.closed.Load() {
		cb(Result{}, fmt.Errorf("%w: %w", ErrClosed, ErrNotWritten))
		return
	}
	g := e.group(id)
	if g == nil {
		cb(Result{}, fmt.Errorf("%w: %w: %d", ErrNotWritten, ErrUnknownGroup, id))
		return
	}
	if f := g.stFailed.Load(); f != nil {
		cb(Result{}, *f)
		return
	}
	if raft.StateType(g.stRole.Load()) != raft.StateLeader {
		cb(Result{}, g.notLeader())
		return
	}
	p := &proposal{payload: payload, cb: cb, term: term, guard: guard, committed: committed}
	g.mu.Lock()
	g.props = append(g.props, p)
	g.mu.Unlock()
	e.sched.enqueue(g, flagPropose)
	if e.closed.Load() && p.state.CompareAndSwap(propQueued, propAbandoned) {
		cb(Result{}, fmt.Errorf("%w: %w", ErrClosed, ErrNotWritten)) // Close may have drained the buffer before we queued
	}
}

// ProposeCommitted is ProposeAsync with one more callback: committed hears,
// once, on an engine goroutine, that the entry is committed (durable on a
// majority of the group, and final at its index) before this replica
// applied it; cb still tells the outcome of the apply, or a failure. A
// proposal is committed at most once, and cb with a nil error always comes
// after committed. After committed, cb's error says only that this replica
// will not report the apply (it stopped leading, closed, or a snapshot
// covered the entry): the entry stays committed, and the group applies it
// (this replica too, once it catches up).
//
// A caller that answers its client at committed (the actors' output gate,
// through Proposer) must serve its reads of that write from its own memory
// until cb: the replica's state machine may not hold it yet.
func (e *Engine) ProposeCommitted(id GroupID, term uint64, payload []byte, guard func() error, committed func(Result), cb func(Result, error)) {
	e.proposeAsync(id, term, payload, guard, committed, cb) // committed nil: ProposeAsync
}

// Groups returns the groups this engine hosts a replica of.
func (e *Engine) Groups() []GroupID {
	list := *e.list.Load()
	out := make([]GroupID, len(list))
	for i, g := range list {
		out[i] = g.id
	}
	return out
}

// Status is a snapshot of the local replica of a group.
type Status struct {
	Group   GroupID
	Replica ReplicaID
	// Leader is the node this replica believes leads (0: unknown).
	Leader   NodeID
	IsLeader bool
	Term     uint64
	// Applied is the last index this replica applied.
	Applied uint64
	// Err is non-nil once the group failed (ErrGroupFailed).
	Err error
}

// Status returns the local replica's view of group id.
func (e *Engine) Status(id GroupID) (Status, error) {
	g := e.group(id)
	if g == nil {
		return Status{}, fmt.Errorf("%w: %d", ErrUnknownGroup, id)
	}
	leaderNode, _ := g.peer(ReplicaID(g.stLead.Load()))
	st := Status{
		Group:    id,
		Replica:  g.replica,
		Leader:   leaderNode,
		IsLeader: raft.StateType(g.stRole.Load()) == raft.StateLeader,
		Term:     g.stTerm.Load(),
		Applied:  g.stApplied.Load(),
	}
	if f := g.stFailed.Load(); f != nil {
		st.Err = *f
	}
	return st, nil
}

// Lag returns, on group id's leader, how many entries each other replica's
// log is behind the leader's last index (raft's Progress.Match), waiting for
// the group's worker (bounded by ctx). On a replica that does not lead it
// returns a *NotLeaderError.
func (e *Engine) Lag(ctx context.Context, id GroupID) (map[ReplicaID]uint64, error) {
	var out map[ReplicaID]uint64
	var leader bool
	err := e.onWorker(ctx, id, func(rn *raft.RawNode) {
		st := rn.Status()
		if leader = st.RaftState == raft.StateLeader; !leader {
			return
		}
		last := st.Progress[st.ID].Match
		out = make(map[ReplicaID]uint64, len(st.Progress))
		for r, pr := range st.Progress {
			if r != st.ID {
				out[ReplicaID(r)] = last - min(last, pr.Match)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	if !leader {
		if g := e.group(id); g != nil {
			return nil, g.notLeader()
		}
	}
	return out, nil
}
