package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/internal/devetcd"
	"github.com/holdfast/holdfast/internal/ownership"
	"github.com/holdfast/holdfast/internal/tcpproxy"
)

// The multi-process tier: an etcd process and several `holdfast serve`
// processes on 127.0.0.1, with SIGKILL, joins and graceful leaves under load.

// runTestEtcd is the etcd process: the test binary run with HOLDFAST_TEST_ETCD
// set to the data directory, serving until it is signalled.
func runTestEtcd() {
	e, err := devetcd.Start(devetcd.Config{Dir: os.Getenv("HOLDFAST_TEST_ETCD")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "etcd ready %s\n", e.Endpoint())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	e.Close()
}

var etcdReadyRE = regexp.MustCompile(`etcd ready (\S+)`)

// startEtcd starts the etcd process and returns its client endpoint.
func startEtcd(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HOLDFAST_TEST_ETCD="+t.TempDir())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := etcdReadyRE.FindStringSubmatch(sc.Text()); m != nil {
				ready <- m[1]
			}
		}
	}()
	select {
	case ep := <-ready:
		return ep
	case <-time.After(60 * time.Second):
		t.Fatal("etcd did not start")
	}
	return ""
}

// freeAddr returns an address on 127.0.0.1 that nothing listens on now.
//
// The port is below the kernel's ephemeral range: a node killed and started
// again listens on the same address, and meanwhile a port of that range can be
// given to any outgoing connection on the machine (CI: "bind: address already
// in use" at a restart in TestCluster_ProcessesLogCrash, with other packages'
// tests running beside it). A port below it is only ever bound on purpose;
// this test binary never hands out one twice. The port after it is free and
// kept too: a replicated node's raft transport listens there (cluster.bind).
func freeAddr(t *testing.T) string {
	t.Helper()
	low := ephemeralLow()
	freePorts.Lock()
	defer freePorts.Unlock()
	for range 1000 {
		port := freePortFloor + rand.Intn(low-1-freePortFloor)
		if freePorts.given[port] || freePorts.given[port+1] || !canListen(port) || !canListen(port+1) {
			continue // given already, or bound by someone else
		}
		freePorts.given[port], freePorts.given[port+1] = true, true
		return fmt.Sprintf("127.0.0.1:%d", port)
	}
	t.Fatalf("no free port in [%d, %d) after 1,000 tries", freePortFloor, low)
	return ""
}

// canListen reports whether a listener can bind 127.0.0.1:port now.
func canListen(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// freePortFloor is the lowest port freeAddr picks (above the well-known and
// the usual servers' ports).
const freePortFloor = 20000

// freePorts are the ports freeAddr gave out in this process.
var freePorts = struct {
	sync.Mutex
	given map[int]bool
}{given: map[int]bool{}}

// ephemeralLow is the first port of the kernel's ephemeral range (32768, the
// Linux default, when it cannot be read or leaves no room below it).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low <= freePortFloor+1000 {
		return 32768
	}
	return low
}

// procCluster is a cluster of holdfast processes.
type procCluster struct {
	t       *testing.T
	etcd    string
	name    string
	dir     string
	mu      sync.Mutex
	servers map[string]*server
	check   *ownership.Checker
	own     *rand.Rand // for url(nil)
	types   string
	// etcdVia, when set for a node, is the etcd address it is configured with
	// (a proxy the test can block).
	etcdVia map[string]string
	// hook, when set, sees every served reply.
	hook func(node string, partition uint32, epoch uint64, start, end time.Time)
	// started holds every node process started, in order, for the logs.
	started []startedNode
	// leaseTTL, when set, is the nodes' cluster.leaseTtl (else 2s).
	leaseTTL string
	// clusterYAML, when set, gives node id's further entries of its cluster
	// map (flow style, e.g. "replicationFactor: 3, raftBind: '...'"), written
	// with its config at its first start.
	clusterYAML func(id string) string
	// topYAML, when set, is more top-level configuration every node gets.
	topYAML string
}

type startedNode struct {
	id string
	s  *server
}

// keepLogs, when the test failed, writes every node's log to a directory that
// outlives the test and repeats the cluster's own messages (not the requests)
// in the test's output.
func (pc *procCluster) keepLogs() {
	if !pc.t.Failed() {
		return
	}
	dir, err := os.MkdirTemp("", "holdfast-cluster-logs-")
	if err != nil {
		pc.t.Log(err)
		return
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for i, n := range pc.started {
		text := n.s.log()
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%02d-%s.log", i, n.id)), []byte(text), 0o644)
		own := text
		if at := strings.Index(text, "SIGQUIT: quit"); at >= 0 {
			own = text[:at]
		}
		var keep []string
		for _, line := range strings.Split(own, "\n") {
			// Per-request lines (served or failed) would fill the window.
			if !strings.Contains(line, "msg=request") && !strings.Contains(line, `msg="request failed"`) && line != "" {
				keep = append(keep, line)
			}
		}
		pc.t.Logf("node %s (start %d), its own messages:\n%s", n.id, i, strings.Join(keep[max(0, len(keep)-80):], "\n"))
		if dump := requestGoroutines(text); dump != "" {
			pc.t.Logf("node %s (start %d), its goroutines on a request's path when the test ended:\n%s", n.id, i, dump)
		}
	}
	pc.t.Logf("node logs kept in %s", dir)
}

// requestGoroutines returns, from a log that ends in the goroutine dump of a
// SIGQUIT, the goroutines on a request's path (at most 150 lines).
func requestGoroutines(log string) string {
	at := strings.Index(log, "SIGQUIT: quit")
	if at < 0 {
		return ""
	}
	var out []string
	for _, g := range strings.Split(log[at:], "\n\n") {
		for _, mark := range []string{"(*Host).Request", "(*member).request", "(*member).forward", "WaitApplied", "(*Pipeline).Barrier"} {
			if strings.Contains(g, mark) {
				for _, line := range strings.Split(g, "\n") {
					if at := strings.Index(line, " fp="); at >= 0 {
						line = line[:at] // frame addresses say nothing here
					}
					out = append(out, line)
				}
				break
			}
		}
	}
	return strings.Join(out[:min(len(out), 150)], "\n")
}

// newProcCluster starts the etcd process; types is the YAML under "types:"
// every node gets besides the defaults.
func newProcCluster(t *testing.T, types string) *procCluster {
	t.Setenv("HOLDFAST_TEST_SERVED_HEADER", "1")
	pc := &procCluster{t: t, etcd: startEtcd(t), name: "mp", dir: t.TempDir(), types: types, servers: map[string]*server{}, check: ownership.New()}
	t.Cleanup(pc.keepLogs)
	return pc
}

// start starts (or restarts, on its data) node id.
func (pc *procCluster) start(id string) *server {
	pc.t.Helper()
	return pc.startAll(id)[0]
}

// startAll starts (or restarts) nodes ids at once, and waits until each
// listens.
func (pc *procCluster) startAll(ids ...string) []*server {
	pc.t.Helper()
	var out []*server
	for _, id := range ids {
		out = append(out, launchServerCmd(pc.t, pc.serveCmd(id)))
	}
	for i, s := range out {
		s.waitListening(pc.t)
		pc.mu.Lock()
		pc.servers[ids[i]] = s
		pc.started = append(pc.started, startedNode{ids[i], s})
		pc.mu.Unlock()
	}
	return out
}

// serveCmd is node id's `serve` command; it writes the node's configuration
// at its first start.
func (pc *procCluster) serveCmd(id string) *exec.Cmd {
	pc.t.Helper()
	cfgFile := filepath.Join(pc.dir, id+".yaml")
	if _, err := os.Stat(cfgFile); err != nil {
		extra := ", replicationFactor: 1" // one copy, unless the test says otherwise
		if pc.clusterYAML != nil {
			extra = ", " + pc.clusterYAML(id)
		}
		cfg := fmt.Sprintf("apps:\n  - {id: app_crash, key: %s, secret: %s}\n"+
			"partitions: 32\n"+
			"types:\n  \"*\":\n    objects: {changeLogEntries: 1000000}\n%s"+pc.topYAML+
			"cluster: {name: %s, nodeId: %s, advertise: '%s', etcd: {endpoints: ['%s']}, leaseTtl: %s%s}\n",
			crashAppKey, crashAppSecret, pc.types, pc.name, id, freeAddr(pc.t), pc.etcdFor(id), cmp.Or(pc.leaseTTL, "2s"), extra)
		if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
			pc.t.Fatal(err)
		}
	}
	return exec.Command(os.Args[0], "-test.run=^$", "--", "serve", "--data-dir", filepath.Join(pc.dir, id), "--listen", "127.0.0.1:0", "--config", cfgFile)
}

// etcdFor is the etcd endpoint node id is configured with.
func (pc *procCluster) etcdFor(id string) string {
	if a, ok := pc.etcdVia[id]; ok {
		return a
	}
	return pc.etcd
}

func (pc *procCluster) kill(id string) {
	pc.mu.Lock()
	s := pc.servers[id]
	delete(pc.servers, id)
	pc.mu.Unlock()
	s.kill(pc.t)
}

// leave stops node id with SIGTERM: it hands its partitions off, then exits 0.
func (pc *procCluster) leave(id string) {
	pc.mu.Lock()
	s := pc.servers[id]
	delete(pc.servers, id)
	pc.mu.Unlock()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		pc.t.Fatal(err)
	}
	select {
	case err := <-s.exited:
		if err != nil {
			pc.t.Fatalf("node %s after SIGTERM: %v\n%s", id, err, s.log())
		}
	case <-time.After(90 * time.Second):
		pc.t.Fatalf("node %s did not leave within 90s", id)
	}
}

func (pc *procCluster) urls() []string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	var out []string
	for _, s := range pc.servers {
		out = append(out, s.url)
	}
	return out
}

// waitStable waits until etcd shows every partition available, no move in
// progress, and exactly the running nodes, each with a fair share.
func (pc *procCluster) waitStable(timeout time.Duration) *cluster.Status {
	pc.t.Helper()
	deadline := time.Now().Add(timeout)
	var why string
	for time.Now().Before(deadline) {
		st, err := cluster.ReadStatus(context.Background(), []string{pc.etcd}, pc.name)
		if err != nil {
			why = err.Error()
		} else if why = pc.unstable(st); why == "" {
			return st
		}
		time.Sleep(200 * time.Millisecond)
	}
	pc.t.Fatalf("cluster not stable after %v: %s", timeout, why)
	return nil
}

func (pc *procCluster) unstable(st *cluster.Status) string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	registered := 0
	for _, n := range st.Nodes {
		if n.State != cluster.NodeDown {
			registered++
		}
	}
	if registered != len(pc.servers) {
		return fmt.Sprintf("%d nodes registered, %d running", registered, len(pc.servers))
	}
	count := map[string]int{}
	for _, p := range st.Parts {
		if !p.Available || p.Target != "" {
			return fmt.Sprintf("partition %+v", p)
		}
		count[p.Owner]++
	}
	lo, hi := st.Partitions, 0
	for id := range pc.servers {
		lo, hi = min(lo, count[id]), max(hi, count[id])
	}
	if hi-lo > 1 {
		return fmt.Sprintf("unbalanced %v", count)
	}
	return ""
}

// requestIDRE matches the request id an error body repeats.
var requestIDRE = regexp.MustCompile(`"request_id":"[0-9a-f]+"`)

// servedRE parses X-Holdfast-Served-By.
var servedRE = regexp.MustCompile(`^([^/]+)/(\d+)/(\d+)$`)

// callServed is call that also records, in the ownership checker, who served.
func (pc *procCluster) callServed(ctx context.Context, c *http.Client, method, url string, body any) (int, map[string]any, error) {
	status, reply, _, err := pc.callServedBy(ctx, c, method, url, body)
	return status, reply, err
}

// callServedBy is callServed that also returns the X-Holdfast-Served-By header.
func (pc *procCluster) callServedBy(ctx context.Context, c *http.Client, method, url string, body any) (int, map[string]any, string, error) {
	return pc.callServedWith(ctx, c, method, url, body, nil)
}

// callServedWith is callServedBy with further request headers (nil: none).
func (pc *procCluster) callServedWith(ctx context.Context, c *http.Client, method, url string, body any, header http.Header) (int, map[string]any, string, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, "", err
	}
	req.Header.Set("X-App-Key", crashAppKey)
	req.Header.Set("X-App-Secret", crashAppSecret)
	for k, v := range header {
		req.Header[k] = v
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	end := time.Now()
	if err != nil {
		return resp.StatusCode, nil, "", err
	}
	if resp.StatusCode == http.StatusOK {
		m := servedRE.FindStringSubmatch(resp.Header.Get("X-Holdfast-Served-By"))
		if m == nil {
			pc.t.Errorf("%s %s: no X-Holdfast-Served-By header (%q)", method, url, resp.Header.Get("X-Holdfast-Served-By"))
		} else {
			p, _ := strconv.ParseUint(m[2], 10, 32)
			e, _ := strconv.ParseUint(m[3], 10, 64)
			if err := pc.check.Record(m[1], uint32(p), e, start, end); err != nil {
				pc.t.Error(err)
			}
			if pc.hook != nil {
				pc.hook(m[1], uint32(p), e, start, end)
			}
		}
	}
	var reply map[string]any
	if len(b) > 0 {
		if err := json.Unmarshal(b, &reply); err != nil {
			return resp.StatusCode, nil, "", fmt.Errorf("reply %q: %w", b, err)
		}
	}
	return resp.StatusCode, reply, resp.Header.Get("X-Holdfast-Served-By"), nil
}

// workload runs KV writers through every running node until stop is closed;
// the ops acknowledged must all survive (verify). A 503 or a lost connection
// leaves an op's outcome unknown.
func (pc *procCluster) workload(stop <-chan struct{}, writers, objects, round int, seed int64) (wait func() ([]op, map[string]bool)) {
	ctx, cancel := context.WithCancel(context.Background())
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: writers}}
	var mu sync.Mutex
	var acked []op
	issued := map[string]bool{}
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(w)))
			for seq := 0; ctx.Err() == nil; seq++ {
				urls := pc.urls()
				if len(urls) == 0 {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				o, method, path, body := randomKVOp(rng, urls[rng.Intn(len(urls))], objects, round, w, seq, 4)
				mu.Lock()
				issued[o.token] = true
				mu.Unlock()
				status, reply, served, err := pc.callServedBy(ctx, client, method, path, body)
				if err != nil || status != http.StatusOK {
					if err == nil && status != http.StatusServiceUnavailable && ctx.Err() == nil {
						pc.t.Errorf("%s %s: status %d %v", method, path, status, reply)
					}
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if err := o.fromReply(reply); err != nil {
					pc.t.Errorf("reply %v: %v", reply, err)
					continue
				}
				o.served, o.at = served, time.Now()
				mu.Lock()
				acked = append(acked, o)
				mu.Unlock()
			}
		}(w)
	}
	go func() { <-stop; cancel() }()
	return func() ([]op, map[string]bool) {
		wg.Wait()
		return acked, issued
	}
}

// TestCluster_ProcessesLoseNoAcknowledgedWrite runs KV writers through every
// node of a 3-node cluster of processes while nodes are SIGKILLed and restarted,
// a node joins and a node leaves; no acknowledged write is lost, and no two
// nodes ever served one partition at once.
func TestCluster_ProcessesLoseNoAcknowledgedWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd process and several server processes")
	}
	const writers, objects = 16, 60
	pc := newProcCluster(t, "")
	for _, id := range []string{"a", "b", "c"} {
		pc.start(id)
	}
	pc.waitStable(60 * time.Second)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	issued := map[string]bool{}
	var acked []op
	collect := func(a []op, is map[string]bool) {
		acked = append(acked, a...)
		for tok := range is {
			issued[tok] = true
		}
	}
	round := 0
	run := func(what string, action func()) {
		stop := make(chan struct{})
		wait := pc.workload(stop, writers, objects, round, rng.Int63())
		time.Sleep(time.Duration(300+rng.Intn(700)) * time.Millisecond)
		action()
		time.Sleep(300 * time.Millisecond)
		close(stop)
		a, is := wait()
		collect(a, is)
		t.Logf("round %d (%s): %d writes acknowledged", round, what, len(a))
		if len(a) == 0 {
			t.Fatalf("round %d acknowledged nothing", round)
		}
		round++
	}
	// SIGKILL a node under load; it comes back with its data.
	for range 2 {
		victim := []string{"a", "b", "c"}[rng.Intn(3)]
		run("kill "+victim, func() {
			pc.kill(victim)
			pc.start(victim)
			pc.waitStable(60 * time.Second)
		})
	}
	// A node joins under load; another leaves under load.
	run("join d", func() {
		pc.start("d")
		pc.waitStable(60 * time.Second)
	})
	run("leave a (holdfast cluster leave)", func() {
		pc.mu.Lock()
		s := pc.servers["a"]
		delete(pc.servers, "a")
		pc.mu.Unlock()
		out, err := pc.holdfast("cluster", "leave", "a")
		if err != nil {
			t.Fatalf("cluster leave: %v\n%s", err, out)
		}
		select {
		case err := <-s.exited:
			if err != nil {
				t.Fatalf("node a after cluster leave: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("node a did not exit after cluster leave")
		}
		pc.waitStable(60 * time.Second)
	})
	// No two nodes served one partition at once (checked first: an overlap
	// explains a lost write).
	if err := pc.check.Verify(); err != nil {
		t.Error(err)
	}
	// Every acknowledged write is there, read through each node.
	urls := pc.urls()
	verify(t, urls[rng.Intn(len(urls))], objects, acked, issued)
	c := &http.Client{Timeout: 10 * time.Second}
	for _, url := range urls {
		for i := range objects {
			if status, _, err := pc.callServed(context.Background(), c, "GET", fmt.Sprintf("%s/api/v1/objects/app_crash/crash/o%d", url, i), nil); err != nil || status != http.StatusOK {
				t.Fatalf("read o%d via %s: %d %v", i, url, status, err)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d acknowledged writes checked; %d serving periods recorded", len(acked), pc.check.Periods())

	// The operator's view, then giving up a dead node on purpose.
	out, err := pc.holdfast("cluster", "status", "--partitions")
	if err != nil || !strings.Contains(out, "PARTITION") || !strings.Contains(out, "\nd ") || !strings.Contains(out, " 0 unavailable, 0 refused") {
		t.Fatalf("cluster status: %v\n%s", err, out)
	}
	pc.kill("b")
	if out, err := pc.holdfast("cluster", "forget-node", "b"); err == nil || !strings.Contains(out, "accept-data-loss") {
		t.Fatalf("forget-node without --accept-data-loss: %v\n%s", err, out)
	}
	if out, err := pc.holdfast("cluster", "forget-node", "c", "--accept-data-loss"); err == nil || !strings.Contains(out, "live") {
		t.Fatalf("forget-node of a live node: %v\n%s", err, out)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, err = pc.holdfast("cluster", "status") // b shows down once its lease expired
		if err == nil && strings.Contains(out, "partitions not served") && regexp.MustCompile(`(?m)^b\s+down\s`).MatchString(out) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster status with b down: %v\n%s", err, out)
		}
	}
	if out, err := pc.holdfast("cluster", "forget-node", "b", "--accept-data-loss"); err != nil || !strings.Contains(out, "gave up") {
		t.Fatalf("forget-node: %v\n%s", err, out)
	}
	pc.waitStable(60 * time.Second) // c and d took b's partitions up
	for i := range objects {
		url := pc.urls()[0]
		if status, _, err := pc.callServed(context.Background(), c, "PUT", fmt.Sprintf("%s/api/v1/objects/app_crash/crash/o%d/after", url, i), map[string]any{"value": 1}); err != nil || status != http.StatusOK {
			t.Fatalf("write o%d after forget-node: %d %v", i, status, err)
		}
	}
}

// holdfast runs the holdfast command (the test binary) with args and the
// cluster's etcd and name, and returns its combined output.
func (pc *procCluster) holdfast(args ...string) (string, error) {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, append(args, "--etcd", pc.etcd, "--name", pc.name)...)...)
	cmd.Env = append(os.Environ(), "HOLDFAST_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// startThree starts nodes a, b and c and waits until they share the partitions.
func (pc *procCluster) startThree() {
	for _, id := range []string{"a", "b", "c"} {
		pc.start(id)
	}
	pc.waitStable(60 * time.Second)
}

// TestCluster_ProcessesLogCrash runs the log's crash checker against a
// 3-node cluster whose nodes are SIGKILLed and restarted.
func TestCluster_ProcessesLogCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd process and several server processes")
	}
	pc := newProcCluster(t, "")
	pc.startThree()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	runLogCrash(t, pc, rand.New(rand.NewSource(seed)))
}

// TestCluster_ProcessesQueueCrash runs the queue's crash checker against a
// 3-node cluster whose nodes are SIGKILLed and restarted.
func TestCluster_ProcessesQueueCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd process and several server processes")
	}
	pushLog := filepath.Join(t.TempDir(), "pushed")
	t.Setenv("HOLDFAST_TEST_PUSH_LOG", pushLog)
	pc := newProcCluster(t, queueCrashTypes)
	pc.startThree()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	// The replay summary counts the replay at start; a cluster node replays the
	// partitions it takes up later, so it is not checked here.
	runQueueCrash(t, pc, rand.New(rand.NewSource(seed)), pushLog, false)
}

// TestCluster_ProcessesNodeCutOffFromEtcd: node c's etcd connection goes
// through a proxy the test blocks. Within its lease c stops acknowledging; the
// other nodes answer 503 for its partitions and serve none of them; once
// connected again c serves them under new epochs, and no acknowledged write is
// lost.
func TestCluster_ProcessesNodeCutOffFromEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd process and several server processes")
	}
	const ttl = 2 * time.Second
	pc := newProcCluster(t, "")
	px, err := tcpproxy.Start(pc.etcd)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	pc.etcdVia = map[string]string{"c": px.Addr()}
	pc.startThree()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))

	var mu sync.Mutex
	var cutAt time.Time
	cutEpochs := map[uint32]uint64{}
	var late []string
	servedByCAfter := 0
	pc.hook = func(node string, p uint32, e uint64, start, end time.Time) {
		if node != "c" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if cutAt.IsZero() {
			return
		}
		if e <= cutEpochs[p] && end.After(cutAt.Add(ttl)) && len(late) < 5 {
			late = append(late, fmt.Sprintf("partition %d epoch %d answered %v after the cut", p, e, end.Sub(cutAt)))
		}
		if e > cutEpochs[p] {
			servedByCAfter++
		}
	}
	stop := make(chan struct{})
	wait := pc.workload(stop, 16, 60, 0, rng.Int63())
	time.Sleep(time.Second)
	st := pc.waitStable(10 * time.Second)
	var ofC []uint32
	mu.Lock()
	for _, p := range st.Parts {
		cutEpochs[p.Partition] = p.Epoch
		if p.Owner == "c" {
			ofC = append(ofC, p.Partition)
		}
	}
	cutAt = time.Now()
	mu.Unlock()
	px.Block()

	// After its lease, etcd drops c and every other node answers 503 for c's
	// partitions at once; nobody else owns them.
	time.Sleep(2 * ttl)
	now, err := cluster.ReadStatus(context.Background(), []string{pc.etcd}, pc.name)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ofC {
		ps := now.Parts[p]
		if ps.Owner != "c" || ps.Available {
			t.Fatalf("partition %d of the cut-off node: %+v", p, ps)
		}
	}
	c := &http.Client{Timeout: 10 * time.Second}
	for i := range 60 {
		url := pc.servers["a"].url
		start := time.Now()
		status, _, err := pc.callServed(context.Background(), c, "GET", fmt.Sprintf("%s/api/v1/objects/app_crash/crash/o%d", url, i), nil)
		if err != nil || (status != http.StatusOK && status != http.StatusServiceUnavailable) || time.Since(start) > 2*time.Second {
			t.Fatalf("read o%d via a while c is cut off: %d %v after %v", i, status, err, time.Since(start))
		}
	}

	px.Unblock()
	pc.waitStable(60 * time.Second)
	time.Sleep(time.Second)
	close(stop)
	acked, issued := wait()
	verify(t, pc.servers["a"].url, 60, acked, issued)
	if err := pc.check.Verify(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(late) > 0 {
		t.Fatalf("c answered after its lease: %v", late)
	}
	if servedByCAfter == 0 {
		t.Fatalf("c served nothing under a new epoch after it reconnected")
	}
	t.Logf("%d acknowledged writes checked; c served %d replies under new epochs after reconnecting", len(acked), servedByCAfter)
}

// TestCluster_ProcessesWebsocketFollowsTheObject: a websocket on node a joins
// an object owned by node b and receives, live and in order, the changes
// written through node c; when b leaves, the channel gets phx_error, and a join
// again after the last log_id seen misses nothing.
func TestCluster_ProcessesWebsocketFollowsTheObject(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd process and several server processes")
	}
	pc := newProcCluster(t, "")
	pc.startThree()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := &http.Client{Timeout: 10 * time.Second}
	// An object owned by b: ask through a and read who served it.
	var obj string
	for i := 0; obj == ""; i++ {
		o := fmt.Sprintf("ws%d", i)
		req, _ := http.NewRequestWithContext(ctx, "GET", pc.servers["a"].url+"/api/v1/objects/app_crash/crash/"+o, nil)
		req.Header.Set("X-App-Key", crashAppKey)
		req.Header.Set("X-App-Secret", crashAppSecret)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if strings.HasPrefix(resp.Header.Get("X-Holdfast-Served-By"), "b/") {
			obj = o
		}
	}
	write := func(n int) {
		for range n {
			if st, reply, err := call(ctx, c, "POST", pc.servers["c"].url+"/api/v1/objects/app_crash/crash/"+obj+"/n/increment", map[string]any{"by": 1}); err != nil || st != 200 {
				t.Fatalf("increment: %d %v %v", st, reply, err)
			}
		}
	}
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(pc.servers["a"].url, "http")+"/socket/websocket?vsn=2.0.0&app_key="+crashAppKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	topic := "durable:" + crashAppKey + ":crash:" + obj
	send := func(frame []any) {
		b, _ := json.Marshal(frame)
		if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
	}
	// next returns the next frame of the topic: event and payload.
	next := func() (string, map[string]any) {
		for {
			rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
			_, b, err := ws.Read(rctx)
			rcancel()
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			var f []json.RawMessage
			if err := json.Unmarshal(b, &f); err != nil || len(f) != 5 {
				t.Fatalf("frame %s", b)
			}
			var tp, ev string
			_ = json.Unmarshal(f[2], &tp)
			_ = json.Unmarshal(f[3], &ev)
			if tp != topic {
				continue
			}
			var payload map[string]any
			_ = json.Unmarshal(f[4], &payload)
			return ev, payload
		}
	}
	expect := func(event string) map[string]any {
		ev, p := next()
		if ev != event {
			t.Fatalf("got %s %v, want %s", ev, p, event)
		}
		return p
	}
	send([]any{"1", "1", topic, "phx_join", map[string]any{"app_secret": crashAppSecret}})
	if p := expect("phx_reply"); p["status"] != "ok" {
		t.Fatalf("join: %v", p)
	}
	expect("snapshot")
	write(20)
	last := 0.0
	for i := range 20 {
		p := expect("change")
		if id := p["log_id"].(float64); id != float64(i+1) {
			t.Fatalf("change %d has log_id %v", i, id)
		}
		last = p["log_id"].(float64)
	}
	// b leaves: the object moves, the channel errs, a new join resumes.
	pc.leave("b")
	expect("phx_error")
	pc.waitStable(60 * time.Second)
	write(5) // log_ids 21..25 while nobody watches
	send([]any{"2", "2", topic, "phx_join", map[string]any{"app_secret": crashAppSecret, "after_log_id": last}})
	ev, p := next()
	if ev == "phx_close" { // the errored channel's, as for any duplicate join
		ev, p = next()
	}
	if ev != "phx_reply" || p["status"] != "ok" {
		t.Fatalf("join again: %s %v", ev, p)
	}
	got := []float64{}
	for {
		ev, p := next()
		if ev == "snapshot" {
			break
		}
		if ev != "change" && ev != "replay" {
			t.Fatalf("after the rejoin: %s %v", ev, p)
		}
		got = append(got, p["log_id"].(float64))
	}
	if len(got) != 5 || got[0] != 21 || got[4] != 25 {
		t.Fatalf("replayed %v, want log_ids 21..25", got)
	}
	write(1)
	if p := expect("change"); p["log_id"].(float64) != 26 {
		t.Fatalf("live after the rejoin: %v", p)
	}
}

// TestCluster_ProcessesRepliesAreTheSameThroughAnyNode: the reply through a
// node that forwards is byte for byte the reply through the owner (empty lists
// stay empty lists, absent fields stay absent).
func TestCluster_ProcessesRepliesAreTheSameThroughAnyNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd process and several server processes")
	}
	pc := newProcCluster(t, "  leased:\n    log: {leases: {maxParallelism: 2, leaseDuration: 30s}}\n")
	pc.startThree()
	ctx := context.Background()
	c := &http.Client{Timeout: 10 * time.Second}
	get := func(url string) (int, string, string) {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		req.Header.Set("X-App-Key", crashAppKey)
		req.Header.Set("X-App-Secret", crashAppSecret)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header.Get("X-Holdfast-Served-By")
	}
	// Some state to read: a KV object, a log with a cursor, a queue, an alarm.
	for _, w := range []struct {
		method, path string
		body         any
	}{
		{"PUT", "/api/v1/objects/app_crash/kv/full/a", map[string]any{"value": map[string]any{"x": []any{1, "two", nil}}}},
		{"POST", "/api/v1/logs/app_crash/leased/l/append", map[string]any{"records": []map[string]any{{"body": 1}, {"body": 2, "deduplicationKey": "d"}}}},
		{"PUT", "/api/v1/logs/app_crash/leased/l/cursors/c1", map[string]any{"offset": 1}},
		{"POST", "/api/v1/queues/app_crash/jobs/q/messages", map[string]any{"messages": []map[string]any{{"id": "m1", "payload": "p"}}}},
		{"PUT", "/api/v1/alarms/app_crash/kv/full/a1", map[string]any{"at": time.Now().Add(time.Hour).UnixMilli(), "action": map[string]any{"kind": "trim"}}},
	} {
		if st, reply, err := call(ctx, c, w.method, pc.servers["a"].url+w.path, w.body); err != nil || st != 200 {
			t.Fatalf("%s %s: %d %v %v", w.method, w.path, st, reply, err)
		}
	}
	paths := []string{
		"/api/v1/objects/app_crash/kv/full", "/api/v1/objects/app_crash/kv/empty", "/api/v1/objects/app_crash/kv/full/a",
		"/api/v1/objects/app_crash/kv/full/missing", "/api/v1/objects/app_crash/kv/full/log?after=0",
		"/api/v1/objects/app_crash/kv/empty/log?after=0", "/api/v1/alarms/app_crash/kv/full",
		"/api/v1/alarms/app_crash/kv/empty", "/api/v1/logs/app_crash/leased/l/records?from=0",
		"/api/v1/logs/app_crash/leased/empty/records?from=0", "/api/v1/logs/app_crash/leased/l/bounds",
		"/api/v1/logs/app_crash/leased/l/cursors", "/api/v1/logs/app_crash/leased/l/consumers/c1/leases",
		"/api/v1/queues/app_crash/jobs/q/stats", "/api/v1/queues/app_crash/jobs/q/messages/m1",
		"/api/v1/queues/app_crash/jobs/q/dead-letters",
	}
	for _, path := range paths {
		var owner string
		replies := map[string]string{}
		for id, s := range pc.servers {
			st, body, served := get(s.url + path)
			if served != "" {
				owner = strings.SplitN(served, "/", 2)[0]
			}
			// Each reply has its own request id; the rest must be the same.
			replies[id] = fmt.Sprintf("%d %s", st, requestIDRE.ReplaceAllString(body, `"request_id":"…"`))
		}
		if owner == "" {
			if st, body, _ := get(pc.servers["a"].url + path); st == 200 {
				t.Fatalf("%s: 200 without a served-by header: %s", path, body)
			}
			owner = "a" // an error reply: every node gives the same
		}
		for id, r := range replies {
			if r != replies[owner] {
				t.Errorf("%s through %s:\n  %s\nthrough the owner %s:\n  %s", path, id, r, owner, replies[owner])
			}
		}
	}
}
