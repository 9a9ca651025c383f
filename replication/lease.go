package replication

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/replication/internal/testknobs"
)

// The leader lease (design section 3).
//
// Why it is safe. With CheckQuorum, a follower that heard from its leader
// (a MsgHeartbeat or MsgApp reset its election timer) less than ElectionTick
// ticks ago ignores every vote and pre-vote of a higher term (raft.go Step,
// inLease). Ticks are never early (the ticker drops late ticks, the scheduler
// caps queued ones), but a follower's first tick after the reset may come at
// once: so a follower that received a heartbeat at r grants no vote before
// r + (ElectionTick-1) x TickInterval. A heartbeat sent at s is received at
// r >= s. If a quorum acknowledged heartbeats sent at s or later, every
// quorum a new leader needs holds one of them, and no new leader of a higher
// term can exist before s + (ElectionTick-1) x TickInterval. The lease ends a
// margin earlier: one tick, plus 10% for the clock-rate error between this
// node and the followers.
//
// So the lease runs until the quorum-th newest acknowledged heartbeat SEND
// time + (ElectionTick-1) x TickInterval - margin, where this replica (if it
// is a voter) counts as acknowledged "now"; with a joint configuration, the
// earlier of the two majorities' answers. The send time is the leader's: the
// transport stamps it when the heartbeat leaves and the follower echoes it
// (heartbeat.go; replicationtest's Network does the same), and reports it
// through Engine.OnBeatAck. A receive time would overstate the lease by the
// round trip.
//
// What never counts, and what ends the lease at once:
//   - acks of heartbeats sent before this replica became leader of its
//     current term (the lease restarts at every term, from nothing), or
//     before a leadership transfer ended: OnBeatAck carries no term, so the
//     worker stamps "since" when it sees leadership (or the transfer's end)
//     and older send times are dropped;
//   - a transfer in progress (raft's LeadTransferee != 0): the transferee
//     campaigns with MsgTimeoutNow, which bypasses the followers' lease
//     (etcd-io/raft#99), so the lease ends when the worker steps the
//     transfer, before the MsgTimeoutNow can leave;
//   - a step-down or a term change, seen by the worker in the pass that
//     takes it, before any message of that pass leaves (a vote this replica
//     grants leaves after it).
//
// And one more condition, for what a lease is used for: the replica must
// have applied an entry of its own term. Then every entry committed in an
// earlier term lies below it and is applied, and every write acknowledged in
// this term was proposed here (only the leader proposes): through Propose,
// it is applied here too, so the replica's applied state holds every such
// write acknowledged before LeaseValid returned, which is what a lease read
// needs (ReadIndex has the same rule: raft confirms no read before the
// leader committed an entry of its term). A ProposeCommitted write is
// acknowledged at commit, maybe before it is applied here: its proposer
// (the actors' activation, whose overlay holds it) serves its reads, and
// any other reader first waits for the applies (Proposer.WaitPartition).
//
// A replica that starts (a restart, a new replica) remembers no leader, so
// raft would grant votes at once and break a lease that counted its
// pre-crash ack. Until it has ticked ElectionTick times it grants no vote or
// pre-vote of a higher term, exactly as if it had just heard from a leader
// (holdVote; a transfer's forced campaign passes, as in raft).
//
// After an abandoned transfer, the transferee may still hold the
// MsgTimeoutNow (in flight, or in its inbox behind a slow worker) and
// campaign later, bypassing the followers' lease. So the lease stays off
// until every replica a transfer of this term was aimed at (the fence) has
// acknowledged a heartbeat sent after the transfer ended: the transport
// delivers a node pair's messages in order (TCP, frames in order, a frame's
// messages before its beats; replicationtest's delays are far shorter than
// an election timeout), so that ack means the MsgTimeoutNow was already
// stepped (had it started a campaign, the answer would be of a higher term,
// and this replica would step down). A transferee that stays unreachable
// keeps the lease off for the rest of the term: reads then take ReadIndex.

// ErrTransferAbandoned: raft gave up a leadership transfer (the transferee
// did not take over within an election timeout, a later transfer replaced
// it, or this replica was re-elected). This replica may still lead.
var ErrTransferAbandoned = errors.New("replication: leadership transfer abandoned")

func init() {
	testknobs.LeaseClock = func(e any, now func() time.Time) { e.(*Engine).clock = now }
	testknobs.LeaseIgnoresTransfer = func(e any) { e.(*Engine).leaseIgnoresTransfer.Store(true) }
}

// leaseState is a group's lease. The worker holding the group starts, blocks
// and ends it; OnBeatAck (transport goroutines) adds acks; LeaseValid (any
// goroutine) reads it. All under mu, held for a few comparisons.
type leaseState struct {
	mu sync.Mutex
	// term is the term this replica leads, 0 when it does not (no lease).
	term uint64
	// since: acks of heartbeats sent before it (ns on the engine's clock)
	// never count.
	since int64
	// transferring: a transfer is in progress (no lease); appliedTerm: an
	// entry of term is applied (no lease before).
	transferring bool
	appliedTerm  bool
	self         ReplicaID
	fence        []ReplicaID         // transferees of this term (see above)
	voters       [][]ReplicaID       // each majority configuration (two when joint)
	acks         map[ReplicaID]int64 // newest acknowledged send time per peer
	expiry       int64               // ns on the engine's clock; valid while now < expiry
}

// Sentinels for acknowledged times and expiries.
const (
	never  = math.MinInt64 // no ack; a lease that does not hold
	always = math.MaxInt64 // this replica itself; a lease no election can break
)

// now returns the engine's clock as ns since its epoch (monotonic).
func (e *Engine) now() int64 { return int64(e.clock().Sub(e.epoch)) }

// leaseLength is how long after a quorum-acknowledged send time the lease
// holds: (ElectionTick-1) ticks minus the margin (one tick plus 10%). Not
// positive (ElectionTick < 3) means the lease never holds.
func (e *Engine) leaseLength() int64 {
	d := int64(e.cfg.ElectionTick-1) * int64(e.cfg.TickInterval)
	return d - d/10 - int64(e.cfg.TickInterval)
}

// recomputeLocked sets expiry from the acks (l.mu held).
func (l *leaseState) recomputeLocked(length int64) {
	l.expiry = never
	if l.term == 0 || l.transferring || !l.appliedTerm || length <= 0 || len(l.voters) == 0 {
		return
	}
	for _, f := range l.fence {
		if _, ok := l.acks[f]; !ok {
			return
		}
	}
	exp := int64(always)
	var times []int64
	for _, c := range l.voters {
		if len(c) == 0 {
			continue
		}
		times = times[:0]
		for _, v := range c {
			switch t, ok := l.acks[v]; {
			case v == l.self:
				times = append(times, always)
			case ok:
				times = append(times, t)
			default:
				times = append(times, never)
			}
		}
		slices.Sort(times)
		q := times[len(times)-(len(c)/2+1)] // the quorum-th newest
		switch q {
		case never:
			return
		case always:
			continue
		}
		exp = min(exp, q+length)
	}
	l.expiry = exp
}

// LeaseValid reports whether this replica holds the leader lease of group g
// now, and for which term: while it holds, no other replica can lead g in a
// later term, and this replica's applied state holds every proposal
// acknowledged before the call. Cheap, safe from any goroutine (a locked
// snapshot; it does not wait for the worker). False on a replica that does
// not lead, during a leadership transfer, before the first heartbeat round
// of a term is acknowledged by a quorum, for an unknown or failed group.
func (e *Engine) LeaseValid(g GroupID) (term uint64, ok bool) {
	grp := e.group(g)
	if grp == nil || grp.stFailed.Load() != nil || e.closed.Load() {
		return 0, false
	}
	l := &grp.lease
	l.mu.Lock()
	defer l.mu.Unlock()
	// The clock is read under the lock: the answer is about one moment.
	if l.term == 0 || e.now() >= l.expiry {
		return 0, false
	}
	return l.term, true
}

// OnBeatAck records that replica from of group g acknowledged a heartbeat
// this node sent at sent (on this node's monotonic clock). It has
// NetConfig.OnBeatAck's signature: cluster wiring passes engine.OnBeatAck.
// Safe from any goroutine; it never blocks on raft.
func (e *Engine) OnBeatAck(g GroupID, from ReplicaID, sent time.Time) {
	grp := e.group(g)
	if grp == nil {
		return
	}
	t := int64(sent.Sub(e.epoch))
	l := &grp.lease
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == 0 || t < l.since || from == l.self {
		return
	}
	if l.transferring && !e.leaseIgnoresTransfer.Load() {
		return
	}
	if old, ok := l.acks[from]; ok && old >= t {
		return
	}
	l.acks[from] = t
	l.recomputeLocked(e.leaseLength())
}

// leaseStep brings the lease in line with what raft says after a pass
// (worker only, after g.role and g.term took the pass's Ready, before any of
// its messages are routed): a new term starts a lease from nothing, a
// step-down ends it, a transfer's start blocks it and its end restarts it.
// It also settles TransferLeader waiters.
func (e *Engine) leaseStep(g *group) {
	var transferee ReplicaID
	if g.transferring || len(g.transferWait) > 0 {
		transferee = ReplicaID(g.rn.BasicStatus().LeadTransferee)
	}
	leader := g.role == raft.StateLeader
	l := &g.lease
	l.mu.Lock()
	switch {
	case !leader:
		if l.term != 0 {
			l.term, l.expiry, l.transferring = 0, never, false
			clear(l.acks)
		}
	case l.term != g.term:
		l.term, l.since, l.transferring, l.fence = g.term, e.now(), false, l.fence[:0]
		l.appliedTerm = g.appliedTerm == g.term
		l.voters = g.voterSets()
		clear(l.acks)
		l.recomputeLocked(e.leaseLength())
	}
	if leader && g.confApplied {
		l.voters = g.voterSets()
		l.recomputeLocked(e.leaseLength())
	}
	if leader && !l.appliedTerm && g.appliedTerm == g.term {
		l.appliedTerm = true
		l.recomputeLocked(e.leaseLength())
	}
	if leader && g.transferring && transferee == 0 {
		// The transfer ended and we still lead: count only heartbeats sent
		// from now on (acks gathered before or during it are dropped).
		if !e.leaseIgnoresTransfer.Load() {
			l.since, l.transferring = e.now(), false
			clear(l.acks)
			l.recomputeLocked(e.leaseLength())
		}
	}
	l.mu.Unlock()
	g.confApplied = false
	g.transferring = leader && transferee != 0
	g.settleTransfers(transferee)
}

// noteConfApplied notes that ents, just applied, hold a configuration change
// (worker only): the next leaseStep takes the voters again. It assumes the
// change was handed to RawNode.ApplyConfChange in the same pass, before
// leaseStep; until then the old voters count, which is safe while the
// configuration is joint (every election needs a majority of both halves).
func (g *group) noteConfApplied(ents []*raftpb.Entry) {
	for _, ent := range ents {
		if ent.GetType() != raftpb.EntryNormal {
			g.confApplied = true
			return
		}
	}
}

// voterSets returns the group's majority configurations (worker only; once
// per term and after each conf change: Status copies the progress map).
func (g *group) voterSets() [][]ReplicaID {
	cfg := g.rn.Status().Config
	var out [][]ReplicaID
	for _, c := range cfg.Voters {
		if len(c) == 0 {
			continue
		}
		ids := make([]ReplicaID, 0, len(c))
		for id := range c {
			ids = append(ids, ReplicaID(id))
		}
		out = append(out, ids)
	}
	return out
}

// blockLease ends the lease because a transfer to replica to starts (worker
// only, right after stepping it, before its MsgTimeoutNow can leave).
func (e *Engine) blockLease(g *group, to ReplicaID) {
	g.transferring = true
	if e.leaseIgnoresTransfer.Load() {
		return // the planted bug: the lease ignores transfers
	}
	l := &g.lease
	l.mu.Lock()
	l.transferring = true
	l.expiry = never
	if !slices.Contains(l.fence, to) {
		l.fence = append(l.fence, to)
	}
	l.mu.Unlock()
}

// holdVote reports whether m is a vote or pre-vote of a higher term that this
// replica must not consider yet because it started less than ElectionTick
// ticks ago (worker only): it may have acknowledged a heartbeat before a
// crash, and a leader's lease may count that ack. Dropping the message is
// what raft itself does with such a vote while it remembers a leader.
func (g *group) holdVote(m *raftpb.Message, electionTick int) bool {
	if g.startTicks >= electionTick {
		return false
	}
	t := m.GetType()
	if t != raftpb.MsgVote && t != raftpb.MsgPreVote {
		return false
	}
	return m.GetTerm() > g.rn.BasicStatus().GetTerm() && string(m.GetContext()) != campaignTransfer
}

// campaignTransfer is the context raft puts in a transfer's MsgVote
// (raft.go, campaignTransfer): such a campaign bypasses the followers' lease.
const campaignTransfer = "CampaignTransfer"

// Transfer states (transferReq.state).
const (
	transferQueued    int32 = iota // in the group's buffer
	transferTaken                  // the worker took it
	transferAbandoned              // the caller gave up before the worker took it
)

// transferReq is one TransferLeader call waiting for its outcome.
type transferReq struct {
	to    ReplicaID
	state atomic.Int32
	done  chan error // buffered 1: finish never blocks

	term uint64 // worker-owned: the term the transfer started in
}

func (r *transferReq) finish(err error) { r.done <- err }

// TransferLeader asks raft to hand the leadership of group g to replica to,
// and waits until this replica sees to lead, ctx ends, or the transfer is
// abandoned (raft gives up after an election timeout: ErrTransferAbandoned;
// this replica may then lead again). The lease ends when the transfer starts
// and counts only heartbeats sent after it ends. On a replica that does not
// lead it returns a *NotLeaderError; to must be a voter of the group. A
// caller that stops waiting (ctx) does not stop the transfer.
func (e *Engine) TransferLeader(ctx context.Context, g GroupID, to ReplicaID) error {
	if e.closed.Load() {
		return ErrClosed
	}
	grp := e.group(g)
	if grp == nil {
		return fmt.Errorf("%w: %d", ErrUnknownGroup, g)
	}
	if f := grp.stFailed.Load(); f != nil {
		return *f
	}
	if raft.StateType(grp.stRole.Load()) != raft.StateLeader {
		return grp.notLeader()
	}
	if _, ok := grp.peer(to); !ok {
		return fmt.Errorf("replication: transfer leadership of group %d: replica %d is not a member", g, to)
	}
	if to == grp.replica {
		return nil
	}
	r := &transferReq{to: to, done: make(chan error, 1)}
	grp.mu.Lock()
	grp.xfers = append(grp.xfers, r)
	grp.mu.Unlock()
	e.sched.enqueue(grp, flagPropose)
	if e.closed.Load() && r.state.CompareAndSwap(transferQueued, transferAbandoned) {
		return ErrClosed // Close may have drained the buffer before we queued
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		// Taken or not, the worker forgets an abandoned waiter (raft's
		// transfer, once started, goes on).
		r.state.Store(transferAbandoned)
		return fmt.Errorf("replication: transfer leadership of group %d to replica %d: %w", g, to, ctx.Err())
	}
}

// takeTransfers empties the transfer buffer (worker only).
func (g *group) takeTransfers() []*transferReq {
	g.mu.Lock()
	ts := g.xfers
	g.xfers = nil
	g.mu.Unlock()
	return ts
}

// startTransfers steps the buffered transfers into raft (worker only, after
// Step, before leaseStep). The lease ends here, before the pass's Ready
// (which may carry the MsgTimeoutNow) is routed.
func (e *Engine) startTransfers(g *group, ts []*transferReq) {
	for _, r := range ts {
		if !r.state.CompareAndSwap(transferQueued, transferTaken) {
			continue
		}
		st := g.rn.BasicStatus()
		if st.RaftState != raft.StateLeader {
			r.finish(g.notLeader())
			continue
		}
		g.rn.TransferLeader(uint64(r.to))
		if ReplicaID(g.rn.BasicStatus().LeadTransferee) != r.to {
			r.finish(fmt.Errorf("replication: transfer leadership of group %d: raft refused replica %d (not a voter)", g.id, r.to))
			continue
		}
		e.blockLease(g, r.to)
		r.term = st.GetTerm()
		g.transferWait = append(g.transferWait, r)
	}
}

// settleTransfers finishes the waiters whose transfer is decided (worker
// only, from leaseStep; transferee is raft's LeadTransferee now).
func (g *group) settleTransfers(transferee ReplicaID) {
	if len(g.transferWait) == 0 {
		return
	}
	kept := g.transferWait[:0]
	for _, r := range g.transferWait {
		switch {
		case r.state.Load() == transferAbandoned:
		case g.role != raft.StateLeader && g.lead == r.to:
			r.finish(nil)
		case g.role == raft.StateLeader && (g.term != r.term || transferee != r.to):
			r.finish(fmt.Errorf("%w: group %d: replica %d did not take over (this replica leads term %d)", ErrTransferAbandoned, g.id, r.to, g.term))
		case g.role != raft.StateLeader && g.lead != 0:
			r.finish(fmt.Errorf("%w: group %d: replica %d leads, not %d", ErrTransferAbandoned, g.id, g.lead, r.to))
		case g.role != raft.StateLeader && g.term == r.term:
			// Stepped down in the transfer's own term, knowing no leader:
			// CheckQuorum (cut off from the majority), not a transferee's
			// election, which comes with a new term. Waiting would last as
			// long as the cut.
			r.finish(fmt.Errorf("%w: group %d: this replica stepped down in term %d (no quorum) before replica %d took over", ErrTransferAbandoned, g.id, g.term, r.to))
		default:
			kept = append(kept, r) // still transferring, or leader unknown yet
			continue
		}
	}
	clear(g.transferWait[len(kept):])
	g.transferWait = kept
}

// failTransfers fails every transfer waiter of the group (worker, or Close
// once no worker runs).
func (g *group) failTransfers(err error) {
	for _, r := range g.transferWait {
		r.finish(err)
	}
	g.transferWait = nil
	for _, r := range g.takeTransfers() {
		if r.state.CompareAndSwap(transferQueued, transferTaken) {
			r.finish(err)
		}
	}
}

// endLease drops the lease (a failed group).
func (g *group) endLease() {
	g.lease.mu.Lock()
	g.lease.term, g.lease.expiry = 0, never
	g.lease.mu.Unlock()
}

// Responsive reports whether replica r of group g, which this replica leads,
// acknowledged a heartbeat sent within the last d: it is reachable and
// stepping messages now. The cluster asks it before handing r the
// leadership, since a transfer to a replica that does not answer leaves the
// group without a lease (see the fence above). Safe from any goroutine.
func (e *Engine) Responsive(g GroupID, r ReplicaID, d time.Duration) bool {
	grp := e.group(g)
	if grp == nil {
		return false
	}
	l := &grp.lease
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.acks[r]
	return l.term != 0 && ok && e.now()-t < int64(d)
}
