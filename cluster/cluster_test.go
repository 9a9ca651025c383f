package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cold"
	"github.com/holdfast/holdfast/internal/devetcd"
	"github.com/holdfast/holdfast/internal/ownership"
	"github.com/holdfast/holdfast/metrics"
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
	check *ownership.Checker
	hook  func(s Served, start, end time.Time)
	// activity records when each node's activations of each object could
	// serve (in the host's routing table): never on two nodes at once.
	activity *activity
	// rf and failover configure replicated clusters (0: one copy).
	rf       int
	failover time.Duration
	// metrics, when not nil, gets each node's metrics (by node id) as it starts.
	metrics map[string]*metrics.Metrics
	// replaceAfter and formAfter are the nodes' (0: the defaults).
	formAfter    time.Duration
	replaceAfter time.Duration
	// cold, when set, is every node's cold store, shared if coldShared.
	cold       cold.Store
	coldShared bool
	// colds, when set, gives a node its own cold store instead of cold;
	// coldShareGrace is the nodes' (0: the default).
	colds          map[string]cold.Store
	coldShareGrace time.Duration
	// log, when set, is every node's log handler (else testLogger's).
	log slog.Handler
	// balanceAtOnce and balancePassed are the nodes' (ClusterConfig's);
	// balancePassed hears which node passed.
	balanceAtOnce int
	balancePassed func(id string, start, end time.Time, more bool)
}

// activity is the activation checker.
type activity struct {
	mu     sync.Mutex
	active map[actors.ObjectID]string // object -> the node whose activation is routed
	errs   []string
	count  int
	// serving, when set (replicated clusters), says whether a node still
	// serves an object's partition: an activation left in a routing table
	// after its node lost the lease serves nothing (every message checks the
	// lease), and is dropped at the node's next look.
	serving func(node string, id actors.ObjectID) bool
}

func (a *activity) routed(node string) func(id actors.ObjectID, in bool) {
	return func(id actors.ObjectID, in bool) {
		a.mu.Lock()
		defer a.mu.Unlock()
		cur, has := a.active[id]
		switch {
		case in && has && cur != node && len(a.errs) < 5 && (a.serving == nil || a.serving(cur, id)):
			a.errs = append(a.errs, fmt.Sprintf("%s activated on %s while active on %s", id, node, cur))
		case in:
			a.active[id] = node
			a.count++
		case has && cur == node:
			delete(a.active, id)
		}
	}
}

// verify fails the test if an object was ever active on two nodes at once.
func (a *activity) verify(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.errs) > 0 {
		t.Fatalf("objects active on two nodes at once: %v", a.errs)
	}
	t.Logf("%d activations, none on two nodes at once", a.count)
}

func newTestCluster(t *testing.T) *testCluster {
	t.Helper()
	e, err := devetcd.Start(devetcd.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{t: t, etcd: e, name: "test", dirs: map[string]string{}, nodes: map[string]*Node{}, check: ownership.New(),
		activity: &activity{active: map[actors.ObjectID]string{}}}
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
			_ = n.closeStorage()
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

// logger is a node's logger: tc.log's, else testLogger's.
func (tc *testCluster) logger() *slog.Logger {
	if tc.log != nil {
		return slog.New(tc.log)
	}
	return testLogger(tc.t)
}

// testTypeOptions: type "leased" has leases; the others the defaults.
func testTypeOptions(typ string) actors.TypeOptions {
	o := actors.DefaultTypeOptions()
	if typ == "leased" {
		o.Log.Leases = &actors.LeaseOptions{MaxParallelism: 4, LeaseDuration: 30 * time.Second}
	}
	if typ == "coldlog" {
		o.Log.MaxRecords, o.Log.Cold = 10, true
	}
	return o
}

// start starts node id (again, with its data directory, if it ran before).
func (tc *testCluster) start(id string) *Node {
	tc.t.Helper()
	dir, ok := tc.dirs[id]
	if !ok {
		dir = filepath.Join(tc.t.TempDir(), id)
		tc.dirs[id] = dir
	}
	var mt *metrics.Metrics
	if tc.metrics != nil {
		mt = metrics.New()
		tc.metrics[id] = mt
	}
	store := tc.cold
	if st, ok := tc.colds[id]; ok {
		store = st
	}
	var balancePassed func(start, end time.Time, more bool)
	if h := tc.balancePassed; h != nil {
		balancePassed = func(start, end time.Time, more bool) { h(id, start, end, more) }
	}
	n, err := Start(Config{
		DataDir: dir, Partitions: testPartitions, IdleTimeout: time.Minute, Logger: tc.logger(), TypeOptions: testTypeOptions,
		Hooks: actors.Hooks{Routed: tc.activity.routed(id)},
		Cold:  store, ColdShared: tc.coldShared, Metrics: mt,
		Cluster: &ClusterConfig{Name: tc.name, NodeID: id, Advertise: "127.0.0.1:0", Endpoints: []string{tc.etcd.Endpoint()}, LeaseTTL: 2 * time.Second,
			// 0 in a test means one copy (the one-copy tests), not the default.
			ReplicationFactor: max(tc.rf, 1), FailoverTimeout: tc.failover, ReplaceAfter: tc.replaceAfter, formAfter: tc.formAfter,
			coldShareGrace: tc.coldShareGrace, balanceAtOnce: tc.balanceAtOnce, balancePassed: balancePassed},
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
	for _, id := range slices.Sorted(maps.Keys(tc.nodes)) {
		out = append(out, tc.nodes[id])
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

// set writes slot s of object key through node n and records who served it.
func (tc *testCluster) set(ctx context.Context, n *Node, key, slot string, value int) (*actors.WriteResult, error) {
	start := time.Now()
	v, served, err := n.RequestServed(ctx, actors.ObjectID{App: "app_t", Type: "kv", Key: key}, &actors.KVWrite{
		Ops: []actors.Op{{Op: "set", Key: slot, Value: []byte(fmt.Sprint(value))}}, Route: actors.RoutePut})
	if err != nil {
		return nil, err
	}
	if cerr := tc.check.Record(served.Node, served.Partition, served.Epoch, start, time.Now()); cerr != nil {
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
	if cerr := tc.check.Record(served.Node, served.Partition, served.Epoch, start, time.Now()); cerr != nil {
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
			// The first log_id follows a floor of the partition's epoch (issue
			// 26, actors/logfloor.go): a multiple of 2^32.
			if string(st.State["v"]) != fmt.Sprint(i) || st.LogID%(1<<32) != 1 {
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
	tc.activity.verify(t)
	// Typed errors cross the nodes as they are.
	for _, n := range nodes {
		_, err := n.Request(ctx, actors.ObjectID{App: "app_t", Type: "kv", Key: "k1"}, actors.KVGetSlot{Slot: "missing"})
		if kind := actors.KindOf(err); kind != actors.KindNotFound {
			t.Fatalf("missing slot via %s: %v (kind %d)", n.member.id, err, kind)
		}
	}
	if err := tc.check.Verify(); err != nil {
		t.Fatal(err)
	}
}

// writerCounts is what one load writer knows of its counter: acked
// increments were acknowledged; unknown ones failed with an outcome the writer
// cannot know (they may or may not have applied).
type writerCounts struct{ acked, unknown int64 }

// load runs writers against every live node until stop is closed, each writer
// incrementing its own counter object; it returns what each writer knows.
func (tc *testCluster) load(stop <-chan struct{}, writers int) (wait func() map[string]writerCounts) {
	var wg sync.WaitGroup
	counts := make([]writerCounts, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("w%d", w)
			id := actors.ObjectID{App: "app_t", Type: "kv", Key: key}
			c := &counts[w]
			last := int64(0)
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
					if actors.KindOf(err) != actors.KindUnavailable {
						tc.t.Errorf("writer %d: %v", w, err)
						return
					}
					c.unknown++
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if cerr := tc.check.Record(served.Node, served.Partition, served.Epoch, start, time.Now()); cerr != nil {
					tc.t.Error(cerr)
				}
				tc.served(served, start, time.Now())
				// The counter only grows, and by no more than the increments sent.
				var got int64
				fmt.Sscan(string(v.(*actors.WriteResult).Value), &got)
				if got <= last || got > c.acked+c.unknown+1 {
					tc.t.Errorf("writer %d: counter %d after %d acknowledged and %d unknown increments, last seen %d (served %+v)", w, got, c.acked, c.unknown, last, served)
					return
				}
				last = got
				c.acked++
			}
		}()
	}
	return func() map[string]writerCounts {
		wg.Wait()
		out := map[string]writerCounts{}
		unknown := int64(0)
		for w := range writers {
			out[fmt.Sprintf("w%d", w)] = counts[w]
			unknown += counts[w].unknown
		}
		tc.t.Logf("writers: %d replies of unknown outcome (503)", unknown)
		return out
	}
}

// checkCounts reads every writer's counter through every live node: no
// acknowledged increment is lost, and none counts that was not sent.
func (tc *testCluster) checkCounts(counts map[string]writerCounts) {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for key, c := range counts {
		for _, node := range tc.live() {
			st, _, err := tc.get(ctx, node, key)
			if err != nil {
				tc.t.Fatalf("read %s via %s: %v", key, node.member.id, err)
			}
			var got int64
			fmt.Sscan(string(st.State["n"]), &got)
			if got < c.acked || got > c.acked+c.unknown {
				tc.t.Fatalf("%s = %d via %s, want %d acknowledged increments (+ up to %d unknown)", key, got, node.member.id, c.acked, c.unknown)
			}
		}
	}
}

// served notes a reply for the per-node checks of a test (servedHook).
func (tc *testCluster) served(s Served, start, end time.Time) {
	tc.mu.Lock()
	h := tc.hook
	tc.mu.Unlock()
	if h != nil {
		h(s, start, end)
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
		total += n.acked
	}
	if total < 50 {
		t.Fatalf("only %d writes acknowledged", total)
	}
	tc.checkCounts(acked)
	if err := tc.check.Verify(); err != nil {
		t.Fatal(err)
	}
	tc.activity.verify(t)
	t.Logf("%d increments acknowledged across a join and a leave", total)
}

// TestCluster_OneNode is a cluster of one (the shape of serve --dev-cluster):
// the node takes every partition up, serves it, and after a restart takes it
// up again at a new epoch with its data, and the operator commands read and
// refuse what they should.
func TestCluster_OneNode(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a")
	tc.waitStable(30 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				if _, err := tc.set(ctx, a, fmt.Sprintf("k%d", w), "v", i); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	_, served, err := tc.get(ctx, a, "k3")
	if err != nil || served.Node != "a" {
		t.Fatalf("get: %+v %v", served, err)
	}
	st, err := ReadStatus(ctx, []string{tc.etcd.Endpoint()}, tc.name)
	if err != nil || len(st.Nodes) != 1 || len(st.UnavailableParts()) != 0 || st.Served != testPartitions || st.Controller != "a" {
		t.Fatalf("status %+v %v", st, err)
	}
	tc.leave("a") // nobody to hand off to: the partitions stay a's
	st, err = ReadStatus(ctx, []string{tc.etcd.Endpoint()}, tc.name)
	if err != nil || len(st.Nodes) != 1 || st.Nodes[0].State != NodeDown || st.Nodes[0].Owned != testPartitions ||
		len(st.UnavailableParts()) != testPartitions || st.Unavailable != testPartitions {
		t.Fatalf("status after a left alone: %+v %v", st, err)
	}
	if _, err := ForgetNode(ctx, []string{tc.etcd.Endpoint()}, tc.name, "zz"); err != nil {
		t.Fatalf("forget a node that owns nothing: %v", err)
	}
	a = tc.start("a")
	tc.waitStable(30 * time.Second)
	s, served2, err := tc.get(ctx, a, "k3")
	if err != nil || string(s.State["v"]) != "19" || served2.Epoch <= served.Epoch {
		t.Fatalf("after the restart: %+v %+v (epoch before %d) %v", s, served2, served.Epoch, err)
	}
	if _, err := ForgetNode(ctx, []string{tc.etcd.Endpoint()}, tc.name, "a"); !errors.Is(err, ErrNodeLive) {
		t.Fatalf("forget a live node: %v", err)
	}
}
