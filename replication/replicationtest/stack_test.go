package replicationtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/internal/tcpproxy"
	"github.com/holdfast/holdfast/persistence"
	"github.com/holdfast/holdfast/replication"
)

// The whole replicated stack in one process, as a cluster node will wire it
// (design step 4): per node a replicated database, its persistence pipeline,
// the WAL pipeline, an engine over NetTransport and a TCP carrier (through a
// tcpproxy per directed link, which a test cuts), the heartbeat
// acknowledgements feeding the engine's lease, and an actors host over the
// node's Proposer that serves a partition only while its replica holds the
// lease (the host's Epoch is the term under a valid lease, else 0).

type stackNode struct {
	id      replication.NodeID
	db      *persistence.DB
	pp      *persistence.Pipeline
	wp      *replication.WALPipeline
	e       *replication.Engine
	tr      *replication.NetTransport
	carrier *replication.TCPCarrier
	host    *actors.Host
}

type stack struct {
	t       *testing.T
	groups  []replication.GroupID
	nodes   map[replication.NodeID]*stackNode
	proxies map[[2]replication.NodeID]*tcpproxy.Proxy
}

func newStack(t *testing.T, nodes, groups int) *stack {
	t.Helper()
	s := &stack{t: t, nodes: map[replication.NodeID]*stackNode{}, proxies: map[[2]replication.NodeID]*tcpproxy.Proxy{}}
	dirs := make([]string, nodes+1)
	for i := 1; i <= nodes; i++ {
		dirs[i] = t.TempDir() // before the cleanup that closes the nodes: removed after it
	}
	t.Cleanup(s.close)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for g := range groups {
		s.groups = append(s.groups, replication.GroupID(g))
	}
	cs := &raftpb.ConfState{}
	peers := map[replication.ReplicaID]replication.NodeID{}
	for i := 1; i <= nodes; i++ {
		cs.Voters = append(cs.Voters, uint64(i))
		peers[replication.ReplicaID(i)] = replication.NodeID(i)
	}
	const tick = 20 * time.Millisecond
	ctx := context.Background()
	for i := 1; i <= nodes; i++ {
		id := replication.NodeID(i)
		n := &stackNode{id: id}
		s.nodes[id] = n
		var err error
		if n.db, err = persistence.Open(persistence.Config{Dir: dirs[i], Partitions: groups, MemTableSize: 8 << 20, BlockCacheSize: 1 << 20, Logger: quiet, Replicated: true}); err != nil {
			t.Fatal(err)
		}
		n.pp = persistence.NewPipeline(n.db, persistence.PipelineConfig{Logger: quiet, ValueLogGCEvery: -1})
		n.pp.Start()
		n.wp = replication.NewWALPipeline(n.db, n.pp, replication.WALConfig{Logger: quiet})
		if n.carrier, err = replication.ListenTCP(replication.TCPConfig{Bind: "127.0.0.1:0", Timeout: 2 * time.Second, Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		onBeat := func(g replication.GroupID, from replication.ReplicaID, sent time.Time) {
			if e := n.e; e != nil { // set before the transport starts
				e.OnBeatAck(g, from, sent)
			}
		}
		if n.tr, err = replication.NewNetTransport(replication.NetConfig{Node: id, Storage: storageOf(id), BeatInterval: tick / 2, OnBeatAck: onBeat, Logger: quiet}, n.carrier); err != nil {
			t.Fatal(err)
		}
		n.carrier.SetHandler(n.tr.HandleFrame)
		if n.e, err = replication.New(replication.Config{Node: id, TickInterval: tick, ElectionTick: 10, Logger: quiet}, n.tr, n.wp); err != nil {
			t.Fatal(err)
		}
		for _, g := range s.groups {
			if err := n.wp.Bootstrap(ctx, g, replication.ReplicaID(id), cs); err != nil {
				t.Fatal(err)
			}
			st, applied, err := n.wp.Storage(g, replication.ReplicaID(id))
			if err != nil {
				t.Fatal(err)
			}
			if err := n.e.AddGroup(replication.GroupConfig{ID: g, Replica: replication.ReplicaID(id), Peers: peers, Storage: st, Applied: applied}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for a := range s.nodes {
		for b, nb := range s.nodes {
			if a == b {
				continue
			}
			px, err := tcpproxy.Start(nb.carrier.Addr())
			if err != nil {
				t.Fatal(err)
			}
			s.proxies[[2]replication.NodeID{a, b}] = px
			s.nodes[a].carrier.SetAddr(b, px.Addr())
			s.nodes[a].tr.SetPeer(b, storageOf(b))
		}
	}
	for _, n := range s.nodes {
		if err := n.tr.Start(n.e); err != nil {
			t.Fatal(err)
		}
		if err := n.e.Start(); err != nil {
			t.Fatal(err)
		}
		e := n.e
		epoch := func(p uint32) uint64 {
			if term, ok := e.LeaseValid(replication.GroupID(p)); ok {
				return term
			}
			return 0
		}
		n.host = actors.NewHost(n.db, replication.NewProposer(e, n.pp), actors.Config{
			Epoch: epoch,
			Partitions: func() []uint32 {
				var out []uint32
				for _, g := range s.groups {
					if epoch(uint32(g)) != 0 {
						out = append(out, uint32(g))
					}
				}
				return out
			},
			Logger: quiet,
		})
		n.host.Start()
	}
	return s
}

func (s *stack) close() {
	for _, n := range s.nodes {
		if n.host != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = n.host.Close(ctx)
			cancel()
		}
		if n.e != nil {
			_ = n.e.Close()
		}
		if n.tr != nil {
			_ = n.tr.Close()
		}
		if n.carrier != nil {
			_ = n.carrier.Close()
		}
		if n.wp != nil {
			n.wp.Close()
		}
		if n.pp != nil {
			n.pp.Close()
		}
		if n.db != nil {
			_ = n.db.Close()
		}
	}
	for _, px := range s.proxies {
		_ = px.Close()
	}
}

// isolate cuts (or heals) every link to and from node id.
func (s *stack) isolate(id replication.NodeID, cut bool) {
	for k, px := range s.proxies {
		if k[0] == id || k[1] == id {
			if cut {
				px.Block()
			} else {
				px.Unblock()
			}
		}
	}
}

// leaseHolders returns the nodes whose replica of g holds the lease now.
func (s *stack) leaseHolders(g replication.GroupID) []replication.NodeID {
	var out []replication.NodeID
	for id, n := range s.nodes {
		if _, ok := n.e.LeaseValid(g); ok {
			out = append(out, id)
		}
	}
	return out
}

// leadAll moves every group's leadership to node to and waits for its lease.
func (s *stack) leadAll(ctx context.Context, to replication.NodeID) error {
	for _, g := range s.groups {
		for {
			if holders := s.leaseHolders(g); len(holders) == 1 && holders[0] == to {
				break
			}
			for _, n := range s.nodes {
				if st, err := n.e.Status(g); err == nil && st.IsLeader && n.id != to {
					tctx, tcancel := context.WithTimeout(ctx, time.Second)
					_ = n.e.TransferLeader(tctx, g, replication.ReplicaID(to)) // checked by the lease above
					tcancel()
				}
			}
			if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
				var sb strings.Builder
				for id, n := range s.nodes {
					st, _ := n.e.Status(g)
					term, ok := n.e.LeaseValid(g)
					fmt.Fprintf(&sb, " [node %d: leader %v term %d lead %d applied %d lease %v/%d]", id, st.IsLeader, st.Term, st.Leader, st.Applied, ok, term)
				}
				return fmt.Errorf("group %d: node %d never held the lease:%s: %w", g, to, sb.String(), err)
			}
		}
	}
	return nil
}

// TestStack_ACutOffLeaderStopsServingBeforeTheMajorityServes: KV objects on
// three nodes over real TCP. The node leading every partition is cut off
// from the others: its lease lapses and its host stops serving before any
// other node holds a lease (at no moment do two nodes hold one for a
// partition); the majority elects a leader and serves every object with
// every acknowledged increment; the writes the cut-off node took after the
// cut are never acknowledged and never appear, also once the links heal.
func TestStack_ACutOffLeaderStopsServingBeforeTheMajorityServes(t *testing.T) {
	s := newStack(t, 3, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.leadAll(ctx, 1); err != nil {
		t.Fatal(err)
	}
	ids := []actors.ObjectID{}
	for i := range 6 {
		ids = append(ids, actors.ObjectID{App: "app_t", Type: "counter", Key: fmt.Sprintf("k%d", i)})
	}
	acked := map[actors.ObjectID]int{}
	write := func(h *actors.Host, id actors.ObjectID, key string, timeout time.Duration) error {
		wctx, wcancel := context.WithTimeout(ctx, timeout)
		defer wcancel()
		w := &actors.KVWrite{Route: actors.RouteIncrement, Ops: []actors.Op{{Op: "increment", Key: "n"}}, IdempotencyKey: key}
		_, err := actors.NewKV(h, id).Write(wctx, w)
		return err
	}
	// retried keeps trying f while it fails as unavailable (a leadership
	// or lease moving under it), for at most 10 s.
	retried := func(f func() error) error {
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := f()
			var ae *actors.Error
			if err == nil || !errors.As(err, &ae) || ae.Kind != actors.KindUnavailable || time.Now().After(deadline) {
				return err
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for round := range 5 {
		for _, id := range ids {
			if err := retried(func() error { return write(s.nodes[1].host, id, fmt.Sprintf("%s-%d", id.Key, round), 10*time.Second) }); err != nil {
				t.Fatalf("%v before the cut: %v", id, err)
			}
			acked[id]++
		}
	}

	// Cut node 1 off, then keep writing to it: it still leads until its
	// lease lapses, so it proposes them, but it can commit none. Watch who
	// holds leases meanwhile.
	s.isolate(1, true)
	cutAt := time.Now()
	var lateAcks atomic.Int64
	var wg sync.WaitGroup
	stopWriting := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stopWriting:
				return
			default:
			}
			id := ids[i%len(ids)]
			if write(s.nodes[1].host, id, fmt.Sprintf("%s-cut-%d", id.Key, i), 300*time.Millisecond) == nil {
				lateAcks.Add(1)
			}
		}
	})
	var lapsed, served time.Duration
	for lapsed == 0 || served == 0 {
		if ctx.Err() != nil {
			t.Fatalf("after the cut: node 1's lease lapsed after %v, another node served after %v", lapsed, served)
		}
		for _, g := range s.groups {
			holders := s.leaseHolders(g)
			if len(holders) > 1 {
				t.Fatalf("group %d: nodes %v hold the lease at once, %v after the cut", g, holders, time.Since(cutAt))
			}
			if lapsed == 0 && len(holders) == 0 {
				lapsed = time.Since(cutAt)
			}
			if len(holders) == 1 && holders[0] != 1 && served == 0 {
				served = time.Since(cutAt)
			}
		}
		time.Sleep(time.Millisecond)
	}
	close(stopWriting)
	wg.Wait()
	if lapsed >= served {
		t.Fatalf("node 1's lease lapsed %v after the cut, another node held one after %v", lapsed, served)
	}
	t.Logf("node 1's lease lapsed %v after the cut; another node held one %v after it", lapsed, served)
	if n := lateAcks.Load(); n > 0 {
		t.Fatalf("node 1, cut off from the majority, acknowledged %d writes", n)
	}

	// The majority serves every object with every acknowledged increment.
	if err := s.leadAll(ctx, 2); err != nil {
		t.Fatal(err)
	}
	check := func(h *actors.Host, extra int) {
		t.Helper()
		for _, id := range ids {
			var raw []byte
			err := retried(func() (err error) { raw, err = actors.NewKV(h, id).GetSlot(ctx, "n"); return err })
			if err != nil {
				t.Fatalf("%v: %v", id, err)
			}
			if want := fmt.Sprint(acked[id] + extra); string(raw) != want {
				t.Fatalf("%v = %s, want %s (the acknowledged increments)", id, raw, want)
			}
		}
	}
	check(s.nodes[2].host, 0)
	// Healed: node 1 follows and its unacknowledged writes never appear.
	s.isolate(1, false)
	for _, id := range ids {
		if err := retried(func() error { return write(s.nodes[2].host, id, id.Key+"-healed", 10*time.Second) }); err != nil {
			t.Fatalf("%v after the heal: %v", id, err)
		}
	}
	if err := s.leadAll(ctx, 1); err != nil {
		t.Fatal(err)
	}
	check(s.nodes[1].host, 1)
	var ae *actors.Error
	if _, err := actors.NewKV(s.nodes[3].host, ids[0]).GetSlot(ctx, "n"); !errors.As(err, &ae) || ae.Kind != actors.KindUnavailable {
		t.Fatalf("a read on a follower: %v, want unavailable (it holds no lease)", err)
	}
}

func storageOf(id replication.NodeID) string { return fmt.Sprintf("storage-%02d", id) }
