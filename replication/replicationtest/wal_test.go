package replicationtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"slices"
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
// log must give raft back exactly what it acknowledged as durable. Entries
// are applied into Badger by the persistence applier; a restart applies again
// every committed entry the log holds (the checker allows that, and checks
// each is the entry applied there before).

type walNode struct {
	id      replication.NodeID
	dir     string
	applied map[replication.GroupID]uint64 // survives crashes
	booted  bool                           // the groups' logs are bootstrapped

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
	wcfg    replication.WALConfig // the WAL pipelines' (Observe and Logger set per node)
	quiet   *slog.Logger

	mu     sync.Mutex
	nodes  map[replication.NodeID]*walNode
	moveMu sync.Mutex // one leadAll at a time
}

// newWALChecker is the checker of a WAL cluster: every node a voter (replica
// id = node id), the log bootstrapped at index 1 (WALPipeline.Bootstrap).
func newWALChecker(nodes int) *Checker {
	cs := &raftpb.ConfState{}
	for i := 1; i <= nodes; i++ {
		cs.Voters = append(cs.Voters, uint64(i))
	}
	return newChecker(nodes, cs)
}

func newWALCluster(t *testing.T, nodes, groups int, seed uint64, opts ...func(*walCluster)) *walCluster {
	c := &walCluster{
		t:       t,
		net:     NewNetwork(seed),
		checker: newWALChecker(nodes),
		quiet:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		nodes:   map[replication.NodeID]*walNode{},
	}
	c.ecfg = replication.Config{TickInterval: 2 * time.Millisecond, ElectionTick: 10, Workers: 2, Logger: c.quiet}
	c.wcfg.KeepEntries = 20 // truncate often (flushBadgers makes Badger flush)
	for g := range groups { // group = partition, 0..groups-1
		c.groups = append(c.groups, replication.GroupID(g))
	}
	for i := 1; i <= nodes; i++ {
		c.voters = append(c.voters, uint64(i))
		id := replication.NodeID(i)
		c.nodes[id] = &walNode{id: id, dir: t.TempDir(), applied: map[replication.GroupID]uint64{}}
	}
	for _, o := range opts {
		o(c)
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
	db, err := persistence.Open(persistence.Config{Dir: n.dir, Partitions: len(c.groups), SegmentSize: 64 << 10, MemTableSize: 8 << 20, BlockCacheSize: 1 << 20, ValueLogFileSize: 1 << 20, Logger: c.quiet, Replicated: true})
	if err != nil {
		return fmt.Errorf("node %d: open: %w", id, err)
	}
	pp := persistence.NewPipeline(db, persistence.PipelineConfig{Logger: c.quiet, ValueLogGCEvery: -1})
	pp.Start()
	wcfg := c.wcfg
	wcfg.Observe = func(g replication.GroupID, ent *raftpb.Entry) { c.checker.appliedEntry(id, g, ent) }
	wcfg.OnSnapshot = func(g replication.GroupID, idx, term uint64, _ *raftpb.ConfState) {
		c.checker.installedWAL(id, g, idx, term)
	}
	wcfg.Logger = c.quiet
	wp := replication.NewWALPipeline(db, pp, wcfg)
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
	for _, g := range c.groups {
		if !n.booted {
			if err := wp.Bootstrap(context.Background(), g, replication.ReplicaID(id), &raftpb.ConfState{Voters: c.voters}); err != nil {
				return fmt.Errorf("node %d: %w", id, err)
			}
		}
		st, applied, err := wp.Storage(g, replication.ReplicaID(id))
		if err != nil {
			return fmt.Errorf("node %d restart: %w", id, err)
		}
		c.checker.restarted(id, g, applied)
		if err := e.AddGroup(replication.GroupConfig{ID: g, Replica: replication.ReplicaID(id), Peers: peers, Storage: st, Applied: applied}); err != nil {
			return err
		}
	}
	if err := e.Start(); err != nil {
		return err
	}
	n.db, n.pp, n.wp, n.e, n.booted = db, pp, wp, e, true
	c.net.SetSnapshots(id, wp, wp) // as NetTransport streams them
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

// flushBadgers has every running node's Badger flush its memtables every
// 20 ms until ctx ends, so that their logs get truncated.
func (c *walCluster) flushBadgers(ctx context.Context) {
	for sleepCtx(ctx, 20*time.Millisecond) == nil {
		c.mu.Lock()
		var pps []*persistence.Pipeline
		for _, n := range c.nodes {
			if n.pp != nil {
				pps = append(pps, n.pp)
			}
		}
		c.mu.Unlock()
		for _, pp := range pps {
			_ = pp.Flush() // ErrClosed when the node crashed meanwhile
		}
	}
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
					c.propose(pctx, g, walPayload(g, next.Add(1)))
					pcancel()
				}
			})
		}
	}
	wg.Go(func() { c.flushBadgers(ctx) })
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
	// Badger holds every acknowledged write on a majority: the applier wrote
	// the entries' changes (on a restarted node, again from its log).
	for _, payload := range c.checker.ackedPayloads() {
		key := walPayloadKey(t, payload)
		holders := 0
		for id := range c.nodes {
			c.mu.Lock()
			db := c.nodes[id].db
			c.mu.Unlock()
			if _, found, err := db.Get(context.Background(), key); err != nil {
				t.Fatal(err)
			} else if found {
				holders++
			}
		}
		if holders < 2 {
			t.Fatalf("acknowledged write %q is in Badger on %d of 3 nodes", key, holders)
		}
	}
	// The logs were truncated (so restarts began past index 1 with the
	// configuration the truncation recorded) while every node restarted.
	truncated := 0
	for id := range c.nodes {
		c.mu.Lock()
		db := c.nodes[id].db
		c.mu.Unlock()
		for _, g := range c.groups {
			if first, _ := db.RaftStorage(uint64(g), uint64(id), nil).FirstIndex(); first > 1 {
				truncated++
			}
		}
	}
	if truncated == 0 {
		t.Fatal("no replica's log was truncated: the test did not exercise truncation")
	}
	if c.checker.Acked() < 20 {
		t.Fatalf("only %d proposals acknowledged: the test did not exercise the log", c.checker.Acked())
	}
	t.Logf("%d proposals acknowledged, %d snapshots installed", c.checker.Acked(), c.checker.Installs())
}

// walPayload is a proposal's payload: one write, as the applier takes it
// (persistence.AppendChanges), of a key of g's partition unique to n (a
// snapshot carries the partition's keys).
func walPayload(g replication.GroupID, n uint64) []byte {
	key := fmt.Appendf(persistence.PartitionPrefix(uint32(g)), "g%d-%d", g, n)
	return persistence.AppendChanges(nil, &persistence.Write{Sets: []persistence.KV{{Key: key, Value: []byte("v")}}})
}

// walPayloadKey is the key walPayload wrote into payload.
func walPayloadKey(t *testing.T, payload []byte) []byte {
	t.Helper()
	key := walKeyRE.Find(payload)
	if key == nil {
		t.Fatalf("payload %q holds no key", payload)
	}
	return key
}

var walKeyRE = regexp.MustCompile(`(?s)p..g[0-9]+-[0-9]+`)

// TestWALStorage_AnIdleGroupDoesNotHoldTheLog: a group that stops taking
// writes keeps its last entries (KeepEntries is far above what it has), and
// so the segment that holds them, while another group fills the log; past
// the log's budget the pipeline flushes Badger and truncates the replicas
// that keep the oldest segment, and the log stays near its budget.
func TestWALStorage_AnIdleGroupDoesNotHoldTheLog(t *testing.T) {
	const budget = 6
	c := newWALCluster(t, 1, 2, uint64(time.Now().UnixNano()), func(c *walCluster) {
		c.wcfg.KeepEntries = 1 << 30 // never by the keep rule: only the budget truncates
		c.wcfg.MaxLogSegments = budget
		c.wcfg.BudgetEvery = 20 * time.Millisecond
	})
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	idle, busy := c.groups[0], c.groups[1]
	c.leaderOf(t, idle)
	c.leaderOf(t, busy)
	e := c.engine(1)
	pad := string(make([]byte, 1000))
	propose := func(g replication.GroupID, i int) {
		t.Helper()
		w := &persistence.Write{Sets: []persistence.KV{{Key: fmt.Appendf(nil, "p/%d-%d", g, i), Value: []byte(pad)}}}
		if _, err := e.Propose(ctx, g, persistence.AppendChanges(nil, w)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 30 {
		propose(idle, i)
	}
	c.mu.Lock()
	db := c.nodes[1].db
	c.mu.Unlock()
	peak := 0
	for i := 0; ; i++ {
		propose(busy, i)
		_, segs := db.RaftPinners()
		peak = max(peak, segs)
		first, _ := db.RaftStorage(uint64(idle), 1, nil).FirstIndex()
		if i >= 1000 && first > 1 && segs <= budget+2 {
			t.Logf("after %d writes: %d segments (peak %d), the idle group's log starts at %d", i+1, segs, peak, first)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("after %d writes: %d segments (budget %d), the idle group's log starts at %d", i+1, segs, budget, first)
		}
	}
	if peak <= budget {
		t.Fatalf("the log never passed its budget (peak %d segments): the test shows nothing", peak)
	}
}

// TestWALStorage_AConfChangeIsTheRestartPointsConfiguration: a replica
// removed by a conf change stays removed for replicas that restart from a
// log truncated past the change: the truncation records the configuration
// after it (WALPipeline tracks it with NextConfState), not the bootstrap's.
func TestWALStorage_AConfChangeIsTheRestartPointsConfiguration(t *testing.T) {
	c := newWALCluster(t, 3, 1, uint64(time.Now().UnixNano()))
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g := c.groups[0]
	c.leadAll(t, 1)
	var res replication.Result
	for {
		// A new leader takes no conf change until it applied its first entry.
		var err error
		res, err = c.engine(1).ProposeConfChange(ctx, g, &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: new(uint64(3))}}})
		if err == nil {
			break
		}
		if !errors.Is(err, replication.ErrNotWritten) || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	fctx, fcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { c.flushBadgers(fctx) })
	truncatedPast := func(id replication.NodeID) bool {
		c.mu.Lock()
		db := c.nodes[id].db
		c.mu.Unlock()
		first, _ := db.RaftStorage(uint64(g), uint64(id), nil).FirstIndex()
		return first > res.Index+1
	}
	for i := 0; !truncatedPast(1) || !truncatedPast(2); i++ {
		if ctx.Err() != nil {
			t.Fatal("the logs were not truncated past the conf change")
		}
		c.propose(ctx, g, walPayload(g, uint64(i)))
	}
	fcancel()
	wg.Wait()
	c.crash(3) // removed: it does not come back
	for _, id := range []replication.NodeID{1, 2} {
		c.crash(id)
		if err := c.start(id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []replication.NodeID{1, 2} {
		cs, _, err := c.engine(id).Membership(g)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cs.GetVoters(), []uint64{1, 2}) {
			t.Fatalf("node %d restarted with voters %v, want [1 2] (replica 3 was removed at index %d)", id, cs.GetVoters(), res.Index)
		}
	}
	c.propose(ctx, g, walPayload(g, 1<<40)) // the two take writes
	if c.checker.Acked() == 0 {
		t.Fatal("nothing acknowledged")
	}
	if err := c.checker.Err(); err != nil {
		t.Fatal(err)
	}
}
