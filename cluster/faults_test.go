package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/internal/tcpproxy"
	"github.com/holdfast/holdfast/persistence"
)

// startVia starts node id with its etcd connection through a proxy.
func (tc *testCluster) startVia(id string) (*Node, *tcpproxy.Proxy) {
	tc.t.Helper()
	px, err := tcpproxy.Start(tc.etcd.Endpoint())
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { px.Close() }) // connections stay: the nodes stop first
	dir, ok := tc.dirs[id]
	if !ok {
		dir = filepath.Join(tc.t.TempDir(), id)
		tc.dirs[id] = dir
	}
	n, err := Start(Config{
		DataDir: dir, Partitions: testPartitions, IdleTimeout: time.Minute, Logger: testLogger(tc.t),
		Hooks:   actors.Hooks{Routed: tc.activity.routed(id)},
		Cluster: &ClusterConfig{Name: tc.name, NodeID: id, Advertise: "127.0.0.1:0", Endpoints: []string{px.Addr()}, LeaseTTL: 2 * time.Second, ReplicationFactor: 1},
	})
	if err != nil {
		tc.t.Fatalf("start %s: %v", id, err)
	}
	tc.mu.Lock()
	tc.nodes[id] = n
	tc.mu.Unlock()
	return n, px
}

// crash stops node id the way a crash would for the cluster: no handoff, no
// lease revoked (it expires), the transport gone at once.
func (tc *testCluster) crash(id string) {
	tc.t.Helper()
	tc.mu.Lock()
	n := tc.nodes[id]
	delete(tc.nodes, id)
	tc.mu.Unlock()
	n.member.stop(false)
	n.ready.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = n.host.Close(ctx)
	_ = n.closeStorage()
}

// keysOwnedBy returns object keys in count different partitions that owner
// owns in n's view.
func keysOwnedBy(t *testing.T, n *Node, owner string, count int) []string {
	t.Helper()
	_, parts, _, _ := n.member.view.snapshot()
	var keys []string
	for p, e := range parts {
		if e.Owner == owner && len(keys) < count {
			keys = append(keys, keyIn(uint32(p)))
		}
	}
	if len(keys) < count {
		t.Fatalf("%s owns %d partitions, want %d", owner, len(keys), count)
	}
	return keys
}

// keyIn returns an object key whose partition is p.
func keyIn(p uint32) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("obj%d", i)
		if persistence.Partition(actors.ObjectID{App: "app_t", Type: "kv", Key: k}, testPartitions) == p {
			return k
		}
	}
}

func TestCluster_CrashedNodesPartitionsWaitForIt(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a")
	tc.start("b")
	tc.start("c")
	tc.waitStable(30 * time.Second)
	_, parts, _, _ := a.member.view.snapshot()
	var ofC []uint32
	for p, e := range parts {
		if e.Owner == "c" {
			ofC = append(ofC, uint32(p))
		}
	}
	if len(ofC) == 0 {
		t.Fatal("c owns nothing")
	}
	ctx := context.Background()
	key := keyIn(ofC[0])
	if _, err := tc.set(ctx, a, key, "v", 7); err != nil {
		t.Fatal(err)
	}
	epochBefore := parts[ofC[0]].Epoch
	tc.crash("c")

	// Until c returns, its partitions answer 503 with a retry delay, from every
	// node, and nobody else serves them.
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		start := time.Now()
		_, _, err = tc.get(rctx, a, key)
		cancel()
		if took := time.Since(start); err != nil && took > 2500*time.Millisecond {
			t.Fatalf("a request to a crashed node's partition took %v", took)
		}
		var e *actors.Error
		if errors.As(err, &e) && e.Kind == actors.KindUnavailable && e.RetryAfter > 0 {
			if _, dead := a.member.view.node("c"); !dead {
				break // c's lease expired: the answer is immediate from now on
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	var e *actors.Error
	if !errors.As(err, &e) || e.Kind != actors.KindUnavailable || e.RetryAfter <= 0 {
		t.Fatalf("request to a crashed node's partition: %v", err)
	}
	for _, n := range tc.live() {
		start := time.Now()
		_, _, err := tc.get(ctx, n, key)
		if !errors.As(err, &e) || e.Kind != actors.KindUnavailable || time.Since(start) > time.Second {
			t.Fatalf("via %s: %v after %v", n.member.id, err, time.Since(start))
		}
		for _, p := range ofC {
			if n.member.servingEpoch(p) != 0 {
				t.Fatalf("%s serves partition %d of the crashed node", n.member.id, p)
			}
		}
	}
	time.Sleep(time.Second) // the controller had time to move things: it must not
	if got := a.member.view.part(ofC[0]); got.Owner != "c" {
		t.Fatalf("a crashed node's partition went to %q", got.Owner)
	}

	// c comes back with its data: it takes its partitions up at new epochs.
	tc.start("c")
	tc.waitStable(30 * time.Second)
	st, served, err := tc.get(ctx, a, key)
	if err != nil || string(st.State["v"]) != "7" {
		t.Fatalf("after c returned: %+v %v", st, err)
	}
	if served.Node != "c" || served.Epoch <= epochBefore {
		t.Fatalf("served %+v after the restart, epoch before %d", served, epochBefore)
	}
	if err := tc.check.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestCluster_NodeCutOffFromEtcdStopsServing(t *testing.T) {
	tc := newTestCluster(t)
	tc.start("a")
	tc.start("b")
	_, px := tc.startVia("c")
	tc.waitStable(30 * time.Second)
	ttl := 2 * time.Second

	// Record the replies c gives; after the cut none under an epoch it served
	// at the cut may end later than its lease allows.
	var mu sync.Mutex
	var cutAt time.Time
	var cutEpochs map[uint32]uint64
	var lateReplies []string
	servedByC := 0
	tc.mu.Lock()
	tc.hook = func(s Served, start, end time.Time) {
		if s.Node != "c" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		servedByC++
		if !cutAt.IsZero() && s.Epoch <= cutEpochs[s.Partition] && end.After(cutAt.Add(ttl)) && len(lateReplies) < 5 {
			lateReplies = append(lateReplies, fmt.Sprintf("%+v at %v after the cut", s, end.Sub(cutAt)))
		}
	}
	tc.mu.Unlock()

	stop := make(chan struct{})
	wait := tc.load(stop, 8)
	time.Sleep(500 * time.Millisecond)
	c := tc.node("c")
	mu.Lock()
	cutEpochs = map[uint32]uint64{}
	for p := range uint32(testPartitions) {
		cutEpochs[p] = c.table.epochs[p].Load()
	}
	cutAt = time.Now()
	before := servedByC
	mu.Unlock()
	px.Block()
	// Within its lease, c stops serving everything.
	deadline := cutAt.Add(ttl + time.Second)
	for time.Now().Before(deadline) && len(c.member.served()) > 0 && c.member.leaseValid() {
		time.Sleep(20 * time.Millisecond)
	}
	if c.member.leaseValid() {
		t.Fatalf("c still holds its lease %v after it was cut off", time.Since(cutAt))
	}
	// Meanwhile the others answer 503 for c's partitions and serve none of them.
	time.Sleep(2 * ttl)
	a := tc.node("a")
	_, parts, _, _ := a.member.view.snapshot()
	for p, e := range parts {
		if e.Owner == "c" {
			for _, n := range []*Node{a, tc.node("b")} {
				if n.member.servingEpoch(uint32(p)) != 0 {
					t.Fatalf("%s serves c's partition %d", n.member.id, p)
				}
			}
			if _, err := a.Request(context.Background(), actors.ObjectID{App: "app_t", Type: "kv", Key: keyIn(uint32(p))}, actors.KVGet{}); actors.KindOf(err) != actors.KindUnavailable {
				t.Fatalf("c's partition %d while c is cut off: %v", p, err)
			}
		}
	}
	// Connected again, c serves its partitions again, at new epochs.
	px.Unblock()
	tc.waitStable(30 * time.Second)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	counts := wait()
	tc.checkCounts(counts)
	mu.Lock()
	defer mu.Unlock()
	if len(lateReplies) > 0 {
		t.Fatalf("c replied after its lease: %v", lateReplies)
	}
	if servedByC <= before {
		t.Fatalf("c served nothing after it came back (%d before the cut, %d after)", before, servedByC)
	}
	if err := tc.check.Verify(); err != nil {
		t.Fatal(err)
	}
	tc.activity.verify(t)
}
