package replicationtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/replication"
	"github.com/holdfast/holdfast/replication/internal/testknobs"
)

// Config configures a Cluster.
type Config struct {
	Nodes  int // default 3
	Groups int // default 1
	// Replicas is each group's replica count at the start, on nodes
	// 1..Replicas (replica id = node id). Default Nodes. Nodes above it host
	// nothing until a move places a replica there (Replace, AddReplica).
	Replicas int
	// CompactEvery and CompactKeep set every pipeline's log compaction
	// (MemPipeline.SetCompaction). 0: the log is never truncated.
	CompactEvery, CompactKeep uint64
	// Seed seeds the network's faults.
	Seed uint64
	// Engine is the template for every node's engine config (Node is set per
	// node). Zero fields take replication's defaults, except TickInterval
	// (default 10 ms here: tests want fast elections).
	Engine replication.Config
	// SyncDelay models each pipeline's fdatasync. Default 0.
	SyncDelay time.Duration
	// Faults are the network's initial message faults.
	Faults Faults
	// OnApply, if set, is called for every entry a node applies (after the
	// cluster's own checks), on that node's apply goroutine.
	OnApply func(n replication.NodeID, g replication.GroupID, ent *raftpb.Entry)
	// OnApplyJob, if set, is called with every apply job a node's engine
	// queues, on the engine's worker.
	OnApplyJob func(n replication.NodeID, job replication.Job)

	// ackBeforeSync plants the bug "append responses before the sync" in
	// every node's pipeline.
	ackBeforeSync bool
	// staleReads plants the bug "ReadIndex answered from the replica's own
	// commit index, without a quorum round" in every node's engine.
	staleReads bool
	// leaseIgnoresTransfer plants the bug "the lease is not ended when a
	// leadership transfer starts" in every node's engine.
	leaseIgnoresTransfer bool
}

// Node is one member: its disk survives crashes, its pipeline and engine do not.
type Node struct {
	ID     replication.NodeID
	Disk   *MemDisk
	pipe   *MemPipeline
	engine *replication.Engine
	// replicas: the replica of each group this node hosts (guarded by
	// Cluster.pmu); a replica leaves it when it learns its removal.
	replicas map[replication.GroupID]replication.ReplicaID
}

// Cluster is N engines x G groups over a simulated Network, nodes 1..Replicas
// the voters of every group at the start (replica id = node id), with a
// Checker fed by every apply, every snapshot install and every message.
// Replace moves a replica to another node through the leader.
//
// Methods are safe for concurrent use except where noted.
type Cluster struct {
	cfg     Config
	Net     *Network
	Checker *Checker

	// skew is each node's clock offset (SkewClock): a node's clock, for its
	// lease and its heartbeat stamps alike, is time.Now() + skew.
	skew map[replication.NodeID]*atomic.Int64

	mu    sync.Mutex
	nodes map[replication.NodeID]*Node

	// pmu guards placement: every replica ever created per group and its
	// node (the address book a new replica starts with), Node.replicas,
	// nextReplica. Taken inside mu, never the other way.
	pmu         sync.Mutex
	place       map[replication.GroupID]map[replication.ReplicaID]replication.NodeID
	nextReplica replication.ReplicaID
	// errs collects failures that are not the checker's: a node whose disk
	// fails its restart checks, a group that raft stopped.
	errs []error
}

// NewCluster bootstraps every group on every node's disk and starts all nodes.
func NewCluster(cfg Config) (*Cluster, error) {
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.Groups == 0 {
		cfg.Groups = 1
	}
	if cfg.Replicas == 0 || cfg.Replicas > cfg.Nodes {
		cfg.Replicas = cfg.Nodes
	}
	if cfg.Engine.TickInterval == 0 {
		cfg.Engine.TickInterval = 10 * time.Millisecond
	}
	if cfg.Engine.Logger == nil {
		cfg.Engine.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	voters := make([]replication.ReplicaID, cfg.Replicas)
	initial := &raftpb.ConfState{}
	for i := range voters {
		voters[i] = replication.ReplicaID(i + 1)
		initial.Voters = append(initial.Voters, uint64(i+1))
	}
	c := &Cluster{
		cfg:         cfg,
		Net:         NewNetwork(cfg.Seed),
		Checker:     newChecker(cfg.Nodes, initial),
		nodes:       make(map[replication.NodeID]*Node),
		place:       make(map[replication.GroupID]map[replication.ReplicaID]replication.NodeID),
		nextReplica: 100, // above every initial replica id; never reused
		skew:        make(map[replication.NodeID]*atomic.Int64),
	}
	c.Net.SetFaults(cfg.Faults)
	for i := 1; i <= cfg.Nodes; i++ {
		c.skew[replication.NodeID(i)] = new(atomic.Int64)
		c.Net.SetClock(replication.NodeID(i), c.clock(replication.NodeID(i)))
	}
	c.Net.observe = c.Checker.sent
	for _, g := range c.GroupIDs() {
		c.place[g] = make(map[replication.ReplicaID]replication.NodeID)
		for _, r := range voters {
			c.place[g][r] = replication.NodeID(r)
		}
	}
	for i := 1; i <= cfg.Nodes; i++ {
		n := &Node{ID: replication.NodeID(i), Disk: NewMemDisk(), replicas: make(map[replication.GroupID]replication.ReplicaID)}
		if i <= cfg.Replicas {
			for g := 1; g <= cfg.Groups; g++ {
				if err := n.Disk.Bootstrap(replication.GroupID(g), voters); err != nil {
					return nil, err
				}
				n.replicas[replication.GroupID(g)] = replication.ReplicaID(i)
			}
		}
		c.nodes[n.ID] = n
	}
	c.Net.Start()
	for _, id := range c.NodeIDs() {
		if err := c.start(id); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// NodeIDs returns 1..N.
func (c *Cluster) NodeIDs() []replication.NodeID {
	ids := make([]replication.NodeID, c.cfg.Nodes)
	for i := range ids {
		ids[i] = replication.NodeID(i + 1)
	}
	return ids
}

// GroupIDs returns 1..G.
func (c *Cluster) GroupIDs() []replication.GroupID {
	ids := make([]replication.GroupID, c.cfg.Groups)
	for i := range ids {
		ids[i] = replication.GroupID(i + 1)
	}
	return ids
}

// start opens node id's disk and starts a pipeline and an engine on it.
func (c *Cluster) start(id replication.NodeID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[id]
	if n.engine != nil {
		return fmt.Errorf("replicationtest: node %d is running", id)
	}
	var apply ApplyFunc
	if c.cfg.OnApply != nil {
		apply = func(g replication.GroupID, ent *raftpb.Entry) { c.cfg.OnApply(id, g, ent) }
	}
	pipe := NewMemPipeline(n.Disk, apply, c.cfg.SyncDelay)
	pipe.ackBeforeSync = c.cfg.ackBeforeSync
	if c.cfg.OnApplyJob != nil {
		pipe.onApplyJob = func(job replication.Job) { c.cfg.OnApplyJob(id, job) }
	}
	pipe.SetCompaction(c.cfg.CompactEvery, c.cfg.CompactKeep)
	pipe.observe = func(g replication.GroupID, r replication.ReplicaID, ent *raftpb.Entry, d Digest, cs *raftpb.ConfState, err error) {
		c.Checker.applied(id, r, g, ent, d, cs, err)
	}
	pipe.restored = func(g replication.GroupID, r replication.ReplicaID, snap *raftpb.Snapshot) {
		c.Checker.restored(id, r, g, snap)
	}
	ecfg := c.cfg.Engine
	ecfg.Node = id
	e, err := replication.New(ecfg, c.Net.Endpoint(id), pipe)
	if err != nil {
		return err
	}
	if c.cfg.staleReads {
		testknobs.StaleReads(e)
	}
	if c.cfg.leaseIgnoresTransfer {
		testknobs.LeaseIgnoresTransfer(e)
	}
	testknobs.LeaseClock(e, c.clock(id))
	c.pmu.Lock()
	hosted := maps.Clone(n.replicas)
	c.pmu.Unlock()
	for g, r := range hosted {
		st, applied, err := n.Disk.Open(g)
		if errors.Is(err, ErrRemoved) {
			continue
		}
		if err != nil {
			err = fmt.Errorf("node %d restart: %w", id, err)
			c.errs = append(c.errs, err)
			return err
		}
		if err := e.AddGroup(c.groupConfig(n, g, r, st, applied)); err != nil {
			return err
		}
	}
	pipe.Start()
	if err := e.Start(); err != nil {
		pipe.Crash()
		return err
	}
	n.pipe, n.engine = pipe, e
	c.Net.Attach(id, e)
	c.Net.SetDown(id, false)
	return nil
}

// groupConfig is replica r of g on node n, with the placement as its
// starting address book.
func (c *Cluster) groupConfig(n *Node, g replication.GroupID, r replication.ReplicaID, st raft.Storage, applied uint64) replication.GroupConfig {
	c.pmu.Lock()
	peers := maps.Clone(c.place[g])
	c.pmu.Unlock()
	return replication.GroupConfig{
		ID: g, Replica: r, Peers: peers, Storage: st, Applied: applied,
		OnRemoved: func(g replication.GroupID, r replication.ReplicaID) {
			// The replica applied its removal and stopped: delete its
			// data, as a node would.
			n.Disk.Remove(g)
			c.pmu.Lock()
			if n.replicas[g] == r {
				delete(n.replicas, g)
			}
			c.pmu.Unlock()
		},
	}
}

// Hosts returns the nodes that host a replica of g (running or not).
func (c *Cluster) Hosts(g replication.GroupID) map[replication.NodeID]replication.ReplicaID {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	out := make(map[replication.NodeID]replication.ReplicaID)
	for id, n := range c.nodes {
		if r, ok := n.replicas[g]; ok {
			out[id] = r
		}
	}
	return out
}

// AddReplica creates a new, empty replica of g on node (a fresh replica id,
// never used before) and starts it if the node runs. Nothing tells the group:
// that is the leader's conf change (Replace).
func (c *Cluster) AddReplica(g replication.GroupID, node replication.NodeID) (replication.ReplicaID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[node]
	if n == nil {
		return 0, fmt.Errorf("replicationtest: no node %d", node)
	}
	c.pmu.Lock()
	if r, ok := n.replicas[g]; ok {
		c.pmu.Unlock()
		return 0, fmt.Errorf("replicationtest: node %d already hosts replica %d of group %d", node, r, g)
	}
	r := c.nextReplica
	c.nextReplica++
	c.place[g][r] = node
	n.replicas[g] = r
	c.pmu.Unlock()
	c.Checker.newReplica(r, g)
	if err := n.Disk.CreateEmpty(g, r); err != nil {
		return 0, err
	}
	if n.engine != nil {
		st, applied, err := n.Disk.Open(g)
		if err != nil {
			return 0, err
		}
		if err := n.engine.AddGroup(c.groupConfig(n, g, r, st, applied)); err != nil {
			return 0, err
		}
	}
	return r, nil
}

// Replace moves a voter of g: a new replica on node replaces replica remove,
// through the current leader's ReplaceVoter (learner, catch-up, one joint
// change). It returns the new replica's id with ReplaceVoter's error.
func (c *Cluster) Replace(ctx context.Context, g replication.GroupID, node replication.NodeID, remove replication.ReplicaID) (replication.ReplicaID, error) {
	l := c.Leader(g)
	e := c.Engine(l)
	if l == 0 || e == nil {
		return 0, fmt.Errorf("replicationtest: group %d has no leader", g)
	}
	r, err := c.AddReplica(g, node)
	if err != nil {
		return 0, err
	}
	return r, e.ReplaceVoter(ctx, g, r, node, remove)
}

// Engine returns node id's running engine (nil while it is down).
func (c *Cluster) Engine(id replication.NodeID) *replication.Engine {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.nodes[id]; n != nil {
		return n.engine
	}
	return nil
}

// Up reports whether node id runs.
func (c *Cluster) Up(id replication.NodeID) bool { return c.Engine(id) != nil }

// Disk returns node id's disk.
func (c *Cluster) Disk(id replication.NodeID) *MemDisk {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id].Disk
}

// Crash kills the given running nodes at one instant (a power cut): they stop
// talking, then every one's pipeline stops (what it had not synced is lost),
// then their engines close.
func (c *Cluster) Crash(ids ...replication.NodeID) {
	c.mu.Lock()
	var victims []*Node
	for _, id := range ids {
		if n := c.nodes[id]; n.engine != nil {
			victims = append(victims, n)
		}
	}
	c.mu.Unlock()
	for _, n := range victims {
		c.Net.SetDown(n.ID, true)
	}
	for _, n := range victims {
		n.pipe.Crash()
	}
	for _, n := range victims {
		_ = n.engine.Close()
		if err := n.engine.Err(); err != nil {
			c.fail(err)
		}
		c.mu.Lock()
		n.engine, n.pipe = nil, nil
		c.mu.Unlock()
	}
}

// Restart starts a crashed node again from its disk.
func (c *Cluster) Restart(id replication.NodeID) error { return c.start(id) }

func (c *Cluster) fail(err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.mu.Unlock()
}

// Err returns every failure seen outside the checker: restart checks that
// failed, groups raft stopped (on running and crashed nodes).
func (c *Cluster) Err() error {
	c.mu.Lock()
	errs := append([]error(nil), c.errs...)
	for _, n := range c.nodes {
		if n.engine != nil {
			if err := n.engine.Err(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	c.mu.Unlock()
	return errors.Join(errs...)
}

// Leader returns a running node that believes it leads g (0 if none).
func (c *Cluster) Leader(g replication.GroupID) replication.NodeID {
	for _, id := range c.NodeIDs() {
		if e := c.Engine(id); e != nil {
			if st, err := e.Status(g); err == nil && st.IsLeader {
				return id
			}
		}
	}
	return 0
}

// WaitLeaders waits until every group has a leader on a running node.
func (c *Cluster) WaitLeaders(ctx context.Context) error {
	for {
		missing := 0
		for _, g := range c.GroupIDs() {
			if c.Leader(g) == 0 {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
			return fmt.Errorf("replicationtest: %d groups without a leader: %w", missing, err)
		}
	}
}

// Propose proposes payload to g, finding the leader and retrying while the
// attempt is known not written (no leader yet, a NotLeaderError), until ctx
// ends. It reports the outcome to the checker: an acknowledgement, or that
// the payload was not written. The last attempt's error is returned.
//
// Each payload must be unique in the cluster's life.
func (c *Cluster) Propose(ctx context.Context, g replication.GroupID, payload []byte) (replication.Result, error) {
	var lastErr error // every attempt so far was not written (or none was made)
	for {
		var id replication.NodeID
		var nle *replication.NotLeaderError
		if errors.As(lastErr, &nle) && nle.Leader != 0 && c.Up(nle.Leader) {
			id = nle.Leader
		}
		if id == 0 {
			id = c.Leader(g)
		}
		if e := c.Engine(id); id != 0 && e != nil {
			res, err := e.Propose(ctx, g, payload)
			switch {
			case err == nil:
				c.Checker.acked(g, payload, res)
				return res, nil
			case errors.Is(err, replication.ErrNotWritten):
				lastErr = err // nothing was written: retrying the same payload is safe
			default:
				return res, err // outcome unknown: retrying could write it twice
			}
		}
		if err := sleepCtx(ctx, time.Millisecond); err != nil {
			c.Checker.notWritten(payload)
			return replication.Result{}, fmt.Errorf("%w (last attempt: %v)", err, lastErr)
		}
	}
}

// Read runs ReadIndex for group g on node id (which must run and lead g)
// and reports a success to the checker, which checks that the read covers
// every proposal acknowledged before it was issued. It returns ReadIndex's
// answer.
func (c *Cluster) Read(ctx context.Context, id replication.NodeID, g replication.GroupID) (uint64, error) {
	e := c.Engine(id)
	if e == nil {
		return 0, fmt.Errorf("replicationtest: node %d is down", id)
	}
	start := c.Checker.readStart(g)
	idx, err := e.ReadIndex(ctx, g)
	if err != nil {
		return 0, err
	}
	st, err := e.Status(g)
	if err != nil {
		return 0, err
	}
	c.Checker.readDone(id, g, start, idx, st.Applied)
	return idx, nil
}

// ErrNoLease: LeaseRead found no valid lease on the node.
var ErrNoLease = errors.New("replicationtest: no lease")

// LeaseRead serves a read of group g on node id from its leader lease: if
// Engine.LeaseValid holds, the read sees node id's applied state, and the
// checker checks that it covers every proposal acknowledged before the read
// began (as for ReadIndex). It returns that applied index, or ErrNoLease.
func (c *Cluster) LeaseRead(id replication.NodeID, g replication.GroupID) (uint64, error) {
	e := c.Engine(id)
	if e == nil {
		return 0, fmt.Errorf("replicationtest: node %d is down", id)
	}
	start := c.Checker.readStart(g)
	if _, ok := e.LeaseValid(g); !ok {
		return 0, ErrNoLease
	}
	// The state machine is read after LeaseValid: applied only grows.
	st, err := e.Status(g)
	if err != nil {
		return 0, err
	}
	c.Checker.leaseReadDone(id, g, start, st.Applied)
	return st.Applied, nil
}

// clock returns node id's clock: time.Now() plus its skew (monotonic).
func (c *Cluster) clock(id replication.NodeID) func() time.Time {
	skew := c.skew[id]
	return func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
}

// SkewClock moves node id's clock by d (its lease and its heartbeat stamps;
// the engine's raft ticks keep real time).
func (c *Cluster) SkewClock(id replication.NodeID, d time.Duration) {
	c.skew[id].Add(int64(d))
}

// Partition cuts the links between sides (see Network.Partition).
func (c *Cluster) Partition(sides ...[]replication.NodeID) { c.Net.Partition(sides...) }

// Heal restores every link.
func (c *Cluster) Heal() { c.Net.Heal() }

// Close crashes every running node and stops the network.
func (c *Cluster) Close() {
	c.Crash(c.NodeIDs()...)
	c.Net.Close()
}

// WaitAcked waits until every acknowledged proposal is applied on a majority
// of the nodes (their disks' applied index reaches it; the checker already
// ties each index to one entry), then returns nil; or returns what is still
// missing when ctx ends.
func (c *Cluster) WaitAcked(ctx context.Context) error {
	for {
		missing := c.Checker.underReplicated(func(r replication.ReplicaID, g replication.GroupID) uint64 {
			c.pmu.Lock()
			n := c.nodes[c.place[g][r]]
			hosts := n != nil && n.replicas[g] == r
			c.pmu.Unlock()
			if !hosts {
				return 0
			}
			return n.Disk.Applied(g)
		})
		if missing == nil {
			return nil
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return missing
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
