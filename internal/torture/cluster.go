package torture

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/holdfast/holdfast/internal/freeport"

	"github.com/anishathalye/porcupine"

	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/internal/devetcd"
)

// clusterTarget is a cluster of cfg.Cluster `holdfast serve` processes (n1,
// n2, ...) sharing an etcd that runs in this process. Each node keeps its data
// directory and its advertise address across restarts. The clients send each
// request to a random running node, which routes it to the owner of the
// object's partition.
//
// Faults (Config.Faults), one node at a time: while a node is away (it
// left) the next fault starts it again, so no fault ever takes two nodes
// out, and no raft group (3 replicas over 3 or more nodes) loses its
// majority to them:
//   - kill: SIGKILL a random node, start it again on its data 0-2 s later
//     (its partitions answer 503 meanwhile: they keep their owner, or in a
//     replicated cluster the other replicas elect);
//   - leave: SIGTERM a random node, which hands its partitions off and must
//     exit 0; the next fault starts it again (the controller moves partitions
//     back to it);
//   - wipe (replication factor 3 or more): SIGKILL a random node, delete its
//     whole data directory, start it again 0-2 s later under the same nodeId:
//     it must never run its old replicas, and gets new ones filled by
//     snapshot. Only once the cluster is fully replicated (every node live,
//     no partition under-replicated): a second wipe before the first one's
//     replicas were rebuilt could take a group's majority, which nothing
//     survives;
//   - cut (replication factor 2 or more): every node's raft carrier is
//     reached through a linkProxy; a cut isolates one node's raft traffic
//     (both ways) or cuts the link between two nodes (both ways) for 1-6 s,
//     then heals. Requests still travel between nodes over the other port.
//
// After the workload every node is killed at once and started again, the
// final reads run, and the nodes are stopped with SIGTERM one after another
// (each must exit 0).
type clusterTarget struct {
	r     *run
	etcd  *devetcd.Server
	nodes []*clusterNode
	// lastKill is r.now() once every node had exited at the kill of settle.
	lastKill int64
	order    []string // what is left of Config.order
	// moved says a replica of a replicated cluster was re-created on another
	// node or data directory (a wipe; with more nodes than replicas, the
	// joins at the start and every leave): the cluster appends a new replica at the end of its group's
	// list and leadership balancing only prefers the first, so the leaders
	// need not spread evenly any more, and settle does not wait for it.
	moved bool
}

type clusterNode struct {
	id      string
	cfgFile string
	dataDir string
	logFile string     // the node's stderr, across its restarts
	srv     *server    // nil while the node does not run
	away    bool       // it left (SIGTERM) and a later fault starts it again
	raft    *linkProxy // in front of its raft carrier (replicated clusters), for cuts
}

const (
	clusterName       = "torture"
	clusterPartitions = 32
	// stableWait bounds the wait for the cluster to serve every partition.
	stableWait = 60 * time.Second
	// leaveWait bounds a graceful stop (handoff of every partition).
	leaveWait = 90 * time.Second
)

func (t *clusterTarget) start(context.Context) error {
	cfg := t.r.cfg
	t.order = cfg.order
	e, err := devetcd.Start(devetcd.Config{Dir: filepath.Join(cfg.Dir, "etcd")})
	if err != nil {
		return err
	}
	t.etcd = e
	for i := range cfg.Cluster {
		id := fmt.Sprintf("n%d", i+1)
		advertise, err := freeport.Addr()
		if err != nil {
			return err
		}
		n := &clusterNode{id: id, cfgFile: filepath.Join(cfg.Dir, id+".yaml"), dataDir: filepath.Join(cfg.Dir, id),
			logFile: filepath.Join(cfg.Dir, id+".log")}
		extra, top := ", replicationFactor: 1", "" // one copy unless asked (the nodes' default is 3)
		if rf := cfg.ReplicationFactor; rf > 1 {
			raftBind, err := freeport.Addr()
			if err != nil {
				return err
			}
			// The others reach the node's carrier through its proxy, which
			// outlives the node's restarts.
			if n.raft, err = startLinkProxy(raftBind); err != nil {
				return err
			}
			// A replicated cluster needs a cold store every node reads.
			top = fmt.Sprintf("cold: {fs: {dir: '%s', shared: true}}\n", filepath.Join(cfg.Dir, "cold"))
			extra = fmt.Sprintf(", replicationFactor: %d, failoverTimeout: 1s, raftAdvertise: '%s', raftBind: '%s'",
				rf, n.raft.addr(), raftBind)
		}
		conf := appsYAML + typesYAML + top + fmt.Sprintf("partitions: %d\n", clusterPartitions) +
			fmt.Sprintf("cluster: {name: %s, nodeId: %s, advertise: '%s', etcd: {endpoints: ['%s']}, leaseTtl: 2s%s}\n",
				clusterName, id, advertise, e.Endpoint(), extra)
		t.nodes = append(t.nodes, n) // close stops its proxy, whatever happens next
		if err := os.WriteFile(n.cfgFile, []byte(conf), 0o644); err != nil {
			return err
		}
	}
	for _, n := range t.nodes {
		if err := t.startNode(n); err != nil {
			return err
		}
	}
	// A replicated cluster forms with its first ReplicationFactor nodes; the
	// others join and get replicas moved to them (appended to each group's
	// list: they lead nothing, see moved).
	rf := max(cfg.ReplicationFactor, 1)
	t.moved = rf > 1 && cfg.Cluster > rf
	if why := t.waitStable(!t.moved); why != "" {
		return fmt.Errorf("torture: the cluster did not settle after its start: %s", why)
	}
	if rf > 1 {
		if why := t.waitReplicated(startWait); why != "" {
			return fmt.Errorf("torture: the cluster was not fully replicated within %v of its start: %s", startWait, why)
		}
	}
	fmt.Fprintf(cfg.Progress, "cluster of %d nodes serves %d partitions (etcd %s, logs in %s)\n",
		len(t.nodes), clusterPartitions, e.Endpoint(), cfg.Dir)
	return nil
}

// startNode starts n on its data and adds it to the clients' URLs.
func (t *clusterTarget) startNode(n *clusterNode) error {
	srv, err := t.r.startServer(context.Background(), n.dataDir, n.cfgFile, n.logFile, []string{"HOLDFAST_TEST_SERVED_HEADER=1"})
	if err != nil {
		return fmt.Errorf("node %s: %w", n.id, err)
	}
	n.srv, n.away = srv, false
	t.publish()
	return nil
}

// publish stores the URLs of the running nodes for the clients.
func (t *clusterTarget) publish() {
	var urls []string
	for _, n := range t.nodes {
		if n.srv != nil {
			urls = append(urls, n.srv.url)
		}
	}
	t.r.urls.Store(&urls)
}

// stopping takes n out of the clients' URLs before a fault ends it.
func (t *clusterTarget) stopping(n *clusterNode) *server {
	srv := n.srv
	n.srv = nil
	t.publish()
	return srv
}

func (t *clusterTarget) fault(_ context.Context, rng *rand.Rand) error {
	var running, away []*clusterNode
	for _, n := range t.nodes {
		switch {
		case n.srv != nil:
			running = append(running, n)
		case n.away:
			away = append(away, n)
		}
	}
	r := t.r
	if len(away) > 0 { // one node out at a time
		n := away[rng.Intn(len(away))]
		fmt.Fprintf(r.cfg.Progress, "start %s again at %.1fs\n", n.id, r.since())
		return t.startNode(n)
	}
	if len(running) < 3 {
		return nil
	}
	n := running[rng.Intn(len(running))]
	kind := pickFault(r.cfg.Faults, rng)
	if len(t.order) > 0 {
		kind, t.order = t.order[0], t.order[1:]
	}
	switch kind {
	case FaultWipe:
		if why := t.waitReplicated(replicatedWait); why != "" {
			fmt.Fprintf(r.cfg.Progress, "no wipe at %.1fs, the cluster is not fully replicated (%s): a kill instead\n", r.since(), why)
			return t.kill(n, rng, false)
		}
		return t.kill(n, rng, true)
	case FaultCut, cutAll, cutLink:
		return t.cut(n, running, rng, kind)
	case FaultLeave:
		at := time.Now()
		if rf := r.cfg.ReplicationFactor; rf > 1 && len(t.nodes) > rf {
			t.moved = true
		}
		t.leave(n, true)
		r.leaves++
		fmt.Fprintf(r.cfg.Progress, "leave %d: %s at %.1fs, exited after %.1fs\n", r.leaves, n.id,
			at.Sub(r.start).Seconds(), time.Since(at).Seconds())
		return nil
	default:
		return t.kill(n, rng, false)
	}
}

// kill SIGKILLs n and starts it again 0-2 s later; wipe deletes its data
// directory in between.
func (t *clusterTarget) kill(n *clusterNode, rng *rand.Rand, wipe bool) error {
	r := t.r
	t.stopping(n).kill()
	r.kills++
	down := time.Duration(rng.Intn(2000)) * time.Millisecond
	if wipe {
		if err := os.RemoveAll(n.dataDir); err != nil {
			return fmt.Errorf("torture: wipe node %s: %w", n.id, err)
		}
		r.wipes++
		t.moved = true
		fmt.Fprintf(r.cfg.Progress, "kill %d: %s at %.1fs, its data directory wiped (wipe %d), back after %v\n",
			r.kills, n.id, r.since(), r.wipes, down)
	} else {
		fmt.Fprintf(r.cfg.Progress, "kill %d: %s at %.1fs, back after %v\n", r.kills, n.id, r.since(), down)
	}
	time.Sleep(down)
	return t.startNode(n)
}

// Kinds of cut that only Config.order names: FaultCut picks one at random.
const (
	cutAll  = "cut:all"
	cutLink = "cut:link"
)

// cut cuts n's raft traffic for 1-6 s, both ways: all of it (cutAll), or its
// link with one other running node (cutLink); FaultCut picks one of them at
// random. Then it heals.
func (t *clusterTarget) cut(n *clusterNode, running []*clusterNode, rng *rand.Rand, kind string) error {
	r := t.r
	if n.raft == nil {
		return fmt.Errorf("torture: a cut needs a replicated cluster (no raft proxies)")
	}
	nums, err := t.raftNums()
	if err != nil {
		fmt.Fprintf(r.cfg.Progress, "no cut at %.1fs: %v\n", r.since(), err)
		return nil
	}
	dur := time.Second + time.Duration(rng.Int63n(int64(5*time.Second)+1))
	r.cuts++
	what := ""
	if kind == FaultCut {
		kind = []string{cutAll, cutLink}[rng.Intn(2)]
	}
	if kind == cutAll {
		what = fmt.Sprintf("every raft link of %s", n.id)
		n.raft.cutAll()
		for _, o := range t.nodes {
			if o != n {
				o.raft.cutFrom(nums[n.id])
			}
		}
	} else {
		var o *clusterNode
		for o == nil || o == n {
			o = running[rng.Intn(len(running))]
		}
		what = fmt.Sprintf("the raft link %s-%s", n.id, o.id)
		n.raft.cutFrom(nums[o.id])
		o.raft.cutFrom(nums[n.id])
	}
	for _, o := range t.nodes {
		if o.srv != nil {
			o.srv.note("cut %d: %s for %v", r.cuts, what, dur)
		}
	}
	fmt.Fprintf(r.cfg.Progress, "cut %d: %s at %.1fs for %v\n", r.cuts, what, r.since(), dur.Round(time.Millisecond))
	time.Sleep(dur)
	for _, o := range t.nodes {
		o.raft.heal()
		if o.srv != nil {
			o.srv.note("cut %d healed", r.cuts)
		}
	}
	return nil
}

// noteBalance writes how many partitions each node leads to the progress,
// and whether they are spread evenly, when settle did not wait for it.
func (t *clusterTarget) noteBalance() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cluster.ReadStatus(ctx, []string{t.etcd.Endpoint()}, clusterName)
	if err != nil {
		return
	}
	why := t.unstable(st, true)
	if why == "" {
		why = "balanced"
	}
	fmt.Fprintf(t.r.cfg.Progress, "note: replicas were re-created during the run; leaders after it: %s\n", why)
}

// raftNums reads every node's raft number (how its carrier's frames name it)
// from the cluster's status.
func (t *clusterTarget) raftNums() (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cluster.ReadStatus(ctx, []string{t.etcd.Endpoint()}, clusterName)
	if err != nil {
		return nil, fmt.Errorf("read the cluster's status: %w", err)
	}
	nums := map[string]uint64{}
	for _, n := range st.Nodes {
		if n.Num != 0 {
			nums[n.ID] = n.Num
		}
	}
	for _, n := range t.nodes {
		if nums[n.id] == 0 {
			return nil, fmt.Errorf("node %s has no raft number in the cluster's status", n.id)
		}
	}
	return nums, nil
}

// replicatedWait bounds the wait for a fully replicated cluster before a
// wipe; startWait at the start, where the nodes beyond the replication
// factor join and get their replicas one move after another.
const (
	replicatedWait = 30 * time.Second
	startWait      = 3 * time.Minute
)

// waitReplicated waits up to limit until every node runs and is live, and
// every partition is served by exactly ReplicationFactor live replicas (none
// under-replicated, no replica move in progress). It returns "" or why not.
func (t *clusterTarget) waitReplicated(limit time.Duration) string {
	deadline := time.Now().Add(limit)
	why := ""
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := cluster.ReadStatus(ctx, []string{t.etcd.Endpoint()}, clusterName)
		cancel()
		if err != nil {
			why = err.Error()
		} else if why = t.unreplicated(st); why == "" {
			return ""
		}
		time.Sleep(200 * time.Millisecond)
	}
	return why
}

func (t *clusterTarget) unreplicated(st *cluster.Status) string {
	for _, n := range t.nodes {
		if n.srv == nil {
			return fmt.Sprintf("node %s does not run", n.id)
		}
	}
	if why := t.unstable(st, false); why != "" {
		return why
	}
	for _, n := range st.Nodes {
		if n.State != cluster.NodeLive {
			return fmt.Sprintf("node %s is %s", n.ID, n.State)
		}
	}
	if st.UnderReplicated > 0 {
		return fmt.Sprintf("%d partitions under-replicated", st.UnderReplicated)
	}
	for _, p := range st.Parts {
		if len(p.Replicas) != t.r.cfg.ReplicationFactor {
			return fmt.Sprintf("partition %d has %d replicas (a move in progress, or not grown yet)", p.Partition, len(p.Replicas))
		}
		for _, rep := range p.Replicas {
			if rep.State != "live" {
				return fmt.Sprintf("partition %d: replica %d on %s is %s", p.Partition, rep.Replica, rep.Node, rep.State)
			}
		}
	}
	return ""
}

// leave stops n with SIGTERM: it hands its partitions off, then exits 0.
// Anything else is a failure; handOff says other nodes run to take them.
func (t *clusterTarget) leave(n *clusterNode, handOff bool) {
	srv := t.stopping(n)
	n.away = true
	srv.note("SIGTERM")
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.r.fail("node %s: SIGTERM: %v", n.id, err)
	}
	select {
	case <-srv.exited:
		if srv.err != nil {
			t.r.fail("node %s after SIGTERM: %v (log %s); its last lines:\n%s", n.id, srv.err, n.logFile, lastN(srv.lastLines(), 20))
			return
		}
	case <-time.After(leaveWait):
		t.r.fail("node %s did not exit within %v of its SIGTERM (log %s)", n.id, leaveWait, n.logFile)
		srv.kill()
		return
	}
	if !handOff {
		return
	}
	// Two nodes or more still run: every partition must have moved to them.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cluster.ReadStatus(ctx, []string{t.etcd.Endpoint()}, clusterName)
	if err != nil {
		t.r.fail("node %s left: read the cluster's status: %v", n.id, err)
		return
	}
	var kept []uint32
	for _, p := range st.Parts {
		if p.Owner == n.id {
			kept = append(kept, p.Partition)
		}
	}
	if len(kept) > 0 {
		t.r.fail("node %s exited 0 after its SIGTERM still owning partitions %v, which stay unavailable until it returns (log %s)",
			n.id, kept, n.logFile)
	}
}

func lastN(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// settle starts the nodes that left, waits for a settled cluster, kills every
// node at once, notes when the last had exited (lastKill), and starts them
// all again.
func (t *clusterTarget) settle(context.Context) error {
	for _, n := range t.nodes {
		if n.away {
			if err := t.startNode(n); err != nil {
				return err
			}
		}
	}
	if why := t.waitStable(!t.moved); why != "" {
		t.r.fail("the cluster did not settle within %v once the faults stopped: %s", stableWait, why)
	} else if t.moved {
		t.noteBalance()
	}
	for _, n := range t.nodes {
		t.stopping(n).kill()
	}
	t.lastKill = t.r.now()
	t.r.kills++
	fmt.Fprintf(t.r.cfg.Progress, "kill %d: every node at %.1fs\n", t.r.kills, time.Since(t.r.start).Seconds())
	for _, n := range t.nodes {
		if err := t.startNode(n); err != nil {
			return err
		}
	}
	if why := t.waitStable(false); why != "" {
		t.r.fail("the cluster did not serve every partition within %v of the last restart: %s", stableWait, why)
	}
	return nil
}

// finish stops the nodes with SIGTERM one after another; the last one keeps
// its partitions (no node is left to take them) and exits 0 all the same.
func (t *clusterTarget) finish(context.Context) error {
	running := 0
	for _, n := range t.nodes {
		if n.srv != nil {
			running++
		}
	}
	for _, n := range t.nodes {
		if n.srv != nil {
			running--
			t.leave(n, running > 0)
		}
	}
	return nil
}

// waitStable waits until etcd shows every node registered and every
// partition served with no handoff in progress (and, if balanced, the
// partitions spread evenly). It returns "" or why the cluster is not stable.
func (t *clusterTarget) waitStable(balanced bool) string {
	deadline := time.Now().Add(stableWait)
	why := ""
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := cluster.ReadStatus(ctx, []string{t.etcd.Endpoint()}, clusterName)
		cancel()
		if err != nil {
			why = err.Error()
		} else if why = t.unstable(st, balanced); why == "" {
			return ""
		}
		time.Sleep(200 * time.Millisecond)
	}
	return why
}

func (t *clusterTarget) unstable(st *cluster.Status, balanced bool) string {
	running := 0
	for _, n := range t.nodes {
		if n.srv != nil {
			running++
		}
	}
	if len(st.Nodes) != running {
		return fmt.Sprintf("%d nodes registered, %d running", len(st.Nodes), running)
	}
	count := map[string]int{}
	for _, p := range st.Parts {
		if !p.Available || p.Target != "" {
			return fmt.Sprintf("partition %d: owner %q epoch %d target %q available %v", p.Partition, p.Owner, p.Epoch, p.Target, p.Available)
		}
		count[p.Owner]++
	}
	if len(st.Parts) != clusterPartitions {
		return fmt.Sprintf("%d partitions in the table", len(st.Parts))
	}
	lo, hi := clusterPartitions, 0
	for _, n := range t.nodes {
		lo, hi = min(lo, count[n.id]), max(hi, count[n.id])
	}
	if balanced && hi-lo > 1 {
		return fmt.Sprintf("unbalanced: %v", count)
	}
	return ""
}

// boundUnknown: in a cluster, an unknown write is bounded only by the kill of
// every node at once (settle), not by the next kill after its error as with
// one server (boundUnknown in torture.go). That bound rests on one fact: the
// one process that had the request is dead after the kill. In a cluster the
// request passes from the node the client sent it to (the entry) to the owner
// of its partition, and the one that dies is often neither:
//
//   - The entry dies (the client sees its connection reset) after it
//     forwarded the request: the owner, alive, runs it whenever it gets to it.
//   - So the bound would be the next death of the partition's owner. But the
//     client does not know which node that is when the write runs: the entry
//     sends a request that certainly did not run (the node it asked no longer
//     serves the partition: a handoff) again to the new owner, until the
//     request's context ends, and that goes on after a client time-out.
//   - The owner's death ends what it held (a request travels on a connection
//     that dies with it; protoactor-go's remote, used until issue 28, kept
//     what was sent while it reconnected and delivered it to the owner's next
//     run). But by the point above, the request may be on its way to another
//     node by then.
//
// What does bound it: once every node process has exited at the same time,
// the clients having stopped before, no process holds the request any more;
// it took effect before that or never (only these processes write the nodes'
// data). So every unknown write stays possibly-applied until that last kill,
// and the check may place it anywhere from its call to the kill, or nowhere.
// A 503 that certainly did not run (a partition whose node is down) is
// unknown all the same: the reply does not tell them apart. The clients back
// off from an object that answered 503 (client) to keep these writes few.
func (t *clusterTarget) boundUnknown(h []porcupine.Operation) {
	boundUnknown(h, []int64{t.lastKill})
}

func (t *clusterTarget) close() {
	for _, n := range t.nodes {
		if n.srv != nil {
			t.stopping(n).kill()
		}
	}
	for _, n := range t.nodes {
		if n.raft != nil {
			n.raft.close()
		}
	}
	if t.etcd != nil {
		t.etcd.Close()
	}
}

// servedRE parses X-Holdfast-Served-By: node/partition/epoch.
var servedRE = regexp.MustCompile(`^([^/]+)/(\d+)/(\d+)$`)

// recordServed notes, in cluster mode, who served a reply asked at start: no
// two nodes may serve one partition under one epoch, or overlap in time.
func (r *run) recordServed(header string, start time.Time) {
	if r.own == nil || header == "" {
		return
	}
	m := servedRE.FindStringSubmatch(header)
	if m == nil {
		r.fail("a reply served by %q (node/partition/epoch expected)", header)
		return
	}
	p, _ := strconv.ParseUint(m[2], 10, 32)
	e, _ := strconv.ParseUint(m[3], 10, 64)
	if err := r.own.Record(m[1], uint32(p), e, start, time.Now()); err != nil {
		r.fail("ownership: %v", err)
	}
}
