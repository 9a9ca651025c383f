package replication_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/internal/tcpproxy"
	"github.com/holdfast/holdfast/replication"
	"github.com/holdfast/holdfast/replication/replicationtest"
)

// netCluster is N engines x G groups in one process talking over real TCP
// connections on 127.0.0.1: each engine has a NetTransport over a TCPCarrier,
// and every directed link i->j goes through its own tcpproxy, so a link can
// be cut and healed.
type netCluster struct {
	t       *testing.T
	n       int
	groups  int
	nodes   []*netNode // index = node id (0 unused)
	proxies map[[2]replication.NodeID]*tcpproxy.Proxy

	mu      sync.Mutex
	applied map[[2]uint64]map[uint64]string // (node, group) -> index -> payload
	byIndex map[[2]uint64]string            // (group, index) -> payload: one entry per index
	errs    []error
}

type netNode struct {
	id      replication.NodeID
	disk    *replicationtest.MemDisk
	pipe    *replicationtest.MemPipeline
	engine  *replication.Engine
	tr      *replication.NetTransport
	carrier *replication.TCPCarrier
}

type netOptions struct {
	nodes, groups int
	tick          time.Duration
	electionTick  int
}

func newNetCluster(t *testing.T, o netOptions) *netCluster {
	t.Helper()
	if o.tick == 0 {
		o.tick = 20 * time.Millisecond
	}
	c := &netCluster{t: t, n: o.nodes, groups: o.groups, proxies: map[[2]replication.NodeID]*tcpproxy.Proxy{},
		applied: map[[2]uint64]map[uint64]string{}, byIndex: map[[2]uint64]string{}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	voters := make([]replication.ReplicaID, o.nodes)
	peers := map[replication.ReplicaID]replication.NodeID{}
	for i := range voters {
		voters[i] = replication.ReplicaID(i + 1)
		peers[voters[i]] = replication.NodeID(i + 1)
	}
	c.nodes = make([]*netNode, o.nodes+1)
	t.Cleanup(c.close)
	for i := 1; i <= o.nodes; i++ {
		id := replication.NodeID(i)
		nd := &netNode{id: id, disk: replicationtest.NewMemDisk()}
		c.nodes[i] = nd
		var err error
		if nd.carrier, err = replication.ListenTCP(replication.TCPConfig{Bind: "127.0.0.1:0", Timeout: 2 * time.Second, Logger: log}); err != nil {
			t.Fatal(err)
		}
		if nd.tr, err = replication.NewNetTransport(replication.NetConfig{Node: id, Storage: storageOf(id), BeatInterval: o.tick / 2, Logger: log}, nd.carrier); err != nil {
			t.Fatal(err)
		}
		nd.carrier.SetHandler(nd.tr.HandleFrame)
		nd.pipe = replicationtest.NewMemPipeline(nd.disk, func(g replication.GroupID, ent *raftpb.Entry) { c.onApply(id, g, ent) }, 0)
		if nd.engine, err = replication.New(replication.Config{Node: id, TickInterval: o.tick, ElectionTick: o.electionTick, Logger: log}, nd.tr, nd.pipe); err != nil {
			t.Fatal(err)
		}
		for g := 1; g <= o.groups; g++ {
			if err := nd.disk.Bootstrap(replication.GroupID(g), voters); err != nil {
				t.Fatal(err)
			}
			st, applied, err := nd.disk.Open(replication.GroupID(g))
			if err != nil {
				t.Fatal(err)
			}
			if err := nd.engine.AddGroup(replication.GroupConfig{ID: replication.GroupID(g), Replica: replication.ReplicaID(i), Peers: peers, Storage: st, Applied: applied}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// One proxy per directed link, in front of the receiver's carrier.
	for i := 1; i <= o.nodes; i++ {
		for j := 1; j <= o.nodes; j++ {
			if i == j {
				continue
			}
			px, err := tcpproxy.Start(c.nodes[j].carrier.Addr())
			if err != nil {
				t.Fatal(err)
			}
			c.proxies[[2]replication.NodeID{replication.NodeID(i), replication.NodeID(j)}] = px
			c.nodes[i].carrier.SetAddr(replication.NodeID(j), px.Addr())
			c.nodes[i].tr.SetPeer(replication.NodeID(j), storageOf(replication.NodeID(j)))
		}
	}
	for _, nd := range c.nodes[1:] {
		nd.pipe.Start()
		if err := nd.tr.Start(nd.engine); err != nil {
			t.Fatal(err)
		}
		if err := nd.engine.Start(); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func storageOf(id replication.NodeID) string { return fmt.Sprintf("storage-%02d", id) }

func (c *netCluster) close() {
	for _, nd := range c.nodes {
		if nd == nil {
			continue
		}
		if nd.engine != nil {
			_ = nd.engine.Close()
		}
		if nd.tr != nil {
			_ = nd.tr.Close()
		}
		if nd.carrier != nil {
			_ = nd.carrier.Close()
		}
		if nd.pipe != nil {
			nd.pipe.Close()
		}
	}
	for _, px := range c.proxies {
		px.Close()
	}
}

// onApply records what each node applies and checks that no two nodes apply
// different entries at one index of a group.
func (c *netCluster) onApply(n replication.NodeID, g replication.GroupID, ent *raftpb.Entry) {
	_, payload, ok, _ := replication.DecodeEntry(ent.GetData())
	if !ok {
		return // raft's own empty entries
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	key := [2]uint64{uint64(g), ent.GetIndex()}
	if prev, seen := c.byIndex[key]; seen && prev != string(payload) {
		c.errs = append(c.errs, fmt.Errorf("group %d index %d: node %d applied %q, another node %q", g, ent.GetIndex(), n, payload, prev))
	}
	c.byIndex[key] = string(payload)
	nk := [2]uint64{uint64(n), uint64(g)}
	if c.applied[nk] == nil {
		c.applied[nk] = map[uint64]string{}
	}
	c.applied[nk][ent.GetIndex()] = string(payload)
}

func (c *netCluster) check() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, err := range c.errs {
		c.t.Error(err)
	}
	for _, nd := range c.nodes[1:] {
		if err := nd.engine.Err(); err != nil {
			c.t.Error(err)
		}
	}
}

// cut cuts (or heals) both directions of the link between a and b.
func (c *netCluster) cut(a, b replication.NodeID, cut bool) {
	for _, k := range [][2]replication.NodeID{{a, b}, {b, a}} {
		if cut {
			c.proxies[k].Block()
		} else {
			c.proxies[k].Unblock()
		}
	}
}

// leader returns the node that leads g in the view of the given nodes (any
// node if none given), 0 if none.
func (c *netCluster) leader(g replication.GroupID, among ...replication.NodeID) replication.NodeID {
	if len(among) == 0 {
		for i := 1; i <= c.n; i++ {
			among = append(among, replication.NodeID(i))
		}
	}
	for _, id := range among {
		if st, err := c.nodes[id].engine.Status(g); err == nil && st.IsLeader {
			return id
		}
	}
	return 0
}

// waitLeaders waits until every group has a leader among the given nodes.
func (c *netCluster) waitLeaders(ctx context.Context, among ...replication.NodeID) {
	c.t.Helper()
	for {
		missing := 0
		for g := 1; g <= c.groups; g++ {
			if c.leader(replication.GroupID(g), among...) == 0 {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if ctx.Err() != nil {
			c.t.Fatalf("%d of %d groups have no leader among nodes %v", missing, c.groups, among)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// propose proposes payload to g through whichever of the given nodes leads it,
// retrying while it is not written, until ctx ends.
func (c *netCluster) propose(ctx context.Context, g replication.GroupID, payload string, among ...replication.NodeID) (replication.Result, error) {
	for {
		if id := c.leader(g, among...); id != 0 {
			res, err := c.nodes[id].engine.Propose(ctx, g, []byte(payload))
			if err == nil {
				return res, nil
			}
			if ctx.Err() != nil {
				return res, err
			}
		}
		select {
		case <-ctx.Done():
			return replication.Result{}, fmt.Errorf("group %d %q: %w", g, payload, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// proposeAll proposes one payload per group (prefix-g) concurrently.
func (c *netCluster) proposeAll(ctx context.Context, prefix string, among ...replication.NodeID) {
	c.t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, c.groups)
	for g := 1; g <= c.groups; g++ {
		wg.Go(func() {
			if _, err := c.propose(ctx, replication.GroupID(g), fmt.Sprintf("%s-%d", prefix, g), among...); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		c.t.Fatal(err)
	}
}

// waitApplied waits until each of the given nodes applied payload prefix-g in
// every group g.
func (c *netCluster) waitApplied(ctx context.Context, prefix string, nodes ...replication.NodeID) {
	c.t.Helper()
	for {
		missing := 0
		c.mu.Lock()
		for _, n := range nodes {
			for g := 1; g <= c.groups; g++ {
				found := false
				for _, p := range c.applied[[2]uint64{uint64(n), uint64(g)}] {
					if p == fmt.Sprintf("%s-%d", prefix, g) {
						found = true
						break
					}
				}
				if !found {
					missing++
				}
			}
		}
		c.mu.Unlock()
		if missing == 0 {
			return
		}
		if ctx.Err() != nil {
			c.t.Fatalf("%q: %d (node, group) pairs did not apply it", prefix, missing)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestNet_ElectReplicateCutHeal: 3 engines x 32 groups over TCP through a
// proxy per link elect leaders and replicate to every replica; with the link
// between nodes 1 and 2 cut, every group still commits (through node 3); once
// healed, nodes 1 and 2 catch up on what they missed.
func TestNet_ElectReplicateCutHeal(t *testing.T) {
	c := newNetCluster(t, netOptions{nodes: 3, groups: 32})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	all := []replication.NodeID{1, 2, 3}
	c.waitLeaders(ctx)
	c.proposeAll(ctx, "first")
	c.waitApplied(ctx, "first", all...)

	c.cut(1, 2, true)
	c.proposeAll(ctx, "cut")
	c.waitApplied(ctx, "cut", 3) // node 3 is in every majority now
	c.cut(1, 2, false)
	c.waitApplied(ctx, "cut", all...)
	c.proposeAll(ctx, "healed")
	c.waitApplied(ctx, "healed", all...)
	c.check()
	var sent uint64
	for _, nd := range c.nodes[1:] {
		st := nd.tr.Stats()
		sent += st.Frames
		t.Logf("node %d: %+v", nd.id, st)
	}
	if sent == 0 {
		t.Fatal("no frame was sent")
	}
}

// TestNet_LeaderCutOff: the node leading group 1 is cut off from both others:
// the majority side elects leaders for every group and commits; on heal the
// cut-off node catches up and no index holds two entries.
func TestNet_LeaderCutOff(t *testing.T) {
	c := newNetCluster(t, netOptions{nodes: 3, groups: 32})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.waitLeaders(ctx)
	old := c.leader(1)
	var rest []replication.NodeID
	for i := replication.NodeID(1); i <= 3; i++ {
		if i != old {
			rest = append(rest, i)
		}
	}
	c.cut(old, rest[0], true)
	c.cut(old, rest[1], true)
	c.waitLeaders(ctx, rest...)
	c.proposeAll(ctx, "majority", rest...)
	c.waitApplied(ctx, "majority", rest...)
	// CheckQuorum: the cut-off node steps down within an election timeout.
	for {
		leads := 0
		for g := 1; g <= c.groups; g++ {
			if st, _ := c.nodes[old].engine.Status(replication.GroupID(g)); st.IsLeader {
				leads++
			}
		}
		if leads == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the cut-off node still leads %d groups", leads)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.cut(old, rest[0], false)
	c.cut(old, rest[1], false)
	c.waitApplied(ctx, "majority", old)
	c.check()
}

// TestNet_BeatsCoalesced: 3 nodes x 256 idle groups. Once leaders are elected
// and the groups are quiet, the frames between the nodes per beat interval
// are bounded by the node pairs (6 directed links), not by the groups, while
// every group's heartbeats still flow.
func TestNet_BeatsCoalesced(t *testing.T) {
	const groups = 256
	tick := 20 * time.Millisecond
	c := newNetCluster(t, netOptions{nodes: 3, groups: groups, tick: tick, electionTick: 25})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.waitLeaders(ctx)
	// Quiet: every replica applied raft's empty entry of its leader's term.
	c.proposeAll(ctx, "settle")
	c.waitApplied(ctx, "settle", 1, 2, 3)
	stats := func() (frames, beats, msgs uint64) {
		for _, nd := range c.nodes[1:] {
			st := nd.tr.Stats()
			frames += st.Frames
			beats += st.BeatsIn
			msgs += st.MessagesOut
		}
		return frames, beats, msgs
	}
	// A window that saw an election or pre-votes (a loaded machine stalls
	// long enough for a follower to campaign) has real messages in it: such a
	// window is measured again, up to 5 times. Without coalescing, every
	// window has thousands of heartbeat messages and no beats.
	terms := func() (sum uint64) {
		for _, nd := range c.nodes[1:] {
			for g := 1; g <= groups; g++ {
				st, _ := nd.engine.Status(replication.GroupID(g))
				sum += st.Term
			}
		}
		return sum
	}
	for attempt := 1; ; attempt++ {
		term0 := terms()
		f0, b0, m0 := stats()
		start := time.Now()
		time.Sleep(10 * tick) // a measuring window, not a synchronisation
		f1, b1, m1 := stats()
		elapsed := time.Since(start)
		intervals := uint64(elapsed/(tick/2)) + 2
		frames, beats, msgs := f1-f0, b1-b0, m1-m0
		t.Logf("%v (%d beat intervals): %d frames, %d beats received, %d messages sent", elapsed, intervals, frames, beats, msgs)
		frameLimit := 6*intervals + 32
		// Each of 256 groups' leaders heartbeats 2 followers every tick, and
		// each answers: about 1024 beats per tick, as beats, not messages.
		ok := beats >= groups && msgs <= groups/2 && frames <= frameLimit
		if ok && terms() == term0 {
			break
		}
		if attempt < 5 {
			t.Logf("a busy window (term changed: %v); measuring again", terms() != term0)
			continue
		}
		if beats < groups {
			t.Fatalf("only %d beats in %v: heartbeats do not flow as beats", beats, elapsed)
		}
		if msgs > groups/2 {
			t.Fatalf("%d raft messages in %v of idle groups: heartbeats travel as messages", msgs, elapsed)
		}
		if frames > frameLimit {
			t.Fatalf("%d frames in %d beat intervals for 6 directed links (limit %d): not coalesced per node pair", frames, intervals, frameLimit)
		}
		break // five windows with elections, but each coalesced
	}
	c.check()
}
