package replicationtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/persistence"
	"github.com/holdfast/holdfast/replication"
)

// The step-1 checks against the WAL-backed storage (design step 2): every
// node's raft logs live in persistence's write-ahead log (one data directory
// per node), read back through persistence.RaftStorage, and a crash closes
// the node's engine, pipelines and database and opens them again from the
// directory (replay: the state records, the strict checks, the raft index).
//
// In process, a crash cannot drop what the kernel has not synced (the
// persistence power-cut test does that); what a node loses here is every
// job not yet handed to the committer and every apply not yet done, and the
// log must give raft back exactly what it acknowledged as durable. The
// applied index is kept beside the directory (step 2b puts it in Badger).

type walNode struct {
	id      replication.NodeID
	dir     string
	applied map[replication.GroupID]uint64 // survives crashes

	db *persistence.DB
	pp *persistence.Pipeline
	wp *replication.WALPipeline
	e  *replication.Engine
}

type walCluster struct {
	t       *testing.T
	net     *Network
	checker *Checker
	groups  []replication.GroupID
	ecfg    replication.Config
	voters  []uint64
	quiet   *slog.Logger

	mu    sync.Mutex
	nodes map[replication.NodeID]*walNode
}

// newWALChecker is the checker of a WAL cluster: every node a voter (replica
// id = node id), the log bootstrapped at index 0.
func newWALChecker(nodes int) *Checker {
	cs := &raftpb.ConfState{}
	for i := 1; i <= nodes; i++ {
		cs.Voters = append(cs.Voters, uint64(i))
	}
	ch := newChecker(nodes, cs)
	ch.base = 0
	return ch
}

func newWALCluster(t *testing.T, nodes, groups int, seed uint64) *walCluster {
	c := &walCluster{
		t:       t,
		net:     NewNetwork(seed),
		checker: newWALChecker(nodes),
		quiet:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		nodes:   map[replication.NodeID]*walNode{},
	}
	c.ecfg = replication.Config{TickInterval: 2 * time.Millisecond, ElectionTick: 10, Workers: 2, Logger: c.quiet}
	for g := 1; g <= groups; g++ {
		c.groups = append(c.groups, replication.GroupID(g))
	}
	for i := 1; i <= nodes; i++ {
		c.voters = append(c.voters, uint64(i))
		id := replication.NodeID(i)
		c.nodes[id] = &walNode{id: id, dir: t.TempDir(), applied: map[replication.GroupID]uint64{}}
	}
	c.net.Start()
	for i := 1; i <= nodes; i++ {
		if err := c.start(replication.NodeID(i)); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func (c *walCluster) start(id replication.NodeID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[id]
	db, err := persistence.Open(persistence.Config{Dir: n.dir, SegmentSize: 64 << 10, MemTableSize: 8 << 20, BlockCacheSize: 1 << 20, ValueLogFileSize: 1 << 20, Logger: c.quiet})
	if err != nil {
		return fmt.Errorf("node %d: open: %w", id, err)
	}
	pp := persistence.NewPipeline(db, persistence.PipelineConfig{Logger: c.quiet, ValueLogGCEvery: -1})
	pp.Start()
	wp := replication.NewWALPipeline(db, pp, func(g replication.GroupID, ent *raftpb.Entry) {
		c.checker.appliedEntry(id, g, ent)
	}, n.applied, c.quiet)
	ecfg := c.ecfg
	ecfg.Node = id
	e, err := replication.New(ecfg, c.net.Endpoint(id), wp)
	if err != nil {
		return err
	}
	peers := map[replication.ReplicaID]replication.NodeID{}
	for _, v := range c.voters {
		peers[replication.ReplicaID(v)] = replication.NodeID(v)
	}
	conf := func() *raftpb.ConfState { return &raftpb.ConfState{Voters: c.voters} }
	for _, g := range c.groups {
		st, applied, err := wp.Storage(g, replication.ReplicaID(id), conf)
		if err != nil {
			return fmt.Errorf("node %d restart: %w", id, err)
		}
		if err := e.AddGroup(replication.GroupConfig{ID: g, Replica: replication.ReplicaID(id), Peers: peers, Storage: st, Applied: applied}); err != nil {
			return err
		}
	}
	if err := e.Start(); err != nil {
		return err
	}
	n.db, n.pp, n.wp, n.e = db, pp, wp, e
	c.net.Attach(id, e)
	c.net.SetDown(id, false)
	return nil
}

// crash stops node id: no more messages, no more applies, the engine goes,
// the committer takes what is queued and stops, the database closes (the
// raft logs stay in the directory).
func (c *walCluster) crash(id replication.NodeID) {
	c.mu.Lock()
	n := c.nodes[id]
	running := n.e != nil
	c.mu.Unlock()
	if !running {
		return
	}
	c.net.SetDown(id, true)
	n.wp.Close()
	if err := n.e.Close(); err != nil {
		c.t.Error(err)
	}
	n.pp.Close()
	if err := n.e.Err(); err != nil {
		c.t.Errorf("node %d: %v", id, err)
	}
	if err := n.wp.Err(); err != nil {
		c.t.Errorf("node %d: %v", id, err)
	}
	c.mu.Lock()
	n.applied = n.wp.AppliedIndex()
	db := n.db
	n.db, n.pp, n.wp, n.e = nil, nil, nil, nil
	c.mu.Unlock()
	if err := db.Close(); err != nil {
		c.t.Errorf("node %d: close: %v", id, err)
	}
}

func (c *walCluster) engine(id replication.NodeID) *replication.Engine {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id].e
}

func (c *walCluster) applied(id replication.NodeID, g replication.GroupID) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[id]
	if n.wp != nil {
		return n.wp.AppliedIndex()[g]
	}
	return n.applied[g]
}

func (c *walCluster) leader(g replication.GroupID) replication.NodeID {
	for id := range c.nodes {
		if e := c.engine(id); e != nil {
			if st, err := e.Status(g); err == nil && st.IsLeader {
				return id
			}
		}
	}
	return 0
}

// propose proposes payload to g until acknowledged, known not written
// (then it tries again) or ctx ends, and tells the checker.
func (c *walCluster) propose(ctx context.Context, g replication.GroupID, payload []byte) {
	for ctx.Err() == nil {
		if id := c.leader(g); id != 0 {
			if e := c.engine(id); e != nil {
				res, err := e.Propose(ctx, g, payload)
				if err == nil {
					c.checker.acked(g, payload, res)
					return
				}
				if !isNotWritten(err) {
					return // outcome unknown: never propose it again
				}
			}
		}
		_ = sleepCtx(ctx, time.Millisecond)
	}
	c.checker.notWritten(payload)
}

func isNotWritten(err error) bool {
	return errors.Is(err, replication.ErrNotWritten)
}

func (c *walCluster) close() {
	for id := range c.nodes {
		c.crash(id)
	}
	c.net.Close()
}

// TestWALStorage_ModelChecksHoldAcrossCrashes runs proposal streams on every
// group while nodes crash and restart from their write-ahead logs, one at a
// time or two at once, then checks the model's invariants (Checker) and that
// every acknowledged proposal ends up applied on a majority.
func TestWALStorage_ModelChecksHoldAcrossCrashes(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 27))
	c := newWALCluster(t, 3, 2, seed)
	defer c.close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var next atomic.Uint64
	var wg sync.WaitGroup
	for _, g := range c.groups {
		for range 2 {
			wg.Go(func() {
				for ctx.Err() == nil {
					pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
					c.propose(pctx, g, fmt.Appendf(nil, "g%d-%d", g, next.Add(1)))
					pcancel()
				}
			})
		}
	}
	rounds := 12
	if testing.Short() {
		rounds = 5
	}
	for round := range rounds {
		time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond)
		victims := []replication.NodeID{replication.NodeID(1 + rng.IntN(3))}
		if rng.IntN(2) == 0 {
			if l := c.leader(c.groups[rng.IntN(len(c.groups))]); l != 0 {
				victims[0] = l
			}
		}
		if round%4 == 3 { // two of three: the groups stop until one is back
			victims = append(victims, victims[0]%3+1)
		}
		for _, v := range victims {
			c.crash(v)
		}
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		for _, v := range victims {
			if err := c.start(v); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if err := c.checker.Err(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	cancel()
	wg.Wait()
	deadline, dcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer dcancel()
	for {
		err := c.checker.underReplicated(func(r replication.ReplicaID, g replication.GroupID) uint64 {
			return c.applied(replication.NodeID(r), g)
		})
		if err == nil {
			break
		}
		if sleepCtx(deadline, 5*time.Millisecond) != nil {
			t.Fatal(err)
		}
	}
	if err := c.checker.Err(); err != nil {
		t.Fatal(err)
	}
	if c.checker.Acked() < 20 {
		t.Fatalf("only %d proposals acknowledged: the test did not exercise the log", c.checker.Acked())
	}
	t.Logf("%d proposals acknowledged", c.checker.Acked())
}
