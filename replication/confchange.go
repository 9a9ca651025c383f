package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/confchange"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// Membership (design section 5, "Placement and moves"). Raft's ConfState is
// authoritative; the engine keeps, per group, the ConfState at the replica's
// applied index and the address book (replica -> node) it routes by.
//
// A conf change entry's Context is
//
//	version (1) | proposer (uvarint) | incarnation (uvarint) | seq (uvarint) | peers
//
// where the first part is the proposal Header (exactly a normal entry's
// header, proposal.go) and peers is PeersContext's encoding:
// count (uvarint) | count x (replica (uvarint), node (uvarint)). Every replica
// that applies the entry learns where the named replicas live. A conf change
// raft proposes itself (the auto-leave of a joint config) has an empty
// Context.

// memberState is a group's membership, kept in group (group.go) so that the
// shared files change little.
type memberState struct {
	// peers is the address book, copy on write: the worker replaces it, the
	// pipeline's goroutines (deliver) and Status read it.
	peers atomic.Pointer[map[ReplicaID]NodeID]
	// stConf is the ConfState at the applied index, published for Membership
	// and the moves helper; worker-owned conf is the same value.
	conf   *raftpb.ConfState
	stConf atomic.Pointer[raftpb.ConfState]
	// removed: the applied config no longer lists this replica (worker-owned).
	// retired: the group stopped and left the engine after its removal.
	removed bool
	retired atomic.Bool
	// removeAsked: the owner asked to stop the replica (RemoveGroup). A
	// failed group runs no calls, so process reads this one itself: a
	// replica that failed can still be stopped, and its group started here
	// again under a new replica id (a failed group that never left the
	// engine once kept a new replica of its partition from starting, for
	// good: found by TestReplicated_ProcessesDownPastReplaceAfter).
	removeAsked atomic.Bool
	// Under group.mu: snapshot send outcomes and calls into the worker.
	snapReports []snapReport
	calls       []func(*raft.RawNode)
	onRemoved   func(GroupID, ReplicaID)
	// Worker-owned: the log (for goodbyes) and the replicas this leader
	// removed that may not know it yet.
	storage  raft.Storage
	goodbyes []goodbye
	// gone: replicas an applied configuration of this group removed (the
	// newest maxGone, worker-owned). A message from one of them is not
	// stepped: it is answered with a removal notice (tellGone).
	gone []goneReplica
}

// goneReplica is a replica the group removed, and the node it lived on.
type goneReplica struct {
	r    ReplicaID
	node NodeID
}

// maxGone bounds a group's gone list: moves are rare, and a replica removed
// long ago has been told, or stopped by its owner, since.
const maxGone = 16

// goodbye is a replica this leader removed: once its removal is applied the
// leader stops replicating to it, so it might never learn that the entry
// removing it committed. For a few ticks the leader sends it the entries
// from its last known Match up to that entry in a MsgApp carrying their
// commit (a message raft itself could have sent: the replica appends them
// only if its log matches at Match, so it never commits what it lacks); a
// replica that applies them retires. One that is further behind (or whose
// entries were compacted) stays until its owner removes it (design section
// 5, step 4).
type goodbye struct {
	to    ReplicaID
	node  NodeID
	match uint64 // its Match when it was removed (where its log is known to match)
	index uint64 // the entry that removed it
	tries int
}

// goodbyeTries bounds the goodbyes per removed replica (one per ticking
// pass); maxGoodbyeBytes bounds one goodbye's entries.
const (
	goodbyeTries    = 20
	maxGoodbyeBytes = 1 << 20
)

// goodbyeMsg is a MsgApp to b.to of the entries above prev up to b.index,
// committing them; nil if the log no longer has them.
func (g *group) goodbyeMsg(b goodbye, prev uint64) *raftpb.Message {
	prevTerm, err := g.member.storage.Term(prev)
	if err != nil {
		return nil
	}
	var ents []*raftpb.Entry
	if prev < b.index {
		if ents, err = g.member.storage.Entries(prev+1, b.index+1, maxGoodbyeBytes); err != nil || len(ents) == 0 {
			return nil
		}
	}
	commit := prev
	if len(ents) > 0 {
		commit = ents[len(ents)-1].GetIndex()
	}
	return &raftpb.Message{
		Type: raftpb.MsgApp.Enum(), To: new(uint64(b.to)), From: new(uint64(g.replica)), Term: new(g.term),
		Index: new(prev), LogTerm: new(prevTerm), Entries: ents, Commit: new(commit),
	}
}

// sayGoodbyes sends the pending goodbyes (worker only, on a ticking pass).
func (g *group) sayGoodbyes(w *worker) {
	if len(g.member.goodbyes) == 0 {
		return
	}
	if g.role != raft.StateLeader {
		g.member.goodbyes = nil
		return
	}
	keep := g.member.goodbyes[:0]
	for _, b := range g.member.goodbyes {
		// Raft ignores a MsgApp below the receiver's commit index, which
		// the leader does not know (its Match may lag: the ack of an entry
		// the replica committed can be lost), and refuses one above its
		// last index: send from every index between its Match and the
		// entry, the last maxGoodbyePrevs of them when the gap is longer
		// (each refused if it does not fit). With only Match, just below
		// the entry and the entry, a replica whose commit sat between
		// Match and the entry refused all three every time
		// (TestMembership_RemovedLearnsOnLossyNetwork, 3 of 45 runs under
		// -race: Match 2, its commit 3, the removal at 5).
		for _, prev := range goodbyePrevs(b) {
			if m := g.goodbyeMsg(b, prev); m != nil {
				w.out[b.node] = append(w.out[b.node], Envelope{Group: g.id, Msg: m})
			}
		}
		if b.tries--; b.tries > 0 {
			keep = append(keep, b)
		}
	}
	g.member.goodbyes = keep
}

// goodbyePrevs returns the indexes a goodbye to b is sent from: every one
// from its Match (at most b.index) to b.index, or the last maxGoodbyePrevs of
// them and its Match.
func goodbyePrevs(b goodbye) []uint64 {
	from := min(b.match, b.index)
	var out []uint64
	if b.index-from >= maxGoodbyePrevs {
		out = append(out, from)
		from = b.index - maxGoodbyePrevs + 1
	}
	for i := from; i <= b.index; i++ {
		out = append(out, i)
	}
	return out
}

// maxGoodbyePrevs bounds the MsgApps of one goodbye try.
const maxGoodbyePrevs = 16

// peer returns the node replica r lives on (0, false if unknown).
func (g *group) peer(r ReplicaID) (NodeID, bool) {
	n, ok := (*g.member.peers.Load())[r]
	return n, ok
}

// PeersContext encodes an address book for a conf change's Context: every
// replica that applies the change learns that replica r lives on peers[r].
// ProposeConfChange prefixes it with the proposal header.
func PeersContext(peers map[ReplicaID]NodeID) []byte {
	ids := slices.Sorted(maps.Keys(peers))
	b := binary.AppendUvarint(nil, uint64(len(ids)))
	for _, r := range ids {
		b = binary.AppendUvarint(b, uint64(r))
		b = binary.AppendUvarint(b, uint64(peers[r]))
	}
	return b
}

func decodePeers(b []byte) (map[ReplicaID]NodeID, error) {
	if len(b) == 0 {
		return nil, nil
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: conf change peers: bad count", ErrBadEntry)
	}
	b = b[k:]
	peers := make(map[ReplicaID]NodeID, n)
	for range n {
		r, k1 := binary.Uvarint(b)
		if k1 <= 0 {
			return nil, fmt.Errorf("%w: conf change peers: truncated", ErrBadEntry)
		}
		node, k2 := binary.Uvarint(b[k1:])
		if k2 <= 0 {
			return nil, fmt.Errorf("%w: conf change peers: truncated", ErrBadEntry)
		}
		b = b[k1+k2:]
		peers[ReplicaID(r)] = NodeID(node)
	}
	return peers, nil
}

// confChangeOf decodes a conf change entry (nil, nil for a normal entry).
func confChangeOf(ent *raftpb.Entry) (raftpb.ConfChangeI, error) {
	switch ent.GetType() {
	case raftpb.EntryConfChange:
		cc := new(raftpb.ConfChange)
		if err := proto.Unmarshal(ent.GetData(), cc); err != nil {
			return nil, fmt.Errorf("%w: index %d: conf change: %w", ErrBadEntry, ent.GetIndex(), err)
		}
		return cc, nil
	case raftpb.EntryConfChangeV2:
		cc := new(raftpb.ConfChangeV2)
		if err := proto.Unmarshal(ent.GetData(), cc); err != nil {
			return nil, fmt.Errorf("%w: index %d: conf change: %w", ErrBadEntry, ent.GetIndex(), err)
		}
		return cc, nil
	}
	return nil, nil
}

// entryHeader returns the proposal header of a normal entry (its data) or of
// a conf change (its Context); ok is false when there is none (a no-op, an
// auto-leave, someone else's malformed entry).
func entryHeader(ent *raftpb.Entry) (Header, bool) {
	data := ent.GetData()
	if ent.GetType() != raftpb.EntryNormal {
		cc, err := confChangeOf(ent)
		if err != nil || cc == nil {
			return Header{}, false
		}
		data = cc.AsV2().GetContext()
	}
	h, _, ok, err := DecodeEntry(data)
	return h, ok && err == nil
}

// NextConfState returns the ConfState after applying the conf change entry ent
// (EntryConfChange or EntryConfChangeV2) to cs, computed as raft computes it
// (raft.go applyConfChange: confchange.Changer over a tracker restored from
// cs), so it equals what RawNode.ApplyConfChange returns on a replica whose
// config is cs. A normal entry returns cs unchanged. An error is a change raft
// would refuse by panicking at apply (removing every voter, entering a joint
// config twice...): ProposeConfChange checks it before proposing. cs is not
// modified. The persistent applier stores the result with the applied index.
func NextConfState(cs *raftpb.ConfState, ent *raftpb.Entry) (*raftpb.ConfState, error) {
	cci, err := confChangeOf(ent)
	if err != nil || cci == nil {
		return cs, err
	}
	return nextConf(cs, cci.AsV2())
}

func nextConf(cs *raftpb.ConfState, cc *raftpb.ConfChangeV2) (*raftpb.ConfState, error) {
	// MaxInflight only sizes the progress entries; the config does not depend
	// on it, nor on LastIndex (it only seeds new progress entries).
	cfg, prs, err := confchange.Restore(confchange.Changer{Tracker: tracker.MakeProgressTracker(1, 0), LastIndex: 1}, raftpb.EnsureConfState(cs))
	if err != nil {
		return nil, fmt.Errorf("replication: restore conf state %v: %w", cs, err)
	}
	trk := tracker.MakeProgressTracker(1, 0)
	trk.Config, trk.Progress = cfg, prs
	chg := confchange.Changer{Tracker: trk, LastIndex: 1}
	if cc.LeaveJoint() {
		cfg, prs, err = chg.LeaveJoint()
	} else if autoLeave, ok := cc.EnterJoint(); ok {
		cfg, prs, err = chg.EnterJoint(autoLeave, cc.GetChanges()...)
	} else {
		cfg, prs, err = chg.Simple(cc.GetChanges()...)
	}
	if err != nil {
		return nil, fmt.Errorf("replication: conf change %s on %v: %w", raft.DescribeConfChange(cc), cs, err)
	}
	trk.Config, trk.Progress = cfg, prs
	return trk.ConfState(), nil
}

// confMembers lists every replica a ConfState names.
func confMembers(cs *raftpb.ConfState) []uint64 {
	return slices.Concat(cs.GetVoters(), cs.GetVotersOutgoing(), cs.GetLearners(), cs.GetLearnersNext())
}

func confHas(cs *raftpb.ConfState, r ReplicaID) bool {
	return slices.Contains(confMembers(cs), uint64(r))
}

// setConf records the config at the applied index (worker only): prunes the
// address book to the config's members (and this replica), merges learned
// addresses, and notes this replica's removal.
func (g *group) setConf(cs *raftpb.ConfState, learned map[ReplicaID]NodeID) {
	g.noteGone(g.member.conf, cs)
	g.member.conf = cs
	g.member.stConf.Store(cs)
	if len(confMembers(cs)) == 0 {
		return
	}
	old := *g.member.peers.Load()
	peers := make(map[ReplicaID]NodeID, len(old)+len(learned))
	for _, id := range confMembers(cs) {
		if n, ok := old[ReplicaID(id)]; ok {
			peers[ReplicaID(id)] = n
		}
	}
	for r, n := range learned {
		if confHas(cs, r) {
			peers[r] = n
		}
	}
	peers[g.replica] = old[g.replica]
	g.member.peers.Store(&peers)
	// A replica that has never been in a config (a new, empty learner before
	// its snapshot) is not "removed": its empty ConfState is its start, and
	// its address book (its creator's) stays as it is until it has a config.
	if len(confMembers(cs)) > 0 && !confHas(cs, g.replica) {
		g.member.removed = true
	}
}

// noteGone records in the gone list the replicas of old (an applied
// configuration) that cs (a later one) no longer has, with the node the
// address book had for them, and takes off it those cs has (raft allows an
// id to be added again; placement never does it). Both configurations were
// committed, so a replica on the list is out of the group for good.
func (g *group) noteGone(old, cs *raftpb.ConfState) {
	g.member.gone = slices.DeleteFunc(g.member.gone, func(x goneReplica) bool { return confHas(cs, x.r) })
	if old == nil || len(confMembers(cs)) == 0 {
		return
	}
	peers := *g.member.peers.Load()
	for _, id := range confMembers(old) {
		r := ReplicaID(id)
		node, known := peers[r]
		if r == g.replica || confHas(cs, r) || !known {
			continue
		}
		if len(g.member.gone) == maxGone {
			g.member.gone = slices.Delete(g.member.gone, 0, 1)
		}
		g.member.gone = append(g.member.gone, goneReplica{r: r, node: node})
	}
}

// tellGone answers a message from a replica this group removed with a
// removal notice (Envelope.Removed) instead of stepping it, and reports
// whether it did (worker only).
//
// The leader's goodbyes (sayGoodbyes) tell a removed replica only while
// that leader leads, for a few ticks, and only while its log still holds the
// entries the replica lacks. A removed replica that missed them (cut off
// meanwhile, leadership moved, the log compacted under load) hears from no
// one again: its owner had to stop it (CI once waited 60 s for one in
// TestMembership_ReplaceUnderLoad). Such a replica campaigns once its
// election timeout passes, and the voters it asks have applied its removal:
// they tell it, as etcd's members answer a removed member (ErrMemberRemoved).
// The notice is safe from any replica of the group: the configuration that
// removed it was committed, and replica ids are never reused.
func (g *group) tellGone(w *worker, m *raftpb.Message) bool {
	from := ReplicaID(m.GetFrom())
	for _, x := range g.member.gone {
		if x.r == from {
			w.out[x.node] = append(w.out[x.node], Envelope{Group: g.id, Removed: true, Msg: &raftpb.Message{
				From: new(uint64(g.replica)), To: new(uint64(from)), Term: new(g.term),
			}})
			return true
		}
	}
	return false
}

// applyConfChanges hands the conf change entries of an applied job to raft,
// in order (worker only, before stepping the job's MsgStorageApplyResp), and
// keeps the group's config and address book current. Entries at or below
// the applied index were covered by a snapshot meanwhile and are skipped
// (the snapshot's ConfState already holds them).
func (g *group) applyConfChanges(ents []*raftpb.Entry) {
	for _, ent := range ents {
		if ent.GetType() == raftpb.EntryNormal || ent.GetIndex() <= g.applied {
			continue
		}
		cc, err := confChangeOf(ent)
		if err != nil {
			panic(err) // raft itself cannot apply it either: fail the group
		}
		old, oldPeers := g.member.conf, *g.member.peers.Load()
		var prs map[uint64]tracker.Progress
		if g.role == raft.StateLeader {
			prs = g.rn.Status().Progress // conf changes are rare: the copy is cheap enough
		}
		cs := g.rn.ApplyConfChange(cc)
		if g.role == raft.StateLeader {
			for _, id := range confMembers(old) {
				r := ReplicaID(id)
				pr, tracked := prs[id]
				node, known := oldPeers[r]
				if r != g.replica && !confHas(cs, r) && tracked && known {
					// From its Match; if it never acknowledged anything,
					// from where raft was probing it (a mismatch is refused).
					from := pr.Match
					if from == 0 && pr.Next > 0 {
						from = pr.Next - 1
					}
					g.member.goodbyes = append(g.member.goodbyes, goodbye{to: r, node: node, match: from, index: ent.GetIndex(), tries: goodbyeTries})
				}
			}
		}
		var learned map[ReplicaID]NodeID
		if _, payload, ok, err := DecodeEntry(cc.AsV2().GetContext()); ok && err == nil {
			learned, _ = decodePeers(payload)
		}
		g.setConf(cs, learned)
	}
}

// installedSnapshot takes a snapshot the pipeline installed (its
// MsgStorageAppendResp carries it; worker only, before stepping it): the
// applied index jumps to the snapshot's, the config is the snapshot's.
// Pending proposals at or below it may or may not be in it: outcome unknown.
func (g *group) installedSnapshot(snap *raftpb.Snapshot) {
	idx := snap.GetMetadata().GetIndex()
	if idx <= g.applied {
		return
	}
	g.applied = idx
	g.stApplied.Store(idx)
	g.setConf(raftpb.EnsureConfState(snap.GetMetadata().GetConfState()), nil)
	for seq, p := range g.pending {
		if p.index != 0 && p.index <= idx {
			g.dropPending(seq, p)
			p.finish(Result{}, fmt.Errorf("%w: group %d: index %d was covered by a snapshot before this replica applied it", ErrOutcomeUnknown, g.id, p.index))
		}
	}
}

// retire stops a removed replica (worker, at the end of its pass): pending
// proposals and reads fail, the group leaves the engine (Receive drops its
// messages, Status and Propose answer ErrUnknownGroup), and OnRemoved tells
// the owner, who deletes the replica's data. Storage jobs still queued for it
// finish into a group nobody processes.
func (e *Engine) retire(g *group) {
	g.member.retired.Store(true)
	err := fmt.Errorf("%w: group %d: replica %d was removed from the group", ErrOutcomeUnknown, g.id, g.replica)
	g.failAll(err, fmt.Errorf("%w: group %d: replica %d was removed from the group", ErrNotWritten, g.id, g.replica))
	g.failReads(fmt.Errorf("%w: group %d: replica removed", ErrReadNotConfirmed, g.id))
	e.mu.Lock()
	if e.groups[g.id] == g {
		delete(e.groups, g.id)
		list := make([]*group, 0, len(e.groups))
		for _, x := range *e.list.Load() {
			if x != g {
				list = append(list, x)
			}
		}
		e.list.Store(&list)
	}
	e.mu.Unlock()
	e.log.Info("replication: replica removed from its group; stopped", "group", uint64(g.id), "replica", uint64(g.replica))
	if g.member.onRemoved != nil {
		g.member.onRemoved(g.id, g.replica)
	}
}

// runCalls runs the functions queued for the worker (worker only).
func (g *group) runCalls() {
	g.mu.Lock()
	calls := g.member.calls
	g.member.calls = nil
	g.mu.Unlock()
	for _, f := range calls {
		f(g.rn)
	}
}

// onWorker runs f on the worker that holds group id's RawNode and waits for
// it (bounded by ctx).
func (e *Engine) onWorker(ctx context.Context, id GroupID, f func(*raft.RawNode)) error {
	g := e.group(id)
	if g == nil {
		return fmt.Errorf("%w: %d", ErrUnknownGroup, id)
	}
	done := make(chan struct{})
	g.mu.Lock()
	g.member.calls = append(g.member.calls, func(rn *raft.RawNode) { f(rn); close(done) })
	g.mu.Unlock()
	e.sched.enqueue(g, flagMessage)
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RemoveGroup stops this node's replica of group id without a
// configuration change: for a replica its group already removed but which
// never learned it (the leader's goodbyes were all lost), as its owner
// learns from elsewhere. The replica retires on its worker's next pass, as a
// removed one does (proposals fail, the group leaves the engine, OnRemoved
// is called); RemoveGroup does not wait for it.
func (e *Engine) RemoveGroup(id GroupID) error {
	g := e.group(id)
	if g == nil {
		return fmt.Errorf("%w: %d", ErrUnknownGroup, id)
	}
	e.askRemove(g)
	return nil
}

// askRemove makes g's replica retire on its worker's next pass.
func (e *Engine) askRemove(g *group) {
	g.member.removeAsked.Store(true)
	g.mu.Lock()
	g.member.calls = append(g.member.calls, func(*raft.RawNode) { g.member.removed = true })
	g.mu.Unlock()
	e.sched.enqueue(g, flagMessage)
}

// Membership returns the local replica's view of group id's configuration:
// the ConfState at its applied index (shared: do not modify it) and a copy
// of the address book it routes by.
func (e *Engine) Membership(id GroupID) (*raftpb.ConfState, map[ReplicaID]NodeID, error) {
	g := e.group(id)
	if g == nil {
		return nil, nil, fmt.Errorf("%w: %d", ErrUnknownGroup, id)
	}
	return g.member.stConf.Load(), maps.Clone(*g.member.peers.Load()), nil
}

// ProposeConfChange proposes a configuration change to group id, on its
// leader only (elsewhere *NotLeaderError), and waits, like Propose, until
// its entry is committed and applied by this replica. cc.Context, if set,
// must be PeersContext's encoding (the addresses of the replicas it adds);
// the engine prefixes it with the proposal header.
//
// The change is checked against the replica's applied config first: one raft
// could not apply (it would panic on every replica) fails with ErrNotWritten.
// Raft takes one change at a time: while an earlier one is not applied, or a
// joint config not left, it drops the entry, and ProposeConfChange fails with
// ErrNotWritten (retry later).
func (e *Engine) ProposeConfChange(ctx context.Context, id GroupID, cc *raftpb.ConfChangeV2) (Result, error) {
	if _, err := decodePeers(cc.GetContext()); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrNotWritten, err)
	}
	return e.propose1(ctx, id, nil, proto.Clone(cc).(*raftpb.ConfChangeV2))
}

// confEntry builds the entry of a conf change proposal and checks it against
// the applied config (worker only).
func (g *group) confEntry(h Header, cc *raftpb.ConfChangeV2) (*raftpb.Entry, error) {
	if _, err := nextConf(g.member.conf, cc); err != nil {
		return nil, fmt.Errorf("%w: group %d: %w", ErrNotWritten, g.id, err)
	}
	cc.Context = appendEntry(make([]byte, 0, maxHeaderLen+len(cc.GetContext())), h, cc.GetContext())
	data, err := proto.Marshal(cc)
	if err != nil {
		return nil, fmt.Errorf("%w: group %d: %w", ErrNotWritten, g.id, err)
	}
	return &raftpb.Entry{Type: raftpb.EntryConfChangeV2.Enum(), Data: data}, nil
}

// errConfRefused: raft dropped a conf change (another one is pending, or the
// group is in a joint config).
var errConfRefused = errors.New("raft refused the conf change: another change is not applied yet or the group is in a joint config")

// ReplaceVoter moves one voter of group id, on its leader, as the design's
// section 5 says: add replica add (on node addNode) as a learner; wait until
// its Match reaches the commit index (it caught up, by snapshot and log);
// then one ConfChangeV2 that promotes it and removes replica remove, with
// ConfChangeTransitionAuto (raft enters the joint config and leaves it by
// itself). It returns once this replica has left the joint config (or was
// itself the one removed). Each step is skipped when already done, so a
// caller may call it again after an error. ctx bounds every wait.
//
// The replica add must already run on addNode (an empty replica created with
// no state: its first config, from the snapshot, lists it as a learner) and
// its replica id must never have been used in the group.
func (e *Engine) ReplaceVoter(ctx context.Context, id GroupID, add ReplicaID, addNode NodeID, remove ReplicaID) error {
	g := e.group(id)
	if g == nil {
		return fmt.Errorf("%w: %d", ErrUnknownGroup, id)
	}
	if add == remove || add == 0 {
		return fmt.Errorf("replication: ReplaceVoter group %d: bad replicas add %d, remove %d", id, add, remove)
	}
	cs := g.member.stConf.Load()
	if slices.Contains(cs.GetVotersOutgoing(), uint64(add)) || slices.Contains(cs.GetVoters(), uint64(add)) {
		if len(cs.GetVotersOutgoing()) == 0 && !confHas(cs, remove) {
			return nil // done already
		}
	} else if !slices.Contains(cs.GetLearners(), uint64(add)) {
		cc := &raftpb.ConfChangeV2{
			Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: new(uint64(add))}},
			Context: PeersContext(map[ReplicaID]NodeID{add: addNode}),
		}
		if _, err := e.ProposeConfChange(ctx, id, cc); err != nil {
			return fmt.Errorf("replication: group %d: add learner %d: %w", id, add, err)
		}
	}
	if err := e.waitCaughtUp(ctx, id, add); err != nil {
		return err
	}
	if cs := g.member.stConf.Load(); len(cs.GetVotersOutgoing()) == 0 {
		cc := &raftpb.ConfChangeV2{
			Transition: raftpb.ConfChangeTransitionAuto.Enum(),
			Changes: []*raftpb.ConfChangeSingle{
				{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: new(uint64(add))},
				{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: new(uint64(remove))},
			},
			Context: PeersContext(map[ReplicaID]NodeID{add: addNode}),
		}
		if _, err := e.ProposeConfChange(ctx, id, cc); err != nil {
			return fmt.Errorf("replication: group %d: promote %d, remove %d: %w", id, add, remove, err)
		}
	}
	// Raft leaves the joint config by itself; wait for it here (or for this
	// replica's own removal).
	for {
		if g.member.retired.Load() {
			return nil
		}
		if len(g.member.stConf.Load().GetVotersOutgoing()) == 0 {
			return nil
		}
		if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
			return fmt.Errorf("replication: group %d: waiting to leave the joint config: %w", id, err)
		}
	}
}

// AddVoter grows group id by one voter, on its leader: add replica add (on
// node addNode) as a learner, wait until it caught up to the commit index
// (by snapshot and log), then promote it. Each step is skipped when already
// done, so a caller may call it again after an error. The replica must
// already run on addNode, empty, under an id never used in the group.
func (e *Engine) AddVoter(ctx context.Context, id GroupID, add ReplicaID, addNode NodeID) error {
	g := e.group(id)
	if g == nil {
		return fmt.Errorf("%w: %d", ErrUnknownGroup, id)
	}
	if add == 0 {
		return fmt.Errorf("replication: AddVoter group %d: replica 0", id)
	}
	cs := g.member.stConf.Load()
	if slices.Contains(cs.GetVoters(), uint64(add)) {
		return nil // done already
	}
	peers := PeersContext(map[ReplicaID]NodeID{add: addNode})
	if !slices.Contains(cs.GetLearners(), uint64(add)) {
		cc := &raftpb.ConfChangeV2{
			Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: new(uint64(add))}},
			Context: peers,
		}
		if _, err := e.ProposeConfChange(ctx, id, cc); err != nil {
			return fmt.Errorf("replication: group %d: add learner %d: %w", id, add, err)
		}
	}
	if err := e.waitCaughtUp(ctx, id, add); err != nil {
		return err
	}
	cc := &raftpb.ConfChangeV2{
		Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: new(uint64(add))}},
		Context: peers,
	}
	if _, err := e.ProposeConfChange(ctx, id, cc); err != nil {
		return fmt.Errorf("replication: group %d: promote %d: %w", id, add, err)
	}
	return nil
}

// waitCaughtUp waits, on the leader, until replica r's Match reaches the
// commit index taken at the first look.
func (e *Engine) waitCaughtUp(ctx context.Context, id GroupID, r ReplicaID) error {
	g := e.group(id)
	if g == nil {
		return fmt.Errorf("%w: %d", ErrUnknownGroup, id)
	}
	var target uint64
	for {
		var match, commit uint64
		var leader, known bool
		err := e.onWorker(ctx, id, func(rn *raft.RawNode) {
			st := rn.Status()
			leader = st.RaftState == raft.StateLeader
			commit = st.GetCommit()
			if pr, ok := st.Progress[uint64(r)]; ok {
				match, known = pr.Match, true
			}
		})
		if err != nil {
			return fmt.Errorf("replication: group %d: waiting for replica %d to catch up: %w", id, r, err)
		}
		if !leader {
			return g.notLeader()
		}
		if target == 0 {
			target = commit
		}
		if known && match >= target {
			return nil
		}
		if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
			return fmt.Errorf("replication: group %d: waiting for replica %d to catch up (match %d, commit %d): %w", id, r, match, target, err)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
