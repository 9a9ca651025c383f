package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/replication"
)

// Moving replicas (spec/cluster.md, "Membership and moves"; design section
// 5). A move replaces one replica R of a group by a new, empty replica N on
// another node (or, when R's node came back on another data directory, on
// the same node): the controller decides it and writes it into the group's
// entry (N with Replaces = R); N's node starts N empty; the group's leader
// adds N as a learner, waits until it caught up (by snapshot, then the log),
// and promotes it and removes R in one joint configuration change
// (Engine.ReplaceVoter), then settles the entry (R gone, N plain). Every
// step is idempotent, so a new leader or controller finishes a move that a
// crash interrupted. A group has at most one move at a time, the cluster at
// most MaxMoves.
//
// The controller moves a replica when:
//   - its node runs on another data directory than the replica was placed
//     on (a wiped or replaced disk, a reused nodeId): the replica is lost,
//     and never votes again (storage identity);
//   - its node has been down for ReplaceAfter (as this controller saw it: a
//     new controller starts counting again);
//   - its node is leaving (holdfast cluster leave, or a graceful stop);
//   - the nodes' replica counts differ by more than one (a node joined).

// planMoves is the controller's pass over formed groups: it starts the moves
// the rules above ask for, within MaxMoves.
func (r *replicated) planMoves() error {
	m := r.m
	nodes, _, _, _ := m.view.snapshot()
	groups := m.view.groupsSnapshot()
	now := time.Now()
	seen := map[string]bool{}
	for _, g := range groups {
		for _, rep := range g.Replicas {
			if _, live := nodes[rep.Node]; live {
				continue
			}
			seen[rep.Node] = true
			if _, ok := r.downSince[rep.Node]; !ok {
				r.downSince[rep.Node] = now
			}
		}
	}
	for id := range r.downSince {
		if !seen[id] {
			delete(r.downSince, id)
		}
	}
	eligible := func(n NodeInfo) bool {
		return !n.Client && !n.Leaving && n.Num != 0 && n.Raft != "" && n.Storage != ""
	}
	load := map[string]int{}
	for id, n := range nodes {
		if eligible(n) {
			load[id] = 0
		}
	}
	pending := 0
	for _, g := range groups {
		if g.moving() {
			pending++
		}
		for _, rep := range g.Replicas {
			if _, ok := load[rep.Node]; ok && nodes[rep.Node].Storage == rep.Storage {
				load[rep.Node]++
			}
		}
	}
	// pick returns the eligible node with the fewest replicas that has none
	// of g's.
	pick := func(g GroupEntry) string {
		best := ""
		for _, id := range sortedIDs(nodes) {
			if _, ok := load[id]; !ok || g.hasNode(id) {
				continue
			}
			if best == "" || load[id] < load[best] {
				best = id
			}
		}
		return best
	}
	// move adds a replica on node to in place of from (from.ID 0: in
	// addition to g's replicas).
	move := func(p int, g GroupEntry, from ReplicaEntry, to, why string) error {
		n := nodes[to]
		ne := GroupEntry{Replicas: append([]ReplicaEntry(nil), g.Replicas...), Next: g.Next + 1, Losses: g.Losses}
		ne.Replicas = append(ne.Replicas, ReplicaEntry{ID: g.Next, Node: to, Num: n.Num, Storage: n.Storage, Replaces: from.ID, Adding: from.ID == 0})
		// Only if to's entry is the one the plan saw: a node marked leaving
		// (or gone) since gets no replica (a leave once returned with a
		// replica placed on it afterwards, by a plan made before its mark).
		if err := casGroup(m.ctx, m.cli, m.k, uint32(p), g, ne, clientv3.Compare(clientv3.ModRevision(m.k.node(to)), "=", n.rev)); err != nil {
			return err
		}
		groups[p] = ne
		pending++
		load[to]++
		m.events.moving.add(to, "moving a replica", "partition", p, "from", from.Node, "to", to, "why", why)
		return nil
	}
	// A move whose new replica's node went down, is leaving, or runs on
	// another data directory is given up (the leader undoes it).
	for p, g := range groups {
		for i, rep := range g.Replicas {
			if !rep.pending() || rep.Abort {
				continue
			}
			if n, live := nodes[rep.Node]; live && !n.Leaving && n.Storage == rep.Storage {
				continue
			}
			ne := GroupEntry{Replicas: append([]ReplicaEntry(nil), g.Replicas...), Next: g.Next, Losses: g.Losses}
			ne.Replicas[i].Abort = true
			if err := casGroup(m.ctx, m.cli, m.k, uint32(p), g, ne); err != nil {
				return err
			}
			groups[p] = ne
			m.log.Info("giving up a replica move: its target is down or leaving", "partition", p, "to", rep.Node)
		}
	}
	for p, g := range groups {
		if pending >= m.cfg.MaxMoves {
			return nil
		}
		if len(g.Replicas) == 0 || g.moving() {
			continue
		}
		if len(g.Replicas) < r.rf {
			// Formed with fewer nodes than the factor: grow as nodes come.
			if to := pick(g); to != "" {
				if err := move(p, g, ReplicaEntry{}, to, "the group has fewer replicas than the replication factor"); err != nil {
					return err
				}
				continue
			}
		}
		for _, rep := range g.Replicas {
			n, live := nodes[rep.Node]
			to, why := "", ""
			switch {
			case live && !n.Client && n.Storage != "" && n.Storage != rep.Storage:
				if eligible(n) {
					to, why = rep.Node, "its node runs on another data directory: the replica is lost"
				}
			case !live && now.Sub(r.downSince[rep.Node]) >= m.cfg.ReplaceAfter:
				to, why = pick(g), fmt.Sprintf("its node has been down for over %v", m.cfg.ReplaceAfter)
			case live && n.Leaving:
				to, why = pick(g), "its node is leaving"
			}
			if to == "" {
				continue
			}
			if err := move(p, g, rep, to, why); err != nil {
				return err
			}
			break
		}
	}
	// Balance: from the node with the most replicas to the one with the
	// fewest, once nothing else moves (the loads count both replicas of a
	// move in progress), up to MaxMoves at once. (The loop's condition once
	// had "&& pending == 0": the first move ended it, so a join moved one
	// replica at a time.)
	if pending > 0 {
		return nil
	}
	for pending < m.cfg.MaxMoves {
		most, few := "", ""
		for _, id := range sortedIDs(nodes) {
			if _, ok := load[id]; !ok {
				continue
			}
			if most == "" || load[id] > load[most] {
				most = id
			}
			if few == "" || load[id] < load[few] {
				few = id
			}
		}
		if most == "" || load[most]-load[few] <= 1 {
			return nil
		}
		moved := false
		for p, g := range groups {
			if len(g.Replicas) == 0 || g.moving() || g.hasNode(few) {
				continue
			}
			if rep, ok := g.replicaOn(most, nodes[most].Storage); ok {
				if err := move(p, g, rep, few, "balance: a node has fewer replicas"); err != nil {
					return err
				}
				load[most]--
				moved = true
				break
			}
		}
		if !moved {
			return nil
		}
	}
	return nil
}

// moving reports whether g has a move in progress.
func (g GroupEntry) moving() bool {
	for _, r := range g.Replicas {
		if r.pending() {
			return true
		}
	}
	return false
}

// pending reports whether r is being added by a move.
func (r ReplicaEntry) pending() bool { return r.Replaces != 0 || r.Adding }

// hasNode reports whether g has a replica on node id (any data directory).
func (g GroupEntry) hasNode(id string) bool {
	for _, r := range g.Replicas {
		if r.Node == id {
			return true
		}
	}
	return false
}

// moveAttempt bounds one attempt of a move on the leader.
const moveAttempt = 10 * time.Second

// moveLoop drives, on each group's leader, the moves the controller wrote.
func (r *replicated) moveLoop() {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	var mu sync.Mutex
	running := map[uint32]bool{}
	for {
		select {
		case <-r.m.ctx.Done():
			return
		case <-t.C:
		}
		for _, g := range r.e.Groups() {
			p := uint32(g)
			st, err := r.e.Status(g)
			if err != nil || !st.IsLeader || r.epoch(p) == 0 {
				continue
			}
			entry := r.m.view.group(p)
			var add ReplicaEntry
			for _, rep := range entry.Replicas {
				if rep.pending() {
					add = rep
				}
			}
			mu.Lock()
			busy := running[p]
			if add.ID != 0 && !busy {
				running[p] = true
			}
			mu.Unlock()
			if add.ID == 0 || busy {
				continue
			}
			r.m.goOwned(func() {
				defer func() {
					mu.Lock()
					delete(running, p)
					mu.Unlock()
				}()
				r.runMove(g, st.Replica, add)
			})
		}
	}
}

// runMove carries out the move that adds replica add (on the leader, whose
// replica is self).
func (r *replicated) runMove(g replication.GroupID, self replication.ReplicaID, add ReplicaEntry) {
	m := r.m
	p := uint32(g)
	remove := replication.ReplicaID(add.Replaces)
	if add.Abort {
		r.abortMove(g, add)
		return
	}
	if add.Adding {
		ctx, cancel := context.WithTimeout(m.ctx, moveAttempt)
		defer cancel()
		if err := r.e.AddVoter(ctx, g, replication.ReplicaID(add.ID), replication.NodeID(add.Num)); err != nil {
			if m.ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				m.log.Warn("adding a replica did not finish; trying again", "partition", p, "to", add.Node, "err", err)
			}
			return
		}
		if r.settle(p, 0, add.ID) {
			m.events.moved.add(add.Node, "added a replica", "partition", p, "on", add.Node)
		}
		return
	}
	if remove == self {
		// Removing itself would leave the group without a leader until an
		// election: hand it to another voter that answers first.
		for _, rep := range m.view.group(p).Replicas {
			to := replication.ReplicaID(rep.ID)
			if to != self && to != replication.ReplicaID(add.ID) && rep.Replaces == 0 && r.e.Responsive(g, to, responsiveWithin(r.tick)) {
				ctx, cancel := context.WithTimeout(m.ctx, 20*r.tick)
				_ = r.e.TransferLeader(ctx, g, to)
				cancel()
				return
			}
		}
		return
	}
	// ReplaceVoter resumes where it stopped: a short wait per attempt lets
	// moveLoop see an abort between attempts (a snapshot of a big partition
	// takes several).
	ctx, cancel := context.WithTimeout(m.ctx, moveAttempt)
	defer cancel()
	start := time.Now()
	if err := r.e.ReplaceVoter(ctx, g, replication.ReplicaID(add.ID), replication.NodeID(add.Num), remove); err != nil {
		switch {
		case m.ctx.Err() != nil:
		case errors.Is(err, context.DeadlineExceeded):
			m.log.Debug("a replica move goes on (the new replica is catching up)", "partition", p, "to", add.Node, "err", err)
		default:
			m.log.Warn("a replica move did not finish; trying again", "partition", p, "to", add.Node, "err", err)
		}
		return
	}
	// Settle the entry: the replaced replica goes, the new one is plain.
	if r.settle(p, add.Replaces, add.ID) {
		m.events.moved.add(add.Node, "moved a replica", "partition", p, "to", add.Node, "took", time.Since(start).Round(time.Millisecond))
	}
}

// abortMove undoes the move that adds replica add, on the group's leader:
// if raft finished it already (add is a voter, the replaced one gone), the
// entry is settled as done; if add is a learner it is removed from the
// group; then it leaves the entry. A joint configuration is waited out (raft
// leaves it by itself; the next pass looks again).
func (r *replicated) abortMove(g replication.GroupID, add ReplicaEntry) {
	m := r.m
	p := uint32(g)
	cs, _, err := r.e.Membership(g)
	if err != nil || len(cs.GetVotersOutgoing()) > 0 {
		return
	}
	isVoter := slices.Contains(cs.GetVoters(), add.ID)
	if isVoter && add.Adding {
		if r.settle(p, 0, add.ID) {
			m.log.Info("added a replica (its move was given up after raft finished it)", "partition", p, "on", add.Node)
		}
		return
	}
	if isVoter && !slices.Contains(cs.GetVoters(), add.Replaces) && !slices.Contains(cs.GetLearners(), add.Replaces) {
		if r.settle(p, add.Replaces, add.ID) {
			m.log.Info("moved a replica (its move was given up after raft finished it)", "partition", p, "to", add.Node)
		}
		return
	}
	if isVoter {
		return // not a state a move leaves behind: leave it for people to see
	}
	if slices.Contains(cs.GetLearners(), add.ID) {
		ctx, cancel := context.WithTimeout(m.ctx, 20*r.tick)
		_, err := r.e.ProposeConfChange(ctx, g, &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: new(add.ID)}}})
		cancel()
		if err != nil {
			m.log.Debug("cannot remove the learner of a move given up; trying again", "partition", p, "err", err)
			return
		}
	}
	if r.settle(p, add.ID, 0) {
		m.log.Info("gave up a replica move", "partition", p, "to", add.Node)
	}
}

// settle rewrites partition p's group entry without replica gone, and with
// replica done's move flags cleared (0: none), by compare-and-swap on a fresh
// read. It reports whether it did.
func (r *replicated) settle(p uint32, gone, done uint64) bool {
	m := r.m
	for attempt := 0; attempt < 10 && m.ctx.Err() == nil; attempt++ {
		cur, err := readGroup(m.ctx, m.cli, m.k, p)
		if err != nil {
			sleep(m.ctx, 200*time.Millisecond)
			continue
		}
		ne := settled(cur, gone, done)
		if err := casGroup(m.ctx, m.cli, m.k, p, cur, ne); errors.Is(err, errConflict) {
			continue
		} else if err != nil {
			sleep(m.ctx, 200*time.Millisecond)
			continue
		}
		return true
	}
	return false
}

// settled is g without replica gone and with replica done's move flags
// cleared (0: none). A replica that replaced another takes its place in the
// list: the first replica is the one balancing gives the leadership to, so
// the nodes that join get first places, and leaderships, with the replicas
// they take over (appended at the end, a node that joined after the cluster
// formed never led: found by the five-node process tests).
func settled(g GroupEntry, gone, done uint64) GroupEntry {
	ne := GroupEntry{Next: g.Next, Losses: g.Losses}
	var moved *ReplicaEntry
	goneListed := false
	for _, rep := range g.Replicas {
		if done != 0 && rep.ID == done {
			rep.Replaces, rep.Adding, rep.Abort = 0, false, false
			moved = &rep
		}
		goneListed = goneListed || gone != 0 && rep.ID == gone
	}
	for _, rep := range g.Replicas {
		switch {
		case gone != 0 && rep.ID == gone:
			if moved != nil {
				ne.Replicas = append(ne.Replicas, *moved)
			}
		case moved != nil && rep.ID == done:
			if !goneListed {
				ne.Replicas = append(ne.Replicas, *moved)
			}
		default:
			ne.Replicas = append(ne.Replicas, rep)
		}
	}
	return ne
}

// onRemoved is the engine's word that this node's replica of g left its
// group: it stops, and the node forgets it (forgetRetired: its log, and its
// partition's data unless the node holds another replica of the group).
func (r *replicated) onRemoved(g replication.GroupID, rid replication.ReplicaID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.local[uint32(g)] == rid {
		delete(r.local, uint32(g))
	}
	if r.removing[uint32(g)] == rid {
		delete(r.removing, uint32(g))
	}
	r.retired = append(r.retired, [2]uint64{uint64(g), uint64(rid)})
	r.ended[[2]uint64{uint64(g), uint64(rid)}] = true
	r.m.poke()
}

// forgetRetired ends the logs of the replicas that left their groups for
// good (onRemoved): their entries no longer pin the write-ahead log's
// segments, and a snapshot they named is not installed again at the next
// start over the data of the group's later replicas here. The partition's
// data is deleted too, unless the table places another replica of the group
// on this node: a recovery's new replica starts on that data
// (WALPipeline.Reseed), and any other gets a snapshot that replaces it.
// Reconcile's goroutine only (Forget waits for a commit, and a deletion for a
// memtable flush: one for all the replicas that retired since the last call).
func (r *replicated) forgetRetired() {
	r.mu.Lock()
	todo := r.retired
	r.retired = nil
	r.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	var keep, del []replication.Retired
	for _, k := range todo {
		rt := replication.Retired{Group: replication.GroupID(k[0]), Replica: replication.ReplicaID(k[1])}
		if slices.ContainsFunc(r.m.view.group(uint32(k[0])).Replicas, func(rep ReplicaEntry) bool {
			// (The table may still list the retired replica itself: a
			// removal applies in raft before the leader settles the table.)
			return rep.Node == r.m.id && (rep.ID != k[1] || rep.RecoverFrom == k[1])
		}) {
			keep = append(keep, rt)
		} else {
			del = append(del, rt)
		}
	}
	ctx, cancel := context.WithTimeout(r.m.ctx, time.Minute)
	defer cancel()
	var err error
	for _, rt := range keep {
		if err = r.wp.Forget(ctx, rt.Group, rt.Replica); err != nil {
			break
		}
	}
	if err == nil {
		err = r.wp.ForgetAndDelete(ctx, del)
	}
	if err != nil {
		// All again: both are idempotent.
		if r.m.ctx.Err() == nil {
			r.m.log.Warn("could not end the logs of removed replicas (or delete their data); trying again", "replicas", len(todo), "err", err)
		}
		r.mu.Lock()
		r.retired = append(r.retired, todo...)
		r.mu.Unlock()
	}
}
