package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/bench/peers"
	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/internal/devetcd"
	"github.com/holdfast/holdfast/metrics"
	"github.com/holdfast/holdfast/persistence"
)

// holdfast-r3 (issue 27): Holdfast replicated, side by side with the
// replicated peers. Three nodes of one cluster with ReplicationFactor 3 run
// in the case's process (one Go runtime, as jetstream-r3's three servers),
// with an embedded etcd (internal/devetcd) and each node's data directory
// under the case's directory; partitions, FailoverTimeout and every other
// setting are the defaults (the single-node holdfast system's partitions).
// The case waits until every partition is served with all its replicas live
// and every node has reached every partition before its warm-up. Each write
// goes to a node picked at random, which forwards it to the partition's
// leader when it does not lead it: two thirds of the writes take a hop.
// Writes, warm-up and figures are the peers' (peers.Measure): the same 256-byte
// value set into slot v of object obj-<c mod objects> as the holdfast system's
// writes, and CPU and disk bytes of the whole process (client, three nodes
// and etcd).
const sysHoldfastR3 = "holdfast-r3"

// r3Spec is a write case of holdfast-r3: callers goroutines, caller c setting
// slot v of object c mod objects, one write in flight each.
type r3Spec struct{ objects, callers int }

// r3Route names how holdfast-r3's callers pick the node a write goes
// through: "" (or "random"), a node at random, as a client that knows nothing
// of the cluster (etcd's clientv3 balances over members the same way); or
// "leader", the node that served the caller's object last (the Served record
// of its previous write: a leader-aware client, which skips the forward). Set
// by $HOLDFAST_BENCH_R3_ROUTE, so that the case's own process sees it.
var r3Route = os.Getenv("HOLDFAST_BENCH_R3_ROUTE")

// r3Note is what the case's figures mean; the report splits notes at "; ".
const r3Note = "3 nodes (replicationFactor 3, default partitions and failoverTimeout) and an embedded etcd in the case's process; " +
	r3RandomNote + "; " +
	"a write is acknowledged once a majority of the partition's replicas fsynced it; CPU and disk bytes cover the client, the 3 nodes and etcd together; " +
	"syncs per write not measured (a replicated node's Stats count the applier's Badger commits, not the WAL's syncs)"

// The part of r3Note that says how writes are routed, and its leader-aware
// variant.
const (
	r3RandomNote = "every write goes to a node picked at random, which forwards it to the partition's leader unless it leads it"
	r3LeaderNote = "every write goes to the node that served its object's last write (a leader-aware client: no forward once it learned the leader)"
)

// r3Config configures startR3; zero values are what the benchmark uses.
type r3Config struct {
	// partitions is the cluster's partition count; 0: the default (256).
	partitions int
	// readyTimeout bounds the wait for every partition to be served; 0: 2m.
	readyTimeout time.Duration
}

// r3Cluster is the three nodes of a holdfast-r3 case and their etcd.
type r3Cluster struct {
	etcd  *devetcd.Server
	nodes []*cluster.Node
	ids   []string // the nodes' ids, by index in nodes
	// sent counts the writes sent through each node (by index in nodes);
	// direct those the node they were sent through served itself, out of
	// acked acknowledged (both warm-up included).
	sent   []atomic.Int64
	direct atomic.Int64
	acked  atomic.Int64
	// retried counts the writes sent again after an unavailable reply (a
	// leadership move; see writes).
	retried atomic.Int64
	// metrics are the nodes' (by index in nodes): the note reports the raft
	// messages they sent per write.
	metrics []*metrics.Metrics
}

// raftMessages sums the raft messages the nodes sent to each other so far
// (holdfast_raft_messages_sent_total: heartbeats apart, which travel
// coalesced per node pair).
func (c *r3Cluster) raftMessages() float64 {
	var sum float64
	for _, mt := range c.metrics {
		fams, err := mt.Registry().Gather()
		if err != nil {
			continue
		}
		for _, f := range fams {
			if f.GetName() == "holdfast_raft_messages_sent_total" {
				for _, m := range f.GetMetric() {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// r3Name is the cluster's name in etcd.
const r3Name = "bench-r3"

// startR3 starts etcd and three nodes under dir and waits until every
// partition is served (waitServed).
func startR3(dir string, cfg r3Config) (*r3Cluster, error) {
	if cfg.readyTimeout <= 0 {
		cfg.readyTimeout = 2 * time.Minute
	}
	e, err := devetcd.Start(devetcd.Config{Dir: filepath.Join(dir, "etcd")})
	if err != nil {
		return nil, err
	}
	log := quietLogger()
	if os.Getenv("HOLDFAST_BENCH_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c := &r3Cluster{etcd: e}
	for _, id := range []string{"a", "b", "c"} {
		mt := metrics.New()
		c.metrics = append(c.metrics, mt)
		n, err := cluster.Start(cluster.Config{
			DataDir: filepath.Join(dir, id), Partitions: cfg.partitions, Logger: log.With("node", id), Metrics: mt,
			Cluster: &cluster.ClusterConfig{Name: r3Name, NodeID: id, Advertise: "127.0.0.1:0", Endpoints: []string{e.Endpoint()},
				ReplicationFactor: 3},
		})
		if err != nil {
			c.close()
			return nil, fmt.Errorf("holdfast-r3: start node %s: %w", id, err)
		}
		c.nodes = append(c.nodes, n)
		c.ids = append(c.ids, id)
	}
	c.sent = make([]atomic.Int64, len(c.nodes))
	if err := c.waitServed(cfg.readyTimeout); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// waitServed waits, at most timeout, until the cluster's status shows every
// partition served with all its replicas live, and then until one request
// per partition through every node has been answered: every node reaches
// every partition's leader.
func (c *r3Cluster) waitServed(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		why := ""
		st, err := cluster.ReadStatus(ctx, []string{c.etcd.Endpoint()}, r3Name)
		switch {
		case err != nil:
			why = err.Error()
		case st.Served != st.Partitions || st.UnderReplicated != 0:
			why = fmt.Sprintf("%d of %d partitions served, %d under-replicated", st.Served, st.Partitions, st.UnderReplicated)
		}
		if why == "" {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("holdfast-r3: not every partition served within %v: %s", timeout, why)
		case <-time.After(50 * time.Millisecond):
		}
	}
	ids := partitionObjects(c.nodes[0].Partitions())
	var wg sync.WaitGroup
	var failed atomic.Value
	sem := make(chan struct{}, 32)
	for _, n := range c.nodes {
		for _, id := range ids {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				var err error
				for ctx.Err() == nil {
					if _, err = n.Request(ctx, id, actors.KVGet{}); err == nil {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
				failed.Store(fmt.Errorf("holdfast-r3: object %s (partition %d) not reached within %v: %w",
					id.Key, persistence.Partition(id, len(ids)), timeout, errors.Join(err, ctx.Err())))
			}()
		}
	}
	wg.Wait()
	err, _ := failed.Load().(error)
	return err
}

// partitionObjects returns one object of type bench per partition, ready-<i>
// for the first i that falls in it (index p for partition p).
func partitionObjects(parts int) []actors.ObjectID {
	out := make([]actors.ObjectID, parts)
	left := parts
	for i := 0; left > 0; i++ {
		id := actors.ObjectID{App: "app_bench", Type: "bench", Key: fmt.Sprintf("ready-%d", i)}
		if p := persistence.Partition(id, parts); out[p].Key == "" {
			out[p] = id
			left--
		}
	}
	return out
}

// close closes the nodes, all at once, then etcd.
func (c *r3Cluster) close() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = n.Close(ctx)
		}()
	}
	wg.Wait()
	c.etcd.Close()
}

// writes runs s for d after peers.Warmup, each write through a node picked at
// random.
func (c *r3Cluster) writes(s r3Spec, d time.Duration, route string) (peers.Result, error) {
	if s.objects < 1 || s.callers < 1 {
		return peers.Result{}, fmt.Errorf("holdfast-r3: %d objects, %d callers: both must be positive", s.objects, s.callers)
	}
	// objs[i][o] is object obj-<o> through node i.
	objs := make([][]*actors.KV, len(c.nodes))
	for i, n := range c.nodes {
		objs[i] = make([]*actors.KV, s.objects)
		for o := range objs[i] {
			objs[i][o] = actors.NewKV(n, actors.ObjectID{App: "app_bench", Type: "bench", Key: fmt.Sprintf("obj-%d", o)})
		}
	}
	var value any = string(peers.Payload()) // boxed once, as the holdfast system's
	leaderAware := false
	switch route {
	case "", "random":
	case "leader":
		leaderAware = true
	default:
		return peers.Result{}, fmt.Errorf("holdfast-r3: route %q: want random or leader", route)
	}
	// via[w] is the node caller w's object was served by last (-1: none yet).
	via := make([]atomic.Int32, s.callers)
	for i := range via {
		via[i].Store(-1)
	}
	byName := map[string]int32{}
	for i, id := range c.ids {
		byName[id] = int32(i)
	}
	var writes atomic.Int64 // acknowledged, warm-up included
	msgs0 := c.raftMessages()
	r, err := peers.Measure(s.callers, d, func(ctx context.Context, w int) (int64, error) {
		i := rand.IntN(len(c.nodes))
		if j := via[w].Load(); leaderAware && j >= 0 {
			i = int(j)
		}
		c.sent[i].Add(1)
		ctx, cancel := context.WithTimeout(ctx, peers.OpTimeout)
		defer cancel()
		ctx, served := actors.WithServedRecord(ctx)
		for {
			_, err := objs[i][w%s.objects].Set(ctx, "v", value)
			if err == nil {
				break
			}
			// Unavailable (503 over REST: retry after retryAfterMs) is what
			// a write gets while its partition's leadership moves, refused
			// or of unknown outcome: a client told to retry sends it again,
			// and a set of the same value may be sent twice. Anything else,
			// or no reply within the operation's time, fails the case.
			var ae *actors.Error
			if !errors.As(err, &ae) || ae.Kind != actors.KindUnavailable || ctx.Err() != nil {
				via[w].Store(-1) // a failover: ask a node at random next time
				return 0, fmt.Errorf("set obj-%d through node %d: %w", w%s.objects, i, err)
			}
			c.retried.Add(1)
			select {
			case <-time.After(min(max(ae.RetryAfter, 10*time.Millisecond), 100*time.Millisecond)):
			case <-ctx.Done():
				return 0, fmt.Errorf("set obj-%d through node %d: %w", w%s.objects, i, err)
			}
			i = rand.IntN(len(c.nodes)) // the leader may have moved
			c.sent[i].Add(1)
		}
		if j, ok := byName[served().Node]; ok {
			via[w].Store(j)
			if int(j) == i {
				c.direct.Add(1)
			}
		}
		writes.Add(1)
		c.acked.Add(1)
		return 1, nil
	})
	if err != nil {
		return peers.Result{}, fmt.Errorf("holdfast-r3 writes (%d objects, %d callers): %w", s.objects, s.callers, err)
	}
	r.Note = r3Note
	if leaderAware {
		r.Note = strings.Replace(r3Note, r3RandomNote, r3LeaderNote, 1)
	}
	if n := writes.Load(); n > 0 {
		r.Note += fmt.Sprintf("; %.2f raft messages sent between the nodes per write, heartbeats apart (warm-up included)", (c.raftMessages()-msgs0)/float64(n))
	}
	if n := c.retried.Swap(0); n > 0 {
		r.Note += fmt.Sprintf("; %d writes were sent again after an unavailable reply (a leadership move)", n)
	}
	return r, nil
}

// holdfastR3Case runs workload w on a fresh holdfast-r3 cluster in dir. The
// CPU profile ($HOLDFAST_BENCH_CPUPROFILE), the heap profile
// ($HOLDFAST_BENCH_ALLOCPROFILE) and the execution trace
// ($HOLDFAST_BENCH_TRACE) cover the writes: set-up, warm-up and the measured
// interval, not the cluster's start.
func holdfastR3Case(w workload, dir string, d time.Duration) (result, error) {
	if w.r3 == nil {
		return result{}, fmt.Errorf("holdfast-r3 does not run %s", w.name)
	}
	// As a Holdfast process does (holdfast.Open, holdfast serve): once for
	// the process, whatever its nodes.
	cluster.TuneGOMAXPROCS(nil)
	var cfg r3Config
	if v := os.Getenv("HOLDFAST_BENCH_R3_PARTITIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return result{}, fmt.Errorf("HOLDFAST_BENCH_R3_PARTITIONS=%q: want a positive partition count", v)
		}
		cfg.partitions = n
	}
	c, err := startR3(dir, cfg)
	if err != nil {
		return result{}, err
	}
	defer c.close()
	stopProfile, stopTrace, stopAllocs := profileCPU(), traceRun(), profileAllocs()
	r, err := c.writes(*w.r3, d, r3Route)
	stopTrace()
	stopProfile()
	stopAllocs()
	if err != nil {
		return result{}, err
	}
	out := result{OpsPerSec: r.OpsPerSec, Ops: r.Ops, DiskBytes: r.DiskBytes, CPUSeconds: r.ClientCPU.Seconds(), Note: r.Note,
		LatencyP50Ms: ms(r.LatencyP50), LatencyP99Ms: ms(r.LatencyP99)}
	if w.payload {
		out.PayloadBytes = float64(r.Ops) * peers.PayloadSize
	}
	return out, nil
}
