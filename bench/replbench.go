package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/holdfast/holdfast/internal/freeport"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/internal/devetcd"
	"github.com/holdfast/holdfast/persistence"
)

// The replicated benchmark (issue 27, "Benchmarks"): three real `holdfast
// serve` processes (replicationFactor 3, failoverTimeout 1s) and an etcd
// embedded in the driver (internal/devetcd), all on 127.0.0.1, every request
// over HTTP to a running node picked at random. Two phases, each on a fresh
// cluster:
//
//   - failover: one writer per partition (one object each) increments its
//     object every replWritePeriod, one write at a time. The node that leads
//     the most partitions is killed (SIGKILL); for each object it led, the
//     time from the kill until a write of it was acknowledged by another
//     node. The node is started again on its data directory, and the next
//     kill waits until every partition is served by its first replica and
//     the replicas are balanced again. -replicated-kills kills.
//   - catch-up: -replicated-mib MiB of KV values (64 KiB each, in slots of
//     objects spread over every partition), then one node is killed, its data
//     directory removed, and it is started again with the same nodeId: its
//     old replicas are never run again, and the cluster gives it new ones,
//     filled by snapshot. The time from its start until the status
//     (cluster.ReadStatus) shows every partition served with three live
//     replicas, per GiB of payload.
//
// The driver, etcd and the three nodes share the machine's cores. Each node's
// log is <dir>/<phase>/<node>.log (kept with -dir).

// replWritePeriod is how often each failover writer writes: a light load
// (256 partitions: about 500 writes/s). A kill wakes every writer at once, so
// the figures are not rounded up to it.
const replWritePeriod = 500 * time.Millisecond

// replApp is the app the nodes are configured with.
const (
	replApp    = "app_bench"
	replKey    = "pk_bench"
	replSecret = "sk_bench_secret_0123456789"
	replName   = "rbench"
)

type replConfig struct {
	bin        string // the holdfast binary
	kills      int
	mib        int
	partitions int
	valueKiB   int
	// settleTimeout bounds each wait for the cluster to be served and
	// balanced, and the catch-up.
	settleTimeout time.Duration
	progress      io.Writer
	// noRebalance (tests) skips the waits for balanced leaderships after a
	// node's restart (RejoinSeconds and SettledSeconds stay 0): balancing
	// moves a few leaderships every 2 s and retries one after 30 s.
	noRebalance bool
}

// killFigures is one kill of the failover phase.
type killFigures struct {
	Victim string `json:"victim"`
	// Seconds has, per object the victim led, the time from the kill until
	// a write of it was acknowledged by another node.
	Seconds []float64 `json:"seconds"`
	// NotWritten counts the objects not written again within settleTimeout.
	NotWritten int `json:"notWritten,omitempty"`
	// RejoinSeconds is from the victim's restart until every partition was
	// served by its first replica and the replicas balanced again.
	RejoinSeconds float64 `json:"rejoinSeconds"`
}

// failoverResult is the failover phase's.
type failoverResult struct {
	Kills []killFigures `json:"kills"`
	// Writes and Failed count the writers' writes acknowledged and failed
	// (503, timeout, lost connection) over the whole phase.
	Writes int64  `json:"writes"`
	Failed int64  `json:"failed"`
	First  string `json:"firstFailure,omitempty"`
}

// catchupResult is the catch-up phase's.
type catchupResult struct {
	PayloadBytes int64   `json:"payloadBytes"`
	Objects      int     `json:"objects"`
	FillSeconds  float64 `json:"fillSeconds"`
	Victim       string  `json:"victim"`
	// VictimDiskBytes is the victim's data directory before it was wiped,
	// and after it caught up (blocks allocated).
	DiskBeforeBytes int64 `json:"diskBeforeBytes"`
	DiskAfterBytes  int64 `json:"diskAfterBytes"`
	// ReplicatedSeconds is from the victim's start on an empty directory
	// until every partition was served with all its replicas live; then
	// SettledSeconds until leaderships and replicas were balanced too.
	ReplicatedSeconds float64 `json:"replicatedSeconds"`
	SettledSeconds    float64 `json:"settledSeconds"`
	// SnapshotsReceived is the victim's holdfast_raft_snapshots_received_total
	// once caught up (-1: not read).
	SnapshotsReceived float64 `json:"snapshotsReceived"`
}

type replResult struct {
	Partitions int            `json:"partitions"`
	Failover   failoverResult `json:"failover"`
	Catchup    catchupResult  `json:"catchup"`
}

// replNode is one node: its files are kept across restarts.
type replNode struct {
	id, cfgFile, dataDir, logFile string
	proc                          *replProc // nil while it does not run
}

// replProc is one `holdfast serve` process. Its stderr goroutine copies the
// log and ends with the process; exited is closed then.
type replProc struct {
	cmd    *exec.Cmd
	url    string
	addr   chan string
	exited chan struct{}
}

// kill kills the process (SIGKILL) and waits until it exited.
func (p *replProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// replCluster is three nodes and their etcd.
type replCluster struct {
	cfg    replConfig
	etcd   *devetcd.Server
	nodes  []*replNode
	urls   atomic.Pointer[[]string] // the running nodes' HTTP addresses
	client *http.Client
}

// buildHoldfast builds ./cmd/holdfast into dir and returns its path.
func buildHoldfast(dir string) (string, error) {
	bin := filepath.Join(dir, "holdfast")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/holdfast/holdfast/cmd/holdfast")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build the holdfast binary: %w", err)
	}
	return bin, nil
}

// startReplCluster starts etcd and nodes a, b and c at once, and waits until
// the cluster is served and balanced.
func startReplCluster(dir string, cfg replConfig) (*replCluster, error) {
	e, err := devetcd.Start(devetcd.Config{Dir: filepath.Join(dir, "etcd")})
	if err != nil {
		return nil, err
	}
	c := &replCluster{cfg: cfg, etcd: e, client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	c.urls.Store(&[]string{})
	for _, id := range []string{"a", "b", "c"} {
		advertise, err := freeport.Addr()
		if err != nil {
			c.close()
			return nil, err
		}
		raftAddr, err := freeport.Addr()
		if err != nil {
			c.close()
			return nil, err
		}
		n := &replNode{id: id, cfgFile: filepath.Join(dir, id+".yaml"), dataDir: filepath.Join(dir, id), logFile: filepath.Join(dir, id+".log")}
		conf := fmt.Sprintf("apps:\n  - {id: %s, key: %s, secret: %s}\n", replApp, replKey, replSecret) +
			fmt.Sprintf("cold: {fs: {dir: '%s', shared: true}}\npartitions: %d\n", filepath.Join(dir, "cold"), cfg.partitions) +
			fmt.Sprintf("cluster: {name: %s, nodeId: %s, advertise: '%s', raftAdvertise: '%s', etcd: {endpoints: ['%s']}, replicationFactor: 3, failoverTimeout: 1s}\n",
				replName, id, advertise, raftAddr, e.Endpoint())
		if err := os.WriteFile(n.cfgFile, []byte(conf), 0o644); err != nil {
			c.close()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	start := time.Now()
	if err := c.start(c.nodes...); err != nil {
		c.close()
		return nil, err
	}
	if _, err := c.waitFor(true); err != nil {
		c.close()
		return nil, err
	}
	c.logf("cluster of 3 nodes, %d partitions, served and balanced %.1fs after the start (logs in %s)", cfg.partitions, time.Since(start).Seconds(), dir)
	return c, nil
}

func (c *replCluster) logf(format string, a ...any) {
	fmt.Fprintf(c.cfg.progress, "replicated: "+format+"\n", a...)
}

var replListenRE = regexp.MustCompile(`"holdfast listening" addr=(\S+)`)

// start starts nodes at once and waits until each listens.
func (c *replCluster) start(nodes ...*replNode) error {
	var procs []*replProc
	var err error
	for _, n := range nodes {
		var p *replProc
		if p, err = c.launch(n); err != nil {
			break
		}
		procs = append(procs, p)
	}
	for i, p := range procs {
		if err != nil { // a later launch failed: stop the ones started
			p.kill()
			continue
		}
		select {
		case a := <-p.addr:
			p.url = "http://" + a
			nodes[i].proc = p
		case <-p.exited:
			err = fmt.Errorf("node %s exited at its start (log %s)", nodes[i].id, nodes[i].logFile)
		case <-time.After(60 * time.Second):
			p.kill()
			err = fmt.Errorf("node %s did not listen within 60s (log %s)", nodes[i].id, nodes[i].logFile)
		}
	}
	c.publish()
	return err
}

// launch starts n's process; its stderr goes to n.logFile.
func (c *replCluster) launch(n *replNode) (*replProc, error) {
	logw, err := os.OpenFile(n.logFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(c.cfg.bin, "serve", "--data-dir", n.dataDir, "--listen", "127.0.0.1:0", "--config", n.cfgFile)
	cmd.Env = append(os.Environ(), "HOLDFAST_TEST_SERVED_HEADER=1") // who served each reply
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logw.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logw.Close()
		return nil, fmt.Errorf("start %s: %w", c.cfg.bin, err)
	}
	p := &replProc{cmd: cmd, addr: make(chan string, 1), exited: make(chan struct{})}
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			_, _ = io.WriteString(logw, line+"\n")
			if m := replListenRE.FindStringSubmatch(line); m != nil {
				select {
				case p.addr <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(logw, stderr) // a line too long for the scanner
		err := cmd.Wait()
		fmt.Fprintf(logw, "rbench: %s the process exited: %v\n", time.Now().UTC().Format(time.RFC3339Nano), err)
		logw.Close()
	}()
	return p, nil
}

// kill kills n (SIGKILL) once it is out of the writers' URLs.
func (c *replCluster) kill(n *replNode) {
	p := n.proc
	n.proc = nil
	c.publish()
	p.kill()
}

// publish stores the running nodes' URLs for the writers.
func (c *replCluster) publish() {
	var urls []string
	for _, n := range c.nodes {
		if n.proc != nil {
			urls = append(urls, n.proc.url)
		}
	}
	c.urls.Store(&urls)
}

// anyURL is a running node's URL, at random ("" if none runs).
func (c *replCluster) anyURL() string {
	urls := *c.urls.Load()
	if len(urls) == 0 {
		return ""
	}
	return urls[rand.Intn(len(urls))]
}

// close kills the nodes and stops etcd.
func (c *replCluster) close() {
	for _, n := range c.nodes {
		if n.proc != nil {
			c.kill(n)
		}
	}
	c.etcd.Close()
}

// status reads the cluster's status from etcd.
func (c *replCluster) status() (*cluster.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return cluster.ReadStatus(ctx, []string{c.etcd.Endpoint()}, replName)
}

// waitFor polls the status every 100 ms until replShort finds nothing
// missing, for settleTimeout at most.
func (c *replCluster) waitFor(settled bool) (*cluster.Status, error) {
	why := ""
	for deadline := time.Now().Add(c.cfg.settleTimeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, err := c.status()
		if err != nil {
			why = err.Error()
			continue
		}
		if why = replShort(st, settled); why == "" {
			return st, nil
		}
	}
	return nil, fmt.Errorf("the cluster is not fully replicated (settled: %v) after %v: %s", settled, c.cfg.settleTimeout, why)
}

// replShort says what keeps st from being fully replicated ("": nothing):
// every partition served, with ReplicationFactor replicas, all live on live
// nodes. If settled, also where balancing leaves a cluster with every node
// up: each partition led by its first replica, and the nodes' replica counts
// and first-replica counts differ by one at most.
func replShort(st *cluster.Status, settled bool) string {
	if st.Served != st.Partitions || st.UnderReplicated != 0 || len(st.Parts) != st.Partitions {
		return fmt.Sprintf("%d of %d partitions served, %d under-replicated", st.Served, st.Partitions, st.UnderReplicated)
	}
	live := map[string]bool{}
	for _, n := range st.Nodes {
		live[n.ID] = n.State == cluster.NodeLive
	}
	on, first := map[string]int{}, map[string]int{}
	for _, p := range st.Parts {
		if len(p.Replicas) != st.ReplicationFactor {
			return fmt.Sprintf("partition %d has %d replicas", p.Partition, len(p.Replicas))
		}
		for _, r := range p.Replicas {
			if r.State != "live" || !live[r.Node] {
				return fmt.Sprintf("partition %d's replica on %s is %s", p.Partition, r.Node, r.State)
			}
			on[r.Node]++
		}
		first[p.Replicas[0].Node]++
		if settled && p.Leader != p.Replicas[0].Node {
			return fmt.Sprintf("partition %d led by %s, not by its first replica %s", p.Partition, p.Leader, p.Replicas[0].Node)
		}
	}
	if !settled {
		return ""
	}
	for _, counts := range []map[string]int{on, first} {
		lo, hi := st.Partitions*st.ReplicationFactor, 0
		for id, ok := range live {
			if ok {
				lo, hi = min(lo, counts[id]), max(hi, counts[id])
			}
		}
		if hi-lo > 1 {
			return fmt.Sprintf("not balanced over the live nodes yet: replicas %v, first replicas %v", on, first)
		}
	}
	return ""
}

// served parses X-Holdfast-Served-By: node/partition/epoch.
func parseServedBy(h string) (node string, partition uint32, ok bool) {
	parts := strings.Split(h, "/")
	if len(parts) != 3 {
		return "", 0, false
	}
	p, err := strconv.ParseUint(parts[1], 10, 32)
	return parts[0], uint32(p), err == nil && parts[0] != ""
}

// call sends one request to url+path and returns its status and who served it.
func (c *replCluster) call(ctx context.Context, method, url, path string, body []byte) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, method, url+path, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("X-App-Key", replKey)
	req.Header.Set("X-App-Secret", replSecret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, "", fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	return resp.StatusCode, resp.Header.Get("X-Holdfast-Served-By"), nil
}

// replObjects returns, per partition, the key of an object of type typ in it.
func replObjects(typ string, partitions int) []string {
	out := make([]string, partitions)
	left := partitions
	for i := 0; left > 0; i++ {
		key := fmt.Sprintf("k%d", i)
		p := persistence.Partition(actors.ObjectID{App: replApp, Type: typ, Key: key}, partitions)
		if out[p] == "" {
			out[p], left = key, left-1
		}
	}
	return out
}

// ack is an acknowledged write: when, and which node served it.
type ack struct {
	at   time.Time
	node string
}

// failoverLoad is one writer per partition, each incrementing its object
// every replWritePeriod, or at once after a kick.
type failoverLoad struct {
	c    *replCluster
	objs []string

	mu   sync.Mutex
	acks [][]ack       // per partition
	kick chan struct{} // closed by kickAll, then replaced

	writes, failed atomic.Int64
	first          atomic.Value // the first failure, a string
	cancel         context.CancelFunc
	wg             sync.WaitGroup
}

// startLoad starts the writers. Each one's first write checks that the node
// puts the object in the partition replObjects says.
func startLoad(c *replCluster, objs []string) *failoverLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &failoverLoad{c: c, objs: objs, acks: make([][]ack, len(objs)), kick: make(chan struct{}), cancel: cancel}
	for p, key := range objs {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.write(ctx, p, key)
		}()
	}
	return l
}

// write is partition p's writer, until ctx ends.
func (l *failoverLoad) write(ctx context.Context, p int, key string) {
	path := fmt.Sprintf("/api/v1/objects/%s/probe/%s/n/increment", replApp, key)
	for ctx.Err() == nil {
		l.mu.Lock()
		kick := l.kick
		l.mu.Unlock()
		url := l.c.anyURL()
		wait := replWritePeriod
		if url == "" {
			wait = 20 * time.Millisecond
		} else if _, by, err := l.c.call(ctx, "POST", url, path, []byte(`{"by": 1}`)); err != nil {
			if ctx.Err() == nil && l.failed.Add(1) == 1 {
				l.first.Store(err.Error())
			}
			wait = 20 * time.Millisecond // failing: try again soon
		} else {
			at := time.Now()
			node, part, ok := parseServedBy(by)
			if !ok || part != uint32(p) {
				l.first.CompareAndSwap(nil, fmt.Sprintf("object %s: served-by %q, want partition %d", key, by, p))
				l.failed.Add(1)
			}
			l.writes.Add(1)
			l.mu.Lock()
			l.acks[p] = append(l.acks[p], ack{at, node})
			l.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-kick:
		case <-time.After(wait):
		}
	}
}

// kickAll wakes every writer at once.
func (l *failoverLoad) kickAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	close(l.kick)
	l.kick = make(chan struct{})
}

// firstAfter is the first write of partition p acknowledged after t by a node
// other than not.
func (l *failoverLoad) firstAfter(p uint32, t time.Time, not string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.acks[p] {
		if a.at.After(t) && a.node != not {
			return a.at, true
		}
	}
	return time.Time{}, false
}

// stop stops the writers and waits for them.
func (l *failoverLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

// replFailover is the failover phase.
func replFailover(dir string, cfg replConfig) (failoverResult, error) {
	c, err := startReplCluster(dir, cfg)
	if err != nil {
		return failoverResult{}, err
	}
	defer c.close()
	load := startLoad(c, replObjects("probe", cfg.partitions))
	defer load.stop()
	var r failoverResult
	for i := range cfg.kills {
		k, err := c.killLeader(load)
		if err != nil {
			return r, fmt.Errorf("kill %d: %w", i+1, err)
		}
		r.Kills = append(r.Kills, k)
		s := summarize(k.Seconds)
		c.logf("kill %d of %d: %s led %d partitions; written again after p50 %.2fs, max %.2fs (%d not written); rejoined in %.1fs",
			i+1, cfg.kills, k.Victim, len(k.Seconds)+k.NotWritten, s.Median, s.Max, k.NotWritten, k.RejoinSeconds)
	}
	load.stop()
	r.Writes, r.Failed = load.writes.Load(), load.failed.Load()
	r.First, _ = load.first.Load().(string)
	return r, nil
}

// killLeader waits until the cluster is served and balanced, kills the node
// that leads the most partitions, measures when each object it led was
// written again, restarts it on its data and waits until the cluster is
// balanced again.
func (c *replCluster) killLeader(load *failoverLoad) (killFigures, error) {
	st, err := c.waitFor(true)
	if err != nil {
		return killFigures{}, err
	}
	count := map[string]int{}
	for _, p := range st.Parts {
		count[p.Leader]++
	}
	victim := c.nodes[0]
	for _, n := range c.nodes[1:] {
		if count[n.id] > count[victim.id] {
			victim = n
		}
	}
	var led []uint32
	for _, p := range st.Parts {
		if p.Leader == victim.id {
			led = append(led, p.Partition)
		}
	}
	k := killFigures{Victim: victim.id}
	t0 := time.Now()
	c.kill(victim)
	load.kickAll()
	// Poll until every object it led was written again, or the deadline.
	deadline := t0.Add(c.cfg.settleTimeout)
	took := map[uint32]time.Duration{}
	for len(took) < len(led) && time.Now().Before(deadline) {
		for _, p := range led {
			if _, done := took[p]; !done {
				if at, ok := load.firstAfter(p, t0, victim.id); ok {
					took[p] = at.Sub(t0)
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, p := range led {
		if d, ok := took[p]; ok {
			k.Seconds = append(k.Seconds, d.Seconds())
		} else {
			k.NotWritten++
		}
	}
	restart := time.Now()
	if err := c.start(victim); err != nil {
		return k, err
	}
	if c.cfg.noRebalance {
		return k, nil
	}
	if _, err := c.waitFor(true); err != nil {
		return k, err
	}
	k.RejoinSeconds = time.Since(restart).Seconds()
	return k, nil
}

// replCatchup is the catch-up phase.
func replCatchup(dir string, cfg replConfig) (catchupResult, error) {
	c, err := startReplCluster(dir, cfg)
	if err != nil {
		return catchupResult{}, err
	}
	defer c.close()
	r, err := c.fill()
	if err != nil {
		return r, err
	}
	c.logf("filled %d MiB in %d objects in %.1fs", r.PayloadBytes>>20, r.Objects, r.FillSeconds)
	if _, err := c.waitFor(true); err != nil {
		return r, err
	}
	victim := c.nodes[len(c.nodes)-1]
	r.Victim = victim.id
	r.DiskBeforeBytes = diskUsage(victim.dataDir)
	c.kill(victim)
	if err := os.RemoveAll(victim.dataDir); err != nil {
		return r, err
	}
	start := time.Now()
	if err := c.start(victim); err != nil {
		return r, err
	}
	if _, err := c.waitFor(false); err != nil {
		return r, err
	}
	r.ReplicatedSeconds = time.Since(start).Seconds()
	if !c.cfg.noRebalance {
		if _, err := c.waitFor(true); err != nil {
			return r, err
		}
		r.SettledSeconds = time.Since(start).Seconds()
	}
	r.DiskAfterBytes = diskUsage(victim.dataDir)
	r.SnapshotsReceived = c.metric(victim, "holdfast_raft_snapshots_received_total")
	c.logf("%s rebuilt from nothing: fully replicated %.1fs after its start, balanced after %.1fs, %.0f snapshots received",
		victim.id, r.ReplicatedSeconds, r.SettledSeconds, r.SnapshotsReceived)
	return r, nil
}

// fill writes cfg.mib MiB of values of cfg.valueKiB KiB, each into a slot
// of its own, over objects spread evenly over the partitions (8 MiB each at
// most, half an object's limit), 16 writes in flight.
func (c *replCluster) fill() (catchupResult, error) {
	valueBytes := c.cfg.valueKiB << 10
	writes := max(1, int64(c.cfg.mib)<<20/int64(valueBytes))
	perObject := max(1, (8<<20)/valueBytes)
	perPart := max(1, int((writes+int64(perObject*c.cfg.partitions)-1)/int64(perObject*c.cfg.partitions)))
	var objs []string
	for i := range perPart {
		for _, key := range replObjects("fill", c.cfg.partitions) {
			objs = append(objs, fmt.Sprintf("%s-%d", key, i))
		}
	}
	// The keys of replObjects with a suffix fall in other partitions, but
	// spread evenly all the same (the partition is a hash of the key).
	value := make([]byte, valueBytes-2)
	for i := range value {
		value[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[rand.Intn(36)]
	}
	body, _ := json.Marshal(map[string]string{"value": string(value)})
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := next.Add(1) - 1; j < writes && failed.Load() == nil; j = next.Add(1) - 1 {
				path := fmt.Sprintf("/api/v1/objects/%s/fill/%s/s%d", replApp, objs[j%int64(len(objs))], j/int64(len(objs)))
				if err := c.put(path, body); err != nil {
					failed.Store(err)
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return catchupResult{}, fmt.Errorf("fill: %w", err)
	}
	return catchupResult{PayloadBytes: writes * int64(valueBytes), Objects: len(objs), FillSeconds: time.Since(start).Seconds()}, nil
}

// put sets a slot, sending it again after a 503 or a lost connection for a
// minute at most (a set sent twice sets the same value).
func (c *replCluster) put(path string, body []byte) error {
	var err error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var status int
		if status, _, err = c.call(context.Background(), "PUT", c.anyURL(), path, body); err == nil {
			return nil
		}
		if status != 0 && status != http.StatusServiceUnavailable {
			return err
		}
	}
	return err
}

// metric reads a counter from n's /metrics; -1 if it cannot.
func (c *replCluster) metric(n *replNode, name string) float64 {
	resp, err := c.client.Get(n.proc.url + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
				return v
			}
		}
	}
	return -1
}

// runReplicated runs both phases, in directories under base, and prints the
// report. It removes base at the end if temporary (os.Exit skips main's
// defers), but not after a failure: the nodes' logs are there.
func runReplicated(base string, cfg replConfig, temporary bool, mdOut, jsonOut string) int {
	r, err := replicated(base, cfg)
	if err != nil {
		fatal(fmt.Errorf("%w (the nodes' logs are in %s)", err, base))
	}
	if temporary {
		os.RemoveAll(base)
	}
	var out bytes.Buffer
	writeReplReport(io.MultiWriter(os.Stdout, &out), cfg, r)
	if mdOut != "" {
		writeFile(mdOut, out.Bytes())
	}
	if jsonOut != "" {
		b, _ := json.MarshalIndent(r, "", "  ")
		writeFile(jsonOut, b)
	}
	return 0
}

// replicated runs both phases; it builds the binary first unless cfg names one.
func replicated(base string, cfg replConfig) (replResult, error) {
	if cfg.bin == "" {
		var err error
		if cfg.bin, err = buildHoldfast(base); err != nil {
			return replResult{}, err
		}
	}
	r := replResult{Partitions: cfg.partitions}
	var err error
	if r.Failover, err = replFailover(filepath.Join(base, "failover"), cfg); err != nil {
		return r, fmt.Errorf("failover: %w", err)
	}
	if r.Catchup, err = replCatchup(filepath.Join(base, "catchup"), cfg); err != nil {
		return r, fmt.Errorf("catch-up: %w", err)
	}
	return r, nil
}

// writeReplReport prints the tables.
func writeReplReport(w io.Writer, cfg replConfig, r replResult) {
	fmt.Fprintf(w, "Three `holdfast serve` processes (replicationFactor 3, %d partitions, failoverTimeout 1s) and an etcd embedded in the driver, all on this machine's %d cores (shared), requests over HTTP to a running node at random.\n\n",
		r.Partitions, runtime.NumCPU())
	var all, maxes []float64
	notWritten := 0
	for _, k := range r.Failover.Kills {
		all = append(all, k.Seconds...)
		maxes = append(maxes, summarize(k.Seconds).Max)
		notWritten += k.NotWritten
	}
	slices.Sort(all)
	q := func(xs []float64, f float64) float64 {
		if len(xs) == 0 {
			return 0
		}
		return xs[int(float64(len(xs)-1)*f)]
	}
	fmt.Fprintf(w, "| failover: kill -9 of the node leading the most partitions, %d kills, one writer per partition (a write every %v through a random live node) | value |\n|---|---|\n",
		len(r.Failover.Kills), replWritePeriod)
	var led, rejoin []float64
	for _, k := range r.Failover.Kills {
		led = append(led, float64(len(k.Seconds)+k.NotWritten))
		rejoin = append(rejoin, k.RejoinSeconds)
	}
	fmt.Fprintf(w, "| partitions the killed node led, per kill | %s |\n", fmtStat(summarize(led), "%.0f"))
	fmt.Fprintf(w, "| kill until the object took an acknowledged write again: p50 over every object of every kill | %.2f s |\n", q(all, 0.5))
	fmt.Fprintf(w, "| the same: p99; max (target < 3 s) | %.2f s; **%.2f s** |\n", q(all, 0.99), q(all, 1))
	var per []string
	for _, m := range maxes {
		per = append(per, fmt.Sprintf("%.2f", m))
	}
	fmt.Fprintf(w, "| the max of each kill, s | %s |\n", strings.Join(per, ", "))
	fmt.Fprintf(w, "| objects not written again within %v | %d |\n", cfg.settleTimeout, notWritten)
	fmt.Fprintf(w, "| restart of the killed node on its data until every partition was led by its first replica again, s | %s |\n", fmtStat(summarize(rejoin), "%.1f"))
	fmt.Fprintf(w, "| writes acknowledged; failed (503, timeout, lost connection) over the phase | %d; %d |\n\n", r.Failover.Writes, r.Failover.Failed)
	cu := r.Catchup
	const mib = 1 << 20
	gib := float64(cu.PayloadBytes) / (1 << 30)
	fmt.Fprintf(w, "| catch-up: a node restarted on an empty data directory (same nodeId) | value |\n|---|---|\n")
	fmt.Fprintf(w, "| payload: KV values of %d KiB, one slot each, in %d objects over the %d partitions | %d MiB |\n", cfg.valueKiB, cu.Objects, r.Partitions, cu.PayloadBytes/mib)
	fmt.Fprintf(w, "| fill: 16 writes in flight, MiB/s | %.1f |\n", float64(cu.PayloadBytes)/mib/cu.FillSeconds)
	fmt.Fprintf(w, "| node %s's data directory before the wipe; after the catch-up, MiB | %.0f; %.0f |\n", cu.Victim, float64(cu.DiskBeforeBytes)/mib, float64(cu.DiskAfterBytes)/mib)
	fmt.Fprintf(w, "| its start until every partition was served with 3 live replicas, s | %.1f |\n", cu.ReplicatedSeconds)
	fmt.Fprintf(w, "| **seconds per GiB of payload**; MiB/s | **%.1f**; %.1f |\n", cu.ReplicatedSeconds/gib, float64(cu.PayloadBytes)/mib/cu.ReplicatedSeconds)
	fmt.Fprintf(w, "| its start until leaderships and replicas were balanced again, s | %.1f |\n", cu.SettledSeconds)
	fmt.Fprintf(w, "| snapshots it received (holdfast_raft_snapshots_received_total) | %.0f |\n", cu.SnapshotsReceived)
	if r.Failover.First != "" {
		fmt.Fprintf(w, "\nThe first write that failed in the failover phase: %s\n", r.Failover.First)
	}
}
