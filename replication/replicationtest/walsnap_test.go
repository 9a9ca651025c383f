package replicationtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/persistence"
	"github.com/holdfast/holdfast/replication"
)

// Snapshots over the WAL pipeline and the TCP carrier (design section 6):
// several nodes in one process, each with its own replicated database,
// persistence pipeline, WAL pipeline (the transport's SnapshotSource and
// SnapshotSink), engine, NetTransport and TCPCarrier on 127.0.0.1. A node
// stops (everything closed, the data directory kept) and starts again on a
// new port.

type snapNode struct {
	id      replication.NodeID
	dir     string
	replica replication.ReplicaID

	db      *persistence.DB
	pp      *persistence.Pipeline
	wp      *replication.WALPipeline
	e       *replication.Engine
	tr      *replication.NetTransport
	carrier *replication.TCPCarrier
	stats   replication.NetStats // of the last run, kept at stop
}

type snapCluster struct {
	t     *testing.T
	g     replication.GroupID
	quiet *slog.Logger
	wcfg  replication.WALConfig

	mu    sync.Mutex
	nodes map[replication.NodeID]*snapNode
	peers map[replication.ReplicaID]replication.NodeID
}

// newSnapCluster starts nodes 1..voters, each a voter of group g (replica id
// = node id), bootstrapped.
func newSnapCluster(t *testing.T, voters int, wcfg replication.WALConfig) *snapCluster {
	c := &snapCluster{t: t, g: 3, quiet: slog.New(slog.NewTextHandler(io.Discard, nil)), wcfg: wcfg,
		nodes: map[replication.NodeID]*snapNode{}, peers: map[replication.ReplicaID]replication.NodeID{}}
	cs := &raftpb.ConfState{}
	for i := 1; i <= voters; i++ {
		cs.Voters = append(cs.Voters, uint64(i))
		c.peers[replication.ReplicaID(i)] = replication.NodeID(i)
	}
	for i := 1; i <= voters; i++ {
		c.nodes[replication.NodeID(i)] = &snapNode{id: replication.NodeID(i), dir: t.TempDir(), replica: replication.ReplicaID(i)}
	}
	t.Cleanup(c.close)
	for i := 1; i <= voters; i++ {
		c.start(replication.NodeID(i), cs)
	}
	return c
}

// start starts node id (bootstrapping its replica with boot, if not nil).
func (c *snapCluster) start(id replication.NodeID, boot *raftpb.ConfState) {
	t := c.t
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[id]
	var err error
	if n.db, err = persistence.Open(persistence.Config{Dir: n.dir, Partitions: 8, SegmentSize: 1 << 20, MemTableSize: 8 << 20, BlockCacheSize: 1 << 20, Logger: c.quiet, Replicated: true}); err != nil {
		t.Fatal(err)
	}
	n.pp = persistence.NewPipeline(n.db, persistence.PipelineConfig{Logger: c.quiet, ValueLogGCEvery: -1})
	n.pp.Start()
	wcfg := c.wcfg
	wcfg.Logger = c.quiet
	n.wp = replication.NewWALPipeline(n.db, n.pp, wcfg)
	if n.carrier, err = replication.ListenTCP(replication.TCPConfig{Bind: "127.0.0.1:0", Logger: c.quiet}); err != nil {
		t.Fatal(err)
	}
	if n.tr, err = replication.NewNetTransport(replication.NetConfig{Node: id, Storage: storageOf(id), Snapshots: n.wp, SnapshotSink: n.wp, Logger: c.quiet}, n.carrier); err != nil {
		t.Fatal(err)
	}
	n.carrier.SetHandler(n.tr.HandleFrame)
	if n.e, err = replication.New(replication.Config{Node: id, TickInterval: 10 * time.Millisecond, ElectionTick: 10, Logger: c.quiet}, n.tr, n.wp); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if boot != nil {
		if err := n.wp.Bootstrap(ctx, c.g, n.replica, boot); err != nil {
			t.Fatal(err)
		}
	}
	st, applied, err := n.wp.Storage(c.g, n.replica)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.e.AddGroup(replication.GroupConfig{ID: c.g, Replica: n.replica, Peers: maps.Clone(c.peers), Storage: st, Applied: applied}); err != nil {
		t.Fatal(err)
	}
	for oid, o := range c.nodes {
		if oid == id || o.carrier == nil {
			continue
		}
		n.carrier.SetAddr(oid, o.carrier.Addr())
		n.tr.SetPeer(oid, storageOf(oid))
		o.carrier.SetAddr(id, n.carrier.Addr())
		o.tr.SetPeer(id, storageOf(id))
	}
	if err := n.tr.Start(n.e); err != nil {
		t.Fatal(err)
	}
	if err := n.e.Start(); err != nil {
		t.Fatal(err)
	}
}

// stop stops node id; its data directory stays.
func (c *snapCluster) stop(id replication.NodeID) {
	c.mu.Lock()
	n := c.nodes[id]
	c.mu.Unlock()
	if n.e == nil {
		return
	}
	_ = n.e.Close()
	n.stats = n.tr.Stats()
	_ = n.tr.Close()
	_ = n.carrier.Close()
	n.wp.Close()
	n.pp.Close()
	if err := n.wp.Err(); err != nil {
		c.t.Errorf("node %d: %v", id, err)
	}
	if err := n.e.Err(); err != nil {
		c.t.Errorf("node %d: %v", id, err)
	}
	if err := n.db.Close(); err != nil {
		c.t.Errorf("node %d: %v", id, err)
	}
	c.mu.Lock()
	n.db, n.pp, n.wp, n.e, n.tr, n.carrier = nil, nil, nil, nil, nil, nil
	c.mu.Unlock()
}

func (c *snapCluster) close() {
	for id := range c.nodes {
		c.stop(id)
	}
}

func (c *snapCluster) node(id replication.NodeID) *snapNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// leader returns the node whose replica leads, waiting for one.
func (c *snapCluster) leader(ctx context.Context) replication.NodeID {
	c.t.Helper()
	for {
		c.mu.Lock()
		for id, n := range c.nodes {
			if n.e != nil {
				if st, err := n.e.Status(c.g); err == nil && st.IsLeader {
					c.mu.Unlock()
					return id
				}
			}
		}
		c.mu.Unlock()
		if sleepCtx(ctx, 5*time.Millisecond) != nil {
			c.t.Fatal("no leader")
		}
	}
}

// write proposes sets (and deletes) of partition keys until the leader
// acknowledges them.
func (c *snapCluster) write(ctx context.Context, w *persistence.Write) {
	c.t.Helper()
	payload := persistence.AppendChanges(nil, w)
	for {
		e := c.node(c.leader(ctx)).e
		if e != nil {
			_, err := e.Propose(ctx, c.g, payload)
			if err == nil {
				return
			}
			if !errors.Is(err, replication.ErrNotWritten) {
				var nl *replication.NotLeaderError
				if !errors.As(err, &nl) && ctx.Err() != nil {
					c.t.Fatal(err)
				}
			}
		}
		if sleepCtx(ctx, 5*time.Millisecond) != nil {
			c.t.Fatal("write: timed out")
		}
	}
}

func pk(g replication.GroupID, s string) []byte {
	return append(persistence.PartitionPrefix(uint32(g)), s...)
}

// partition returns node id's keys and values of the group's partition.
func (c *snapCluster) partition(id replication.NodeID) map[string]string {
	c.t.Helper()
	out := map[string]string{}
	db := c.node(id).db
	err := db.Scan(context.Background(), persistence.PartitionPrefix(uint32(c.g)), nil, nil, func(k, v []byte) (bool, error) {
		out[string(k)] = string(v)
		return true, nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// waitSame waits until node id's partition equals node ref's, and both
// applied the same index.
func (c *snapCluster) waitSame(ctx context.Context, id, ref replication.NodeID) map[string]string {
	c.t.Helper()
	for {
		a, b := c.partition(id), c.partition(ref)
		ai, bi := c.node(id).wp.AppliedIndex()[c.g], c.node(ref).wp.AppliedIndex()[c.g]
		if ai == bi && maps.Equal(a, b) {
			return a
		}
		if sleepCtx(ctx, 20*time.Millisecond) != nil {
			c.t.Fatalf("node %d's partition (%d keys, applied %d) never equalled node %d's (%d keys, applied %d)", id, len(a), ai, ref, len(b), bi)
		}
	}
}

// flushAll flushes every running node's Badger, so that logs get truncated.
func (c *snapCluster) flushAll() {
	c.mu.Lock()
	var pps []*persistence.Pipeline
	for _, n := range c.nodes {
		if n.pp != nil {
			pps = append(pps, n.pp)
		}
	}
	c.mu.Unlock()
	for _, pp := range pps {
		_ = pp.Flush()
	}
}

// TestWALSnapshot_AReplicaThatWasDownCatchesUpBySnapshot: a follower down
// while the others write (overwriting and deleting keys it holds) and
// truncate their logs far past its last entry comes back, gets the
// partition by snapshot over TCP, then the log after it: its Badger then
// holds exactly the leader's keys and values, also after a restart.
func TestWALSnapshot_AReplicaThatWasDownCatchesUpBySnapshot(t *testing.T) {
	c := newSnapCluster(t, 3, replication.WALConfig{KeepEntries: 5, BudgetEvery: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for i := range 40 {
		c.write(ctx, &persistence.Write{Sets: []persistence.KV{{Key: pk(c.g, fmt.Sprintf("k%03d", i)), Value: []byte("v1")}}})
	}
	lead := c.leader(ctx)
	down := replication.NodeID(lead%3 + 1)
	c.waitSame(ctx, down, lead)
	last, _ := c.node(down).db.RaftStorage(uint64(c.g), uint64(down), nil).LastIndex()
	c.stop(down)
	for i := 0; ; i++ {
		w := &persistence.Write{Sets: []persistence.KV{{Key: pk(c.g, fmt.Sprintf("n%03d", i)), Value: []byte("v2")}}}
		if i < 20 {
			w.Deletes = [][]byte{pk(c.g, fmt.Sprintf("k%03d", i))} // keys the stopped node holds
			w.Sets = append(w.Sets, persistence.KV{Key: pk(c.g, fmt.Sprintf("k%03d", 39-i)), Value: []byte("v3")})
		}
		c.write(ctx, w)
		if i%10 == 9 {
			c.flushAll()
		}
		l := c.leader(ctx)
		if first, _ := c.node(l).db.RaftStorage(uint64(c.g), uint64(l), nil).FirstIndex(); i >= 40 && first > last+1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the leader's log was never truncated past the stopped node's last entry")
		}
	}
	c.start(down, nil)
	want := c.waitSame(ctx, down, c.leader(ctx))
	if _, has := want[string(pk(c.g, "k000"))]; has || want[string(pk(c.g, "k039"))] != "v3" {
		t.Fatalf("the leader's partition is not what was written: %d keys", len(want))
	}
	if got := c.node(down).tr.Stats().SnapsReceived; got == 0 {
		t.Fatal("the node caught up without a snapshot: the test shows nothing")
	}
	// Writes after the snapshot reach it through the log.
	c.write(ctx, &persistence.Write{Sets: []persistence.KV{{Key: pk(c.g, "after"), Value: []byte("x")}}})
	c.waitSame(ctx, down, c.leader(ctx))
	// A restart (the snapshot installed again, or flushed) changes nothing.
	c.stop(down)
	c.start(down, nil)
	c.waitSame(ctx, down, c.leader(ctx))
}

// TestWALSnapshot_ANewVoterGetsTheWholePartitionInChunks: a replica added
// on an empty node (Engine.ReplaceVoter: learner, snapshot, catch-up,
// promotion replacing a voter) gets a partition of several MiB in 1 MiB
// chunks, holds exactly the leader's keys, and then counts as a voter: with
// another voter stopped, writes still commit.
func TestWALSnapshot_ANewVoterGetsTheWholePartitionInChunks(t *testing.T) {
	c := newSnapCluster(t, 3, replication.WALConfig{KeepEntries: 5, BudgetEvery: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	value := make([]byte, 100<<10)
	for i := range 70 { // 7 MiB
		value[0] = byte(i)
		c.write(ctx, &persistence.Write{Sets: []persistence.KV{{Key: pk(c.g, fmt.Sprintf("big%03d", i)), Value: value}}})
	}
	c.flushAll()
	lead := c.leader(ctx)
	remove := replication.ReplicaID(lead%3 + 1)
	c.mu.Lock()
	c.nodes[4] = &snapNode{id: 4, dir: t.TempDir(), replica: 4}
	c.peers[4] = 4
	c.mu.Unlock()
	c.start(4, nil) // empty: no bootstrap
	if err := c.node(lead).e.ReplaceVoter(ctx, c.g, 4, 4, remove); err != nil {
		t.Fatal(err)
	}
	got := c.waitSame(ctx, 4, lead)
	if len(got) != 70 {
		t.Fatalf("the new replica holds %d keys, want 70", len(got))
	}
	st := c.node(lead).tr.Stats()
	if st.SnapsSent == 0 || st.SnapChunks < 5 {
		t.Fatalf("the leader sent %d snapshots in %d chunks; want one of at least 5 chunks", st.SnapsSent, st.SnapChunks)
	}
	cs, _, err := c.node(4).e.Membership(c.g)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cs.GetVoters(), 4) || slices.Contains(cs.GetVoters(), uint64(remove)) {
		t.Fatalf("voters %v after the move, want 4 in and %d out", cs.GetVoters(), remove)
	}
	// Stop the remaining voter that is neither the leader nor 4: the
	// leader and 4 must make the majority.
	for _, v := range cs.GetVoters() {
		if id := replication.NodeID(v); id != lead && id != 4 {
			c.stop(id)
		}
	}
	c.stop(replication.NodeID(remove))
	c.write(ctx, &persistence.Write{Sets: []persistence.KV{{Key: pk(c.g, "with-4"), Value: []byte("x")}}})
	c.waitSame(ctx, 4, c.leader(ctx))
}
