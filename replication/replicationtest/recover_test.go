package replicationtest

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/persistence"
	"github.com/holdfast/holdfast/replication"
)

// TestWALStorage_ReseedRecoversAGroupFromOneSurvivor: a group of three loses
// two nodes for good; the survivor's log is copied into a new replica (9)
// that is the group's only voter (WALPipeline.Reseed, recover-partition). It
// elects itself, applies every entry the survivor held (the copy keeps them
// all), takes new writes, and its configuration is {9}: the conf change in
// the copied log (a learner added) is not applied again. The old replica's
// log is then ended (Forget): it holds no entries. A second Reseed is a
// no-op (the seeding is idempotent).
func TestWALStorage_ReseedRecoversAGroupFromOneSurvivor(t *testing.T) {
	c := newWALCluster(t, 3, 1, uint64(time.Now().UnixNano()), func(c *walCluster) { c.wcfg.KeepEntries = 0 })
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g := c.groups[0]
	c.leadAll(t, 1)
	var payloads [][]byte
	for i := range 20 {
		p := walPayload(g, uint64(i))
		c.propose(ctx, g, p)
		payloads = append(payloads, p)
	}
	for {
		cc := &raftpb.ConfChangeV2{
			Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: new(uint64(7))}},
			Context: replication.PeersContext(map[replication.ReplicaID]replication.NodeID{7: 3}),
		}
		_, err := c.engine(1).ProposeConfChange(ctx, g, cc)
		if err == nil {
			break
		}
		if !errors.Is(err, replication.ErrNotWritten) || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := 20; i < 30; i++ {
		p := walPayload(g, uint64(i))
		c.propose(ctx, g, p)
		payloads = append(payloads, p)
	}
	c.crash(2)
	c.crash(3)
	c.crash(1)

	// Node 1 alone: its database, a pipeline, and the new replica.
	var mu sync.Mutex
	var seen [][]byte
	db, wp := c.reopenAlone(t, 1, func(_ replication.GroupID, ent *raftpb.Entry) {
		if _, p, ok, _ := replication.DecodeEntry(ent.GetData()); ok && len(p) > 0 {
			mu.Lock()
			seen = append(seen, bytes.Clone(p))
			mu.Unlock()
		}
	})
	oldLast, _ := db.RaftStorage(uint64(g), 1, nil).LastIndex()
	last, err := wp.Reseed(ctx, g, 1, 9, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	if last != oldLast {
		t.Fatalf("the copy ends at %d, the survivor's log at %d", last, oldLast)
	}
	if again, err := wp.Reseed(ctx, g, 1, 9, 1<<40); err != nil || again != last {
		t.Fatalf("a second Reseed: %d, %v (want %d, nil)", again, err, last)
	}
	// Asked to delete the old replica's data too, Forget keeps it: the new
	// replica (9) starts on it.
	if err := wp.ForgetAndDelete(ctx, []replication.Retired{{Group: g, Replica: 1}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range payloads {
		if _, ok, err := db.Get(ctx, walPayloadKey(t, p)); err != nil || !ok {
			t.Fatalf("key %q is gone after the old replica's Forget (%v): the recovered replica's data", walPayloadKey(t, p), err)
		}
	}
	s1 := db.RaftStorage(uint64(g), 1, nil)
	if first, _ := s1.FirstIndex(); first != oldLast+1 {
		t.Fatalf("the old replica's log starts at %d after Forget, want %d (empty)", first, oldLast+1)
	}
	net := NewNetwork(1)
	net.Start()
	defer net.Close()
	e, err := replication.New(replication.Config{Node: 1, TickInterval: 2 * time.Millisecond, ElectionTick: 10, Workers: 2, Logger: c.quiet}, net.Endpoint(1), wp)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	st, applied, err := wp.Storage(g, 9)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.AddGroup(replication.GroupConfig{ID: g, Replica: 9, Peers: map[replication.ReplicaID]replication.NodeID{9: 1}, Storage: st, Applied: applied}); err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	net.Attach(1, e)
	var res replication.Result
	for {
		p := walPayload(g, 1000)
		if res, err = e.Propose(ctx, g, p); err == nil {
			payloads = append(payloads, p)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the recovered replica takes no write: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if res.Term <= 1<<40 {
		t.Fatalf("the first write after the recovery has term %d, want above the minimum 2^40", res.Term)
	}
	if res.Index <= last {
		t.Fatalf("the first write after the recovery is at index %d, not after the copied log's %d", res.Index, last)
	}
	cs, _, err := e.Membership(g)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cs.GetVoters(), []uint64{9}) || len(cs.GetLearners()) > 0 || len(cs.GetVotersOutgoing()) > 0 {
		t.Fatalf("the recovered group's configuration is %v, want voters [9] only", cs)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range payloads {
		if !slices.ContainsFunc(seen, func(s []byte) bool { return bytes.Equal(s, p) }) {
			t.Fatalf("the recovered replica never applied %q (applied %d payloads)", walPayloadKey(t, p), len(seen))
		}
	}
}

// writtenThenDown returns a cluster of three nodes whose one group (g) took 20
// writes led by node 1, with every node then stopped.
func writtenThenDown(t *testing.T) (*walCluster, replication.GroupID) {
	t.Helper()
	c := newWALCluster(t, 3, 1, uint64(time.Now().UnixNano()), func(c *walCluster) { c.wcfg.KeepEntries = 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g := c.groups[0]
	c.leadAll(t, 1)
	for i := range 20 {
		c.propose(ctx, g, walPayload(g, uint64(i)))
	}
	c.crash(2)
	c.crash(3)
	c.crash(1)
	return c, g
}

// TestWALStorage_ForgetAndDeleteDeletesTheData: a replica that left its group
// and has no successor on the node has its log ended and its partition's
// keys deleted from Badger; the empty snapshot that deleted them is cleared
// from the log (no staged file left), and a second call changes nothing.
func TestWALStorage_ForgetAndDeleteDeletesTheData(t *testing.T) {
	c, g := writtenThenDown(t)
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db, wp := c.reopenAlone(t, 1, nil)
	prefix := persistence.PartitionPrefix(uint32(g))
	if has, err := db.HasPrefix(ctx, prefix); err != nil || !has {
		t.Fatalf("the partition holds no key before Forget (%v): the test tests nothing", err)
	}
	last, _ := db.RaftStorage(uint64(g), 1, nil).LastIndex()
	for range 2 {
		if err := wp.ForgetAndDelete(ctx, []replication.Retired{{Group: g, Replica: 1}}); err != nil {
			t.Fatal(err)
		}
		if has, err := db.HasPrefix(ctx, prefix); err != nil || has {
			t.Fatalf("the partition still holds keys after ForgetAndDelete (%v)", err)
		}
		s := db.RaftStorage(uint64(g), 1, nil)
		if first, _ := s.FirstIndex(); first != last+1 {
			t.Fatalf("the log starts at %d after ForgetAndDelete, want %d (empty)", first, last+1)
		}
		if names, _ := filepath.Glob(filepath.Join(c.nodes[1].dir, "snap", "*.snap")); len(names) != 0 {
			t.Fatalf("staged snapshots left: %v", names)
		}
	}
}

// TestWALStorage_AFailedReplicaCanBeRemovedAndItsGroupStartedAgain: a
// replica started on a log that was ended (Forget) fails (raft panics: the
// entries it must apply are gone), and stays failed; RemoveGroup still stops
// it (OnRemoved is called, the group leaves the engine), so that a new
// replica of the same group can start on the node. (A cluster node once
// restarted a replica it had just been removed from, before the cluster's
// table said so, while its log was being ended: the failed group never left
// the engine, and the partition never got its new replica on that node.)
func TestWALStorage_AFailedReplicaCanBeRemovedAndItsGroupStartedAgain(t *testing.T) {
	c, g := writtenThenDown(t)
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	_, wp := c.reopenAlone(t, 1, nil)
	st, applied, err := wp.Storage(g, 1)
	if err != nil {
		t.Fatal(err)
	}
	net := NewNetwork(1)
	net.Start()
	defer net.Close()
	e, err := replication.New(replication.Config{Node: 1, TickInterval: 2 * time.Millisecond, ElectionTick: 10, Workers: 2, Logger: c.quiet}, net.Endpoint(1), wp)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	removed := make(chan replication.ReplicaID, 1)
	onRemoved := func(_ replication.GroupID, r replication.ReplicaID) { removed <- r }
	peers := map[replication.ReplicaID]replication.NodeID{1: 1, 2: 2, 3: 3}
	if err := e.AddGroup(replication.GroupConfig{ID: g, Replica: 1, Peers: peers, Storage: st, Applied: applied, OnRemoved: onRemoved}); err != nil {
		t.Fatal(err)
	}
	// Its log ends under it, as the cluster's Forget of a removed replica
	// did while the replica started again.
	if err := wp.Forget(ctx, g, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	net.Attach(1, e)
	for !errors.Is(e.Err(), replication.ErrGroupFailed) {
		if ctx.Err() != nil {
			t.Fatalf("the replica on an ended log did not fail: %v", e.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := e.RemoveGroup(g); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-removed:
		if r != 1 {
			t.Fatalf("OnRemoved for replica %d, want 1", r)
		}
	case <-ctx.Done():
		t.Fatal("the failed replica was not removed")
	}
	if _, err := e.Status(g); !errors.Is(err, replication.ErrUnknownGroup) {
		t.Fatalf("the group after the failed replica's removal: %v, want ErrUnknownGroup", err)
	}
	st9, applied9, err := wp.Storage(g, 9)
	if err != nil {
		t.Fatal(err)
	}
	peers[9] = 1
	if err := e.AddGroup(replication.GroupConfig{ID: g, Replica: 9, Peers: peers, Storage: st9, Applied: applied9}); err != nil {
		t.Fatalf("a new replica of the group after the failed one's removal: %v", err)
	}
}

// reopenAlone opens crashed node n's data directory on its own: its
// database, a pipeline and a WAL pipeline (observe sees each applied
// entry; nil: none), closed when the test ends.
func (c *walCluster) reopenAlone(t *testing.T, n replication.NodeID, observe func(replication.GroupID, *raftpb.Entry)) (*persistence.DB, *replication.WALPipeline) {
	t.Helper()
	db, err := persistence.Open(persistence.Config{Dir: c.nodes[n].dir, Partitions: 1, SegmentSize: 64 << 10, MemTableSize: 8 << 20, BlockCacheSize: 1 << 20, ValueLogFileSize: 1 << 20, Logger: c.quiet, Replicated: true})
	if err != nil {
		t.Fatal(err)
	}
	pp := persistence.NewPipeline(db, persistence.PipelineConfig{Logger: c.quiet, ValueLogGCEvery: -1})
	pp.Start()
	wp := replication.NewWALPipeline(db, pp, replication.WALConfig{Logger: c.quiet, Observe: observe})
	t.Cleanup(func() {
		wp.Close()
		pp.Close()
		_ = db.Close()
	})
	return db, wp
}
