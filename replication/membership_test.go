package replication_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/holdfast/holdfast/replication"
	"github.com/holdfast/holdfast/replication/replicationtest"
)

// load proposes to g until stop is called, one proposal at a time per
// writer; failures (no leader for a moment, not written) are expected.
func load(c *replicationtest.Cluster, g replication.GroupID, writers int) (stop func() int64) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var acked, next atomic.Int64
	for w := range writers {
		wg.Go(func() {
			for ctx.Err() == nil {
				pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
				_, err := c.Propose(pctx, g, fmt.Appendf(nil, "w%d-%d", w, next.Add(1)))
				pcancel()
				if err == nil {
					acked.Add(1)
				}
			}
		})
	}
	return func() int64 { cancel(); wg.Wait(); return acked.Load() }
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// confChanges collects the ConfChangeV2s node n applies to g.
type confChanges struct {
	mu  sync.Mutex
	ccs map[replication.NodeID][]*raftpb.ConfChangeV2
}

func (cc *confChanges) onApply(n replication.NodeID, _ replication.GroupID, ent *raftpb.Entry) {
	if ent.GetType() != raftpb.EntryConfChangeV2 {
		return
	}
	v := new(raftpb.ConfChangeV2)
	if err := proto.Unmarshal(ent.GetData(), v); err != nil {
		panic(err)
	}
	cc.mu.Lock()
	cc.ccs[n] = append(cc.ccs[n], v)
	cc.mu.Unlock()
}

// jointMove reports whether node n applied one auto-leaving joint change
// that promotes add and removes remove.
func (cc *confChanges) jointMove(n replication.NodeID, add, remove replication.ReplicaID) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for _, v := range cc.ccs[n] {
		if v.GetTransition() != raftpb.ConfChangeTransitionAuto || len(v.GetChanges()) != 2 {
			continue
		}
		a, r := v.GetChanges()[0], v.GetChanges()[1]
		if a.GetType() == raftpb.ConfChangeAddNode && a.GetNodeId() == uint64(add) &&
			r.GetType() == raftpb.ConfChangeRemoveNode && r.GetNodeId() == uint64(remove) {
			return true
		}
	}
	return false
}

func sortedVoters(e *replication.Engine, g replication.GroupID) ([]uint64, *raftpb.ConfState) {
	cs, _, err := e.Membership(g)
	if err != nil {
		return nil, nil
	}
	return slices.Sorted(slices.Values(cs.GetVoters())), cs
}

// TestMembership_ReplaceUnderLoad: in a 3-replica group under load whose
// logs were truncated, a new replica on a 4th node is added as a learner,
// catches up by a snapshot, and is promoted while a follower is removed, in
// one auto-leaving joint change; the removed replica learns it and stops
// (its group leaves its engine, its data are deleted). The checker holds
// throughout: the new replica was a learner in the first config it learned,
// never a voter before its promotion, and every replica holds the same state
// and config at each index.
func TestMembership_ReplaceUnderLoad(t *testing.T) {
	ccs := &confChanges{ccs: map[replication.NodeID][]*raftpb.ConfChangeV2{}}
	c := newCluster(t, replicationtest.Config{Nodes: 4, Replicas: 3, Groups: 1, CompactEvery: 16, CompactKeep: 2, OnApply: ccs.onApply})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	const g = replication.GroupID(1)
	stop := load(c, g, 3)
	defer stop()
	// Truncated logs first: the new replica cannot be fed from the log.
	waitFor(t, ctx, "the logs to be truncated", func() bool {
		for _, n := range []replication.NodeID{1, 2, 3} {
			if c.Disk(n).FirstIndex(g) <= 40 {
				return false
			}
		}
		return true
	})
	l := c.Leader(g)
	remove := replication.ReplicaID(1)
	if l == 1 {
		remove = 2
	}
	add, err := c.Replace(ctx, g, 4, remove)
	if err != nil {
		t.Fatalf("replace %d by a replica on node 4: %v", remove, err)
	}
	if _, _, _, installs := c.Disk(4).State(g); installs == 0 {
		t.Fatal("the new replica caught up without a snapshot")
	}
	if !ccs.jointMove(l, add, remove) {
		t.Fatalf("node %d applied no joint change promoting %d and removing %d: %v", l, add, remove, ccs.ccs[l])
	}
	want := []uint64{1, 2, 3}
	want = slices.DeleteFunc(want, func(v uint64) bool { return v == uint64(remove) })
	want = append(want, uint64(add))
	for _, n := range []replication.NodeID{1, 2, 3, 4} {
		if n == replication.NodeID(remove) {
			continue
		}
		waitFor(t, ctx, fmt.Sprintf("node %d to hold the final config", n), func() bool {
			got, cs := sortedVoters(c.Engine(n), g)
			return slices.Equal(got, want) && len(cs.GetVotersOutgoing()) == 0 && len(cs.GetLearners()) == 0
		})
	}
	// The removed replica learns its removal and stops.
	waitFor(t, ctx, "the removed replica to stop", func() bool {
		_, err := c.Engine(replication.NodeID(remove)).Status(g)
		return errors.Is(err, replication.ErrUnknownGroup)
	})
	// OnRemoved (which deletes the data here) runs after the group left the
	// engine (confchange.go, retire): the race run once looked in between.
	waitFor(t, ctx, "the removed replica's data to be deleted", func() bool {
		_, _, err := c.Disk(replication.NodeID(remove)).Open(g)
		return errors.Is(err, replicationtest.ErrRemoved)
	})
	if acked := stop(); acked == 0 {
		t.Fatal("no proposal acknowledged under load")
	}
	// The group works with its new voter; every acknowledged proposal is on
	// a majority of the new config.
	if _, err := c.Propose(ctx, g, []byte("after the move")); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitAcked(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, c)
}

// TestMembership_RemoveLeader: the leader replaces itself; once it applies
// its removal it steps down and stops, another replica leads, and the group
// takes proposals.
func TestMembership_RemoveLeader(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 4, Replicas: 3, Groups: 1, CompactEvery: 16, CompactKeep: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	const g = replication.GroupID(1)
	stop := load(c, g, 2)
	defer stop()
	waitFor(t, ctx, "some load", func() bool { return c.Checker.Acked() >= 30 })
	old := c.Leader(g)
	if old == 0 {
		t.Fatal("no leader")
	}
	if _, err := c.Replace(ctx, g, 4, replication.ReplicaID(old)); err != nil {
		t.Fatalf("replace the leader %d: %v", old, err)
	}
	waitFor(t, ctx, "the old leader to stop", func() bool {
		_, err := c.Engine(old).Status(g)
		return errors.Is(err, replication.ErrUnknownGroup)
	})
	waitFor(t, ctx, "a new leader", func() bool {
		l := c.Leader(g)
		return l != 0 && l != old
	})
	stop()
	if _, err := c.Propose(ctx, g, []byte("after the leader left")); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitAcked(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, c)
}

// TestMembership_ProposeConfChange: a follower refuses with a
// NotLeaderError; a change raft could not apply (removing every voter) is
// refused before it is proposed; a second change while the group is in a
// joint config is dropped by raft and reported not written.
func TestMembership_ProposeConfChange(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	const g = replication.GroupID(1)
	l := c.Leader(g)
	f := l%3 + 1
	learner := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: new(uint64(9))}}}
	var nle *replication.NotLeaderError
	if _, err := c.Engine(f).ProposeConfChange(ctx, g, learner); !errors.As(err, &nle) {
		t.Fatalf("on a follower: %v, want a NotLeaderError", err)
	}
	var all []*raftpb.ConfChangeSingle
	for _, r := range []uint64{1, 2, 3} {
		all = append(all, &raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: new(r)})
	}
	if _, err := c.Engine(l).ProposeConfChange(ctx, g, &raftpb.ConfChangeV2{Changes: all}); !errors.Is(err, replication.ErrNotWritten) {
		t.Fatalf("removing every voter: %v, want ErrNotWritten", err)
	}
	// An explicit joint config stays until left: a change inside it is
	// refused by raft.
	joint := &raftpb.ConfChangeV2{Transition: raftpb.ConfChangeTransitionJointExplicit.Enum(), Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: new(uint64(9))}}}
	res, err := c.Engine(l).ProposeConfChange(ctx, g, joint)
	if err != nil {
		t.Fatal(err)
	}
	if res.Index == 0 {
		t.Fatal("no index for an applied conf change")
	}
	if _, err := c.Engine(l).ProposeConfChange(ctx, g, learner); !errors.Is(err, replication.ErrNotWritten) {
		t.Fatalf("a change inside a joint config: %v, want ErrNotWritten", err)
	}
	if _, err := c.Engine(l).ProposeConfChange(ctx, g, &raftpb.ConfChangeV2{}); err != nil {
		t.Fatalf("leave the joint config: %v", err)
	}
	cs, _, err := c.Engine(l).Membership(g)
	if err != nil || len(cs.GetVotersOutgoing()) != 0 || !slices.Equal(cs.GetLearners(), []uint64{9}) {
		t.Fatalf("config after leaving: %v, %v", cs, err)
	}
	checkClean(t, c)
}

// TestMembership_LearnerSnapshot: a new, empty replica added as a learner
// to a group whose logs were truncated gets a snapshot; once installed, its
// engine holds the snapshot's config (in which it is a learner) and its
// applied index jumped to the snapshot's, and it does not count as a voter.
func TestMembership_LearnerSnapshot(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 4, Replicas: 3, Groups: 1, CompactEvery: 16, CompactKeep: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	const g = replication.GroupID(1)
	for i := range 60 {
		if _, err := c.Propose(ctx, g, fmt.Appendf(nil, "p%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := c.AddReplica(g, 4)
	if err != nil {
		t.Fatal(err)
	}
	cc := &raftpb.ConfChangeV2{
		Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: new(uint64(r))}},
		Context: replication.PeersContext(map[replication.ReplicaID]replication.NodeID{r: 4}),
	}
	l := c.Leader(g)
	res, err := c.Engine(l).ProposeConfChange(ctx, g, cc)
	if err != nil {
		t.Fatal(err)
	}
	// More writes, so that a snapshot past the change exists.
	for i := range 40 {
		if _, err := c.Propose(ctx, g, fmt.Appendf(nil, "q%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, ctx, "the learner's snapshot", func() bool {
		_, _, _, installs := c.Disk(4).State(g)
		return installs > 0
	})
	applied, _, _, _ := c.Disk(4).State(g)
	waitFor(t, ctx, "the learner's engine to take the snapshot", func() bool {
		st, err := c.Engine(4).Status(g)
		return err == nil && st.Applied >= applied
	})
	cs, peers, err := c.Engine(4).Membership(g)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cs.GetLearners(), []uint64{uint64(r)}) || !slices.Equal(cs.GetVoters(), []uint64{1, 2, 3}) {
		t.Fatalf("the learner's config after its snapshot: %v (the change was at index %d)", cs, res.Index)
	}
	if peers[replication.ReplicaID(l)] != l {
		t.Fatalf("the learner's address book lacks the leader: %v", peers)
	}
	// It never leads nor campaigns (the checker watches every message).
	if st, _ := c.Engine(4).Status(g); st.IsLeader {
		t.Fatal("the learner leads")
	}
	checkClean(t, c)
}

// TestMembership_RemovedLearnsOnLossyNetwork: on a network that drops and
// delays messages, a removed follower still learns its removal and stops:
// the leader stops replicating to it once it applied the change, so it
// sends it the missing entries with their commit a few more times.
func TestMembership_RemovedLearnsOnLossyNetwork(t *testing.T) {
	for i := range 5 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			c := newCluster(t, replicationtest.Config{Nodes: 4, Replicas: 3, Groups: 1, Seed: uint64(i)})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := c.WaitLeaders(ctx); err != nil {
				t.Fatal(err)
			}
			const g = replication.GroupID(1)
			l := c.Leader(g)
			remove := replication.NodeID(l%3 + 1)
			c.Net.SetFaults(replicationtest.Faults{Drop: 0.3, MaxDelay: time.Millisecond})
			if _, err := c.Replace(ctx, g, 4, replication.ReplicaID(remove)); err != nil {
				t.Fatal(err)
			}
			before, _ := c.Engine(l).Status(g)
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			defer wcancel()
			waitFor(t, wctx, "the removed replica to stop", func() bool {
				_, err := c.Engine(remove).Status(g)
				if wctx.Err() != nil {
					after, _ := c.Engine(l).Status(g)
					t.Logf("term before %d after %d, leader %d now %v", before.Term, after.Term, l, after.IsLeader)
				}
				return errors.Is(err, replication.ErrUnknownGroup)
			})
			checkClean(t, c)
		})
	}
}

// TestMembership_RemovedLearnsFromTheOthers: a replica removed while its
// leader cannot reach it (so the leader's goodbyes are lost, as when
// leadership moves or the log is compacted before they go) learns its
// removal from another replica of its group once it campaigns, and stops.
// Before removal notices it waited for its owner for ever (CI, in
// TestMembership_ReplaceUnderLoad).
func TestMembership_RemovedLearnsFromTheOthers(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 4, Replicas: 3, Groups: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	const g = replication.GroupID(1)
	l := c.Leader(g)
	remove := replication.NodeID(l%3 + 1)
	c.Net.Cut(l, remove)
	if _, err := c.Replace(ctx, g, 4, replication.ReplicaID(remove)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the removed replica to stop", func() bool {
		_, err := c.Engine(remove).Status(g)
		return errors.Is(err, replication.ErrUnknownGroup)
	})
	if l2 := c.Leader(g); l2 != l {
		t.Fatalf("the removed replica disturbed the group: leader %d, was %d", l2, l)
	}
	if _, err := c.Propose(ctx, g, []byte("after the removal")); err != nil {
		t.Fatal(err)
	}
	checkClean(t, c)
}

// TestMembership_AddVoter: a group grows by one voter (learner, catch-up by
// snapshot, promotion); with one of the old voters then down, the new one
// makes the majority.
func TestMembership_AddVoter(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 4, Replicas: 3, Groups: 1, CompactEvery: 16, CompactKeep: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	const g = replication.GroupID(1)
	for i := range 40 {
		if _, err := c.Propose(ctx, g, fmt.Appendf(nil, "p%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := c.AddReplica(g, 4)
	if err != nil {
		t.Fatal(err)
	}
	l := c.Leader(g)
	if err := c.Engine(l).AddVoter(ctx, g, r, 4); err != nil {
		t.Fatal(err)
	}
	if err := c.Engine(l).AddVoter(ctx, g, r, 4); err != nil { // done already
		t.Fatalf("AddVoter again: %v", err)
	}
	cs, _, err := c.Engine(l).Membership(g)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cs.GetVoters(), uint64(r)) || len(cs.GetVoters()) != 4 || len(cs.GetLearners()) != 0 {
		t.Fatalf("config after AddVoter: %v", cs)
	}
	// Two of the old voters down: the remaining one and the new voter are
	// two of four, not a majority; one down: three of four are.
	var old []replication.NodeID
	for _, id := range c.NodeIDs() {
		if id != 4 && id != l {
			old = append(old, id)
		}
	}
	c.Crash(old[0])
	if _, err := c.Propose(ctx, g, []byte("with a voter down")); err != nil {
		t.Fatalf("propose with one old voter down: %v", err)
	}
	checkClean(t, c)
}
