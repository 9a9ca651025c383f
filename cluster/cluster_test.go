package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/internal/devetcd"
)

// The in-process tier: several nodes and an embedded etcd in one test process.

const testPartitions = 16

type testCluster struct {
	t     *testing.T
	etcd  *devetcd.Server
	name  string
	dirs  map[string]string
	mu    sync.Mutex
	nodes map[string]*Node
	check *ownership
}

func newTestCluster(t *testing.T) *testCluster {
	t.Helper()
	e, err := devetcd.Start(devetcd.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{t: t, etcd: e, name: "test", dirs: map[string]string{}, nodes: map[string]*Node{}, check: newOwnership()}
	t.Cleanup(func() {
		tc.mu.Lock()
		nodes := tc.nodes
		tc.nodes = map[string]*Node{}
		tc.mu.Unlock()
		for _, n := range nodes {
			n.member.stop(true)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			n.ready.Store(false)
			_ = n.host.Close(ctx)
			n.pipe.Close()
			_ = n.db.Close()
			cancel()
		}
		e.Close()
	})
	return tc
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("HOLDFAST_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// start starts node id (again, with its data directory, if it ran before).
func (tc *testCluster) start(id string) *Node {
	tc.t.Helper()
	dir, ok := tc.dirs[id]
	if !ok {
		dir = filepath.Join(tc.t.TempDir(), id)
		tc.dirs[id] = dir
	}
	n, err := Start(Config{
		DataDir: dir, Partitions: testPartitions, IdleTimeout: time.Minute, Logger: testLogger(tc.t),
		Cluster: &ClusterConfig{Name: tc.name, NodeID: id, Advertise: "127.0.0.1:0", Endpoints: []string{tc.etcd.Endpoint()}, LeaseTTL: 2 * time.Second},
	})
	if err != nil {
		tc.t.Fatalf("start %s: %v", id, err)
	}
	tc.mu.Lock()
	tc.nodes[id] = n
	tc.mu.Unlock()
	return n
}

// leave stops node id gracefully (its partitions are handed off first).
func (tc *testCluster) leave(id string) {
	tc.t.Helper()
	tc.mu.Lock()
	n := tc.nodes[id]
	delete(tc.nodes, id)
	tc.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := n.Close(ctx); err != nil {
		tc.t.Fatalf("leave %s: %v", id, err)
	}
}

func (tc *testCluster) node(id string) *Node {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.nodes[id]
}

func (tc *testCluster) live() []*Node {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	var out []*Node
	for _, n := range tc.nodes {
		out = append(out, n)
	}
	return out
}

// waitStable waits until every partition is served by exactly one live node,
// under the epoch the table shows, with no move in progress, and the partition
// counts differ by at most one.
func (tc *testCluster) waitStable(timeout time.Duration) {
	tc.t.Helper()
	deadline := time.Now().Add(timeout)
	var why string
	for time.Now().Before(deadline) {
		why = tc.unstable()
		if why == "" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tc.t.Fatalf("cluster not stable after %v: %s", timeout, why)
}

func (tc *testCluster) unstable() string {
	nodes := tc.live()
	if len(nodes) == 0 {
		return "no nodes"
	}
	_, parts, _, _ := nodes[0].member.view.snapshot()
	count := map[string]int{}
	for p := range uint32(testPartitions) {
		e := parts[p]
		if e.Target != "" || e.Owner == "" || e.Lease == 0 {
			return fmt.Sprintf("partition %d: %+v", p, e)
		}
		servers := 0
		for _, n := range nodes {
			if ep := n.member.servingEpoch(p); ep != 0 {
				servers++
				if n.member.id != e.Owner || ep != e.Epoch {
					return fmt.Sprintf("partition %d served by %s at %d, table says %s at %d", p, n.member.id, ep, e.Owner, e.Epoch)
				}
			}
		}
		if servers != 1 {
			return fmt.Sprintf("partition %d served by %d nodes", p, servers)
		}
		count[e.Owner]++
	}
	lo, hi := testPartitions, 0
	for _, n := range nodes {
		c := count[n.member.id]
		lo, hi = min(lo, c), max(hi, c)
	}
	if hi-lo > 1 {
		return fmt.Sprintf("unbalanced: %v", count)
	}
	return ""
}

// ownership is the ownership checker: every reply says which node served it,
// for which partition, under which epoch. No two nodes may serve one partition
// under one epoch, and the serving periods of different nodes for one
// partition may not overlap in time.
type ownership struct {
	mu      sync.Mutex
	periods map[uint32]map[uint64]*period // partition, epoch
}

type period struct {
	node        string
	first, last time.Time
}

func newOwnership() *ownership { return &ownership{periods: map[uint32]map[uint64]*period{}} }

// record notes a reply served as s, sent at start and received at end.
func (o *ownership) record(s Served, start, end time.Time) error {
	if s.Node == "" {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.periods[s.Partition]
	if m == nil {
		m = map[uint64]*period{}
		o.periods[s.Partition] = m
	}
	pr := m[s.Epoch]
	if pr == nil {
		m[s.Epoch] = &period{node: s.Node, first: end, last: start}
		return nil
	}
	if pr.node != s.Node {
		return fmt.Errorf("partition %d epoch %d served by both %s and %s", s.Partition, s.Epoch, pr.node, s.Node)
	}
	// A reply proves the node served between start and end; keep the widest
	// span that certainly lies inside the serving period.
	if end.Before(pr.first) {
		pr.first = end
	}
	if start.After(pr.last) {
		pr.last = start
	}
	return nil
}

// verify checks that, per partition, periods of higher epochs start after the
// periods of lower epochs end (each period [first, last] is what replies prove).
func (o *ownership) verify() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for p, m := range o.periods {
		for e1, a := range m {
			for e2, b := range m {
				if e1 < e2 && a.node != b.node && b.first.Before(a.last) && a.first.Before(a.last) && b.first.Before(b.last) {
					return fmt.Errorf("partition %d: %s at epoch %d served until %v, but %s at epoch %d from %v",
						p, a.node, e1, a.last.Format(time.RFC3339Nano), b.node, e2, b.first.Format(time.RFC3339Nano))
				}
			}
		}
	}
	return nil
}

// set writes slot s of object key through node n and records who served it.
func (tc *testCluster) set(ctx context.Context, n *Node, key, slot string, value int) (*actors.WriteResult, error) {
	start := time.Now()
	v, served, err := n.RequestServed(ctx, actors.ObjectID{App: "app_t", Type: "kv", Key: key}, &actors.KVWrite{
		Ops: []actors.Op{{Op: "set", Key: slot, Value: []byte(fmt.Sprint(value))}}, Route: actors.RoutePut})
	if err != nil {
		return nil, err
	}
	if cerr := tc.check.record(served, start, time.Now()); cerr != nil {
		tc.t.Error(cerr)
	}
	return v.(*actors.WriteResult), nil
}

func (tc *testCluster) get(ctx context.Context, n *Node, key string) (*actors.KVState, Served, error) {
	start := time.Now()
	v, served, err := n.RequestServed(ctx, actors.ObjectID{App: "app_t", Type: "kv", Key: key}, actors.KVGet{})
	if err != nil {
		return nil, served, err
	}
	if cerr := tc.check.record(served, start, time.Now()); cerr != nil {
		tc.t.Error(cerr)
	}
	return v.(*actors.KVState), served, nil
}

func TestCluster_RoutesFromEveryNode(t *testing.T) {
	tc := newTestCluster(t)
	a, b, c := tc.start("a"), tc.start("b"), tc.start("c")
	tc.waitStable(30 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes := []*Node{a, b, c}
	for i := range 60 {
		key := fmt.Sprintf("k%d", i)
		if _, err := tc.set(ctx, nodes[i%3], key, "v", i); err != nil {
			t.Fatalf("set %s via %s: %v", key, nodes[i%3].member.id, err)
		}
	}
	servedBy := map[string]int{}
	for i := range 60 {
		key := fmt.Sprintf("k%d", i)
		var owner string
		for _, n := range nodes {
			st, served, err := tc.get(ctx, n, key)
			if err != nil {
				t.Fatalf("get %s via %s: %v", key, n.member.id, err)
			}
			if string(st.State["v"]) != fmt.Sprint(i) || st.LogID != 1 {
				t.Fatalf("get %s via %s = %+v", key, n.member.id, st)
			}
			if owner == "" {
				owner = served.Node
			} else if served.Node != owner {
				t.Fatalf("%s served by %s and %s", key, owner, served.Node)
			}
			if want := n.member.view.part(served.Partition).Owner; want != served.Node {
				t.Fatalf("%s served by %s, table owner %s", key, served.Node, want)
			}
		}
		servedBy[owner]++
	}
	if len(servedBy) != 3 {
		t.Fatalf("objects served by %v; want all three nodes", servedBy)
	}
	// Typed errors cross the nodes as they are.
	for _, n := range nodes {
		_, err := n.Request(ctx, actors.ObjectID{App: "app_t", Type: "kv", Key: "k1"}, actors.KVGetSlot{Slot: "missing"})
		if kind := actors.KindOf(err); kind != actors.KindNotFound {
			t.Fatalf("missing slot via %s: %v (kind %d)", n.member.id, err, kind)
		}
	}
	if err := tc.check.verify(); err != nil {
		t.Fatal(err)
	}
}

// load runs writers against every live node until stop is closed, each writer
// incrementing its own counter object; it returns the acknowledged counts.
func (tc *testCluster) load(stop <-chan struct{}, writers int) (wait func() map[string]int64) {
	var wg sync.WaitGroup
	acked := make([]atomic.Int64, writers)
	var failures atomic.Int64
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("w%d", w)
			id := actors.ObjectID{App: "app_t", Type: "kv", Key: key}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				nodes := tc.live()
				if len(nodes) == 0 {
					return
				}
				n := nodes[i%len(nodes)]
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				v, served, err := n.RequestServed(ctx, id, &actors.KVWrite{Ops: []actors.Op{{Op: "increment", Key: "n"}}, Route: actors.RouteIncrement})
				cancel()
				if err != nil {
					failures.Add(1)
					if actors.KindOf(err) != actors.KindUnavailable {
						tc.t.Errorf("writer %d: %v", w, err)
						return
					}
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if cerr := tc.check.record(served, start, time.Now()); cerr != nil {
					tc.t.Error(cerr)
				}
				// Every increment is acknowledged once: the counter equals the acks.
				got := v.(*actors.WriteResult)
				if want := acked[w].Load() + 1; string(got.Value) != fmt.Sprint(want) {
					tc.t.Errorf("writer %d: counter %s after %d acknowledged increments (served %+v)", w, got.Value, want-1, served)
					return
				}
				acked[w].Add(1)
			}
		}()
	}
	return func() map[string]int64 {
		wg.Wait()
		out := map[string]int64{}
		for w := range writers {
			out[fmt.Sprintf("w%d", w)] = acked[w].Load()
		}
		tc.t.Logf("writers: %d unavailable replies (retried)", failures.Load())
		return out
	}
}

// checkCounts reads every writer's counter through every live node.
func (tc *testCluster) checkCounts(acked map[string]int64) {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for key, n := range acked {
		for _, node := range tc.live() {
			st, _, err := tc.get(ctx, node, key)
			if err != nil {
				tc.t.Fatalf("read %s via %s: %v", key, node.member.id, err)
			}
			if got := string(st.State["n"]); n > 0 && got != fmt.Sprint(n) {
				tc.t.Fatalf("%s = %s via %s, want %d acknowledged increments", key, got, node.member.id, n)
			}
		}
	}
}

func TestCluster_JoinAndLeaveUnderLoad(t *testing.T) {
	tc := newTestCluster(t)
	tc.start("a")
	tc.start("b")
	tc.waitStable(30 * time.Second)
	stop := make(chan struct{})
	wait := tc.load(stop, 8)
	time.Sleep(300 * time.Millisecond)
	tc.start("c") // joins under load: partitions move to it
	tc.waitStable(60 * time.Second)
	time.Sleep(300 * time.Millisecond)
	tc.leave("a") // leaves under load: its partitions move away first
	tc.waitStable(60 * time.Second)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	acked := wait()
	total := int64(0)
	for _, n := range acked {
		total += n
	}
	if total < 50 {
		t.Fatalf("only %d writes acknowledged", total)
	}
	tc.checkCounts(acked)
	if err := tc.check.verify(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d increments acknowledged across a join and a leave", total)
}
