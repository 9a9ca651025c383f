package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/internal/tcpproxy"
)

// Replicated clusters of processes (replicationFactor 3, issue 27): three
// `holdfast serve` processes and an etcd process, every partition a raft
// group over the nodes' write-ahead logs. The faults are kill -9 of a leader
// (and of a second node after the first came back), the loss of a node's
// disk, and the cut of a node's incoming raft traffic. The workload is
// increments with an Idempotency-Key each, retried with the same key while
// their outcome is unknown, so that the count of each object is known within
// the outcomes the test never learned.

const (
	// replPartitions is the nodes' partition count (procCluster.start).
	replPartitions = 32
	// replFailoverCeiling bounds the time from a fault to the first
	// acknowledged write of every object. The design aims at a few seconds
	// (failoverTimeout 1s); the ceiling is generous for a loaded 2-core
	// machine, and the figures are logged.
	replFailoverCeiling = 15 * time.Second
	// replCutLease bounds how long a node whose raft traffic is cut may
	// still answer for a partition: its lease lapses about 710 ms after the
	// last acknowledged heartbeat (failoverTimeout 1s).
	replCutLease = 2 * time.Second
)

// raftAddrs is where a node's raft carrier listens and what it advertises.
type raftAddrs struct{ bind, advertise string }

// newReplicatedProcCluster starts an etcd process and nodes a, b and c with
// replicationFactor 3 (raft addresses from via, else free ports), waits
// until every partition is served, and returns the cluster with one object
// per partition.
func newReplicatedProcCluster(t *testing.T, via map[string]raftAddrs) (*procCluster, []string) {
	t.Helper()
	return newReplicatedProcClusterOf(t, via, []string{"a", "b", "c"}, "")
}

// newReplicatedProcClusterOf is newReplicatedProcCluster with nodes ids
// (started in order) and further entries of every node's cluster map (flow
// style, e.g. "replaceAfter: 5s"; "": none), also for nodes started later.
func newReplicatedProcClusterOf(t *testing.T, via map[string]raftAddrs, ids []string, extra string) (*procCluster, []string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts an etcd process and several server processes")
	}
	pc := newProcCluster(t, "")
	// A replicated cluster needs a cold store every node reads: the nodes
	// share one directory on this machine.
	pc.topYAML = fmt.Sprintf("cold: {fs: {dir: '%s', shared: true}}\n", filepath.Join(pc.dir, "cold"))
	if via == nil {
		via = map[string]raftAddrs{}
	}
	pc.clusterYAML = func(id string) string {
		a, ok := via[id]
		if !ok {
			addr := freeAddr(t)
			a = raftAddrs{bind: addr, advertise: addr}
		}
		more := ""
		if extra != "" {
			more = ", " + extra
		}
		return fmt.Sprintf("replicationFactor: 3, failoverTimeout: 1s, raftAdvertise: '%s', raftBind: '%s'%s", a.advertise, a.bind, more)
	}
	// All at once, as an operator starting a cluster would. The cluster
	// forms once replicationFactor nodes are live (in practice the first
	// three to register); replicas then move to the others one at a time.
	start := time.Now()
	pc.startAll(ids...)
	objects := pc.partitionObjects(60 * time.Second)
	t.Logf("every partition served %v after the nodes started", time.Since(start).Round(time.Millisecond))
	return pc, objects
}

// served is one reply's X-Holdfast-Served-By: node, partition, epoch (the
// raft term in a replicated cluster).
type served struct {
	node      string
	partition uint32
	epoch     uint64
}

func parseServed(h string) (served, bool) {
	m := servedRE.FindStringSubmatch(h)
	if m == nil {
		return served{}, false
	}
	p, _ := strconv.ParseUint(m[2], 10, 32)
	e, _ := strconv.ParseUint(m[3], 10, 64)
	return served{m[1], uint32(p), e}, true
}

// get reads object obj through url, retrying a 503 or a lost connection
// until timeout; it fails the test after that.
func (pc *procCluster) get(c *http.Client, url, obj string, timeout time.Duration) (map[string]any, served) {
	pc.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		status, reply, by, err := pc.callServedBy(context.Background(), c, "GET", url+"/api/v1/objects/app_crash/crash/"+obj, nil)
		if err == nil && status == http.StatusOK {
			s, ok := parseServed(by)
			if !ok {
				pc.t.Fatalf("GET %s via %s: served-by %q", obj, url, by)
			}
			return reply, s
		}
		if (err == nil && status != http.StatusServiceUnavailable) || time.Now().After(deadline) {
			pc.t.Fatalf("GET %s via %s: %d %v %v (for %v)", obj, url, status, reply, err, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// partitionObjects waits until the cluster serves reads, then returns one
// object name per partition (found by the served-by header).
func (pc *procCluster) partitionObjects(timeout time.Duration) []string {
	pc.t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	url := pc.urls()[0]
	byPart := map[uint32]string{}
	for i := 0; len(byPart) < replPartitions; i++ {
		if i == 5000 {
			pc.t.Fatalf("5000 objects cover only %d partitions", len(byPart))
		}
		obj := fmt.Sprintf("i%d", i)
		if _, s := pc.get(c, url, obj, timeout); byPart[s.partition] == "" {
			byPart[s.partition] = obj
		}
	}
	out := make([]string, replPartitions)
	for p, obj := range byPart {
		out[p] = obj
	}
	return out
}

// leaders reads every object through the nodes ids (none: every running
// node) and returns who served each partition, and how many partitions each
// node served.
func (pc *procCluster) leaders(objects []string, ids ...string) (map[uint32]string, map[string]int) {
	pc.t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	urls := pc.urls()
	if len(ids) > 0 {
		urls = nil
		for _, id := range ids {
			urls = append(urls, pc.nodeURL(id))
		}
	}
	by, count := map[uint32]string{}, map[string]int{}
	for i, obj := range objects {
		_, s := pc.get(c, urls[i%len(urls)], obj, 30*time.Second)
		by[s.partition] = s.node
		count[s.node]++
	}
	return by, count
}

// mostLeading is the node, among candidates, that served the most partitions.
func mostLeading(count map[string]int, candidates ...string) string {
	best := ""
	for _, id := range candidates {
		if best == "" || count[id] > count[best] {
			best = id
		}
	}
	return best
}

// incLedger records the increments sent: per object, the value each
// acknowledged Idempotency-Key was answered with, and how many keys were
// given up with their outcome unknown.
type incLedger struct {
	pc *procCluster
	c  *http.Client

	mu      sync.Mutex
	acked   map[string]map[int64]string // object -> value -> key
	unknown map[string]int
	total   int
	resent  int // acknowledged keys sent again, answered the same
}

func newIncLedger(pc *procCluster) *incLedger {
	return &incLedger{
		pc: pc, c: &http.Client{Timeout: 8 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		acked: map[string]map[int64]string{}, unknown: map[string]int{},
	}
}

func (l *incLedger) acknowledged() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// increment adds 1 to obj's slot n under Idempotency-Key key through the
// node pick names for each attempt, sending the same key again after a 503,
// a timeout or a lost connection, until it is acknowledged, ctx ends or
// giveUp passes. It returns when the acknowledgement came, or false when the
// outcome stays unknown, with the last attempt's failure.
func (l *incLedger) increment(ctx context.Context, pick func() string, obj, key string, giveUp time.Time) (time.Time, bool, string) {
	hdr := http.Header{"Idempotency-Key": {key}}
	last := "not sent"
	for ctx.Err() == nil && time.Now().Before(giveUp) {
		url := pick()
		if url == "" {
			sleepCtx(ctx, 50*time.Millisecond)
			continue
		}
		path := url + "/api/v1/objects/app_crash/crash/" + obj + "/n/increment"
		status, reply, _, err := l.pc.callServedWith(ctx, l.c, "POST", path, map[string]any{"by": 1}, hdr)
		last = fmt.Sprintf("via %s: %d %v %v", url, status, reply, err)
		if err != nil || status == http.StatusServiceUnavailable {
			sleepCtx(ctx, 30*time.Millisecond)
			continue
		}
		if status != http.StatusOK {
			l.pc.t.Errorf("increment %s (key %s) via %s: %d %v", obj, key, url, status, reply)
			break
		}
		at := time.Now()
		v, ok := reply["value"].(float64)
		if !ok {
			l.pc.t.Errorf("increment %s (key %s): reply %v has no value", obj, key, reply)
			break
		}
		l.record(obj, key, int64(v))
		// Now and then the same key again: it must get the first reply and
		// count nothing.
		if rand.Intn(8) == 0 {
			l.resend(ctx, url, obj, key, int64(v))
		}
		return at, true, ""
	}
	l.mu.Lock()
	l.unknown[obj]++
	l.mu.Unlock()
	return time.Time{}, false, last
}

func (l *incLedger) record(obj, key string, v int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.acked[obj] == nil {
		l.acked[obj] = map[int64]string{}
	}
	if other, dup := l.acked[obj][v]; dup {
		l.pc.t.Errorf("%s: keys %s and %s were both answered n = %d: one increment was lost or answered twice", obj, other, key, v)
	}
	l.acked[obj][v] = key
	l.total++
}

// resend sends acknowledged key again (one attempt: a 503 or an error says
// nothing) and checks that it is answered with its first reply.
func (l *incLedger) resend(ctx context.Context, url, obj, key string, want int64) {
	path := url + "/api/v1/objects/app_crash/crash/" + obj + "/n/increment"
	status, reply, _, err := l.pc.callServedWith(ctx, l.c, "POST", path, map[string]any{"by": 1}, http.Header{"Idempotency-Key": {key}})
	if err != nil || status != http.StatusOK {
		return
	}
	if v, _ := reply["value"].(float64); int64(v) != want {
		l.pc.t.Errorf("%s: key %s answered n = %d, then n = %v when sent again", obj, key, want, reply["value"])
		return
	}
	l.mu.Lock()
	l.resent++
	l.mu.Unlock()
}

// anyNode picks a running node at random.
func (l *incLedger) anyNode() string {
	urls := l.pc.urls()
	if len(urls) == 0 {
		return ""
	}
	return urls[rand.Intn(len(urls))]
}

// load runs writers that increment random objects through random running
// nodes until stop is closed; wait waits for them.
func (l *incLedger) load(stop <-chan struct{}, writers int, objects []string, tag string) (wait func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(time.Now().UnixNano() + int64(w)))
			for seq := 0; ctx.Err() == nil; seq++ {
				obj := objects[rng.Intn(len(objects))]
				l.increment(ctx, l.anyNode, obj, fmt.Sprintf("%s-w%d-%d", tag, w, seq), time.Now().Add(60*time.Second))
			}
		}()
	}
	go func() { <-stop; cancel() }()
	return wg.Wait
}

// waitAcks waits until n more increments were acknowledged than now.
func (l *incLedger) waitAcks(n int, timeout time.Duration, why string) {
	l.pc.t.Helper()
	want := l.acknowledged() + n
	deadline := time.Now().Add(timeout)
	for l.acknowledged() < want {
		if time.Now().After(deadline) {
			l.pc.t.Fatalf("%s: %d increments acknowledged in %v, want %d", why, l.acknowledged(), timeout, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writableAfter increments every object once (through pick for each
// attempt) and returns, per object, the time from since to its
// acknowledgement; it fails the test for an object not written within
// replFailoverCeiling of since.
func (l *incLedger) writableAfter(since time.Time, objects []string, pick func() string, tag string) map[string]time.Duration {
	l.pc.t.Helper()
	var mu sync.Mutex
	took := map[string]time.Duration{}
	failed := map[string]string{}
	var wg sync.WaitGroup
	for _, obj := range objects {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at, ok, why := l.increment(context.Background(), pick, obj, tag+"-"+obj, since.Add(replFailoverCeiling))
			mu.Lock()
			defer mu.Unlock()
			if !ok {
				failed[obj] = why
				return
			}
			took[obj] = at.Sub(since)
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		var list []string
		for p, obj := range objects {
			if why, ok := failed[obj]; ok {
				list = append(list, fmt.Sprintf("%s (partition %d), the last attempt %s", obj, p, why))
			}
		}
		l.pc.t.Fatalf("%s: %d objects not writable within %v of %s:\n%s", tag, len(list), replFailoverCeiling, since.Format("15:04:05.000"), strings.Join(list, "\n"))
	}
	return took
}

// failoverSummary describes the times objects took to be written again
// (objects[p] is partition p's), the median and the slowest, apart for the
// partitions node led (by) and the others.
func failoverSummary(took map[string]time.Duration, objects []string, by map[uint32]string, node string) string {
	var led, rest []time.Duration
	for p, obj := range objects {
		if by[uint32(p)] == node {
			led = append(led, took[obj])
		} else {
			rest = append(rest, took[obj])
		}
	}
	describe := func(d []time.Duration) string {
		if len(d) == 0 {
			return "none"
		}
		slices.Sort(d)
		return fmt.Sprintf("median %v, max %v over %d", d[len(d)/2].Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond), len(d))
	}
	return fmt.Sprintf("%s's partitions: %s; the others: %s", node, describe(led), describe(rest))
}

// verify reads every object through the nodes ids (none: every running
// node): each gives at least every acknowledged increment, and at most those
// plus the ones whose outcome is unknown.
func (l *incLedger) verify(objects []string, ids ...string) {
	l.pc.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	c := &http.Client{Timeout: 10 * time.Second}
	urls := l.pc.urls()
	if len(ids) > 0 {
		urls = nil
		for _, id := range ids {
			urls = append(urls, l.pc.nodeURL(id))
		}
	}
	unknown := 0
	for _, obj := range objects {
		acked, unk := int64(len(l.acked[obj])), int64(l.unknown[obj])
		unknown += int(unk)
		var top int64
		for v := range l.acked[obj] {
			top = max(top, v)
		}
		for _, url := range urls {
			reply, s := l.pc.get(c, url, obj, 30*time.Second)
			state, _ := reply["state"].(map[string]any)
			f, _ := state["n"].(float64)
			n := int64(f)
			if n < acked || n < top || n > acked+unk {
				l.pc.t.Errorf("%s via %s (served by %s/%d/%d): n = %d, but %d increments were acknowledged (the largest answer %d) and %d have an unknown outcome",
					obj, url, s.node, s.partition, s.epoch, n, acked, top, unk)
			}
		}
	}
	l.pc.t.Logf("%d acknowledged increments checked through %d nodes (%d outcomes unknown, %d keys sent again answered the same)",
		l.total, len(urls), unknown, l.resent)
}

// nodeURL is node id's address.
func (pc *procCluster) nodeURL(id string) string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.servers[id].url
}

// waitLog waits until node id's log has a line holding every one of parts.
func (pc *procCluster) waitLog(id string, timeout time.Duration, parts ...string) string {
	pc.t.Helper()
	pc.mu.Lock()
	s := pc.servers[id]
	pc.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for {
		for _, line := range strings.Split(s.log(), "\n") {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(line, p)
			}
			if all {
				return line
			}
		}
		if time.Now().After(deadline) {
			pc.t.Fatalf("node %s logged no line with %q within %v", id, parts, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lateServing collects replies served by node after a moment, for checks
// that a node no longer serves anything.
type lateServing struct {
	mu    sync.Mutex
	node  string
	after time.Time // zero: not watching yet
	// upTo, when set, narrows the watch to replies under stale epochs: a
	// partition's reply counts only if its epoch is at most upTo's for it
	// (a node that comes back may lead again, but only under a new term).
	upTo map[uint32]uint64
	seen []string
}

func (w *lateServing) watch(node string, after time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.node, w.after, w.upTo = node, after, nil
}

// watchStale watches node's replies after a moment under epochs up to
// upTo's (per partition).
func (w *lateServing) watchStale(node string, after time.Time, upTo map[uint32]uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.node, w.after, w.upTo = node, after, upTo
}

func (w *lateServing) hook(node string, p uint32, e uint64, start, end time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.after.IsZero() || node != w.node || !start.After(w.after) {
		return
	}
	if w.upTo != nil && e > w.upTo[p] {
		return
	}
	if len(w.seen) < 5 {
		w.seen = append(w.seen, fmt.Sprintf("partition %d epoch %d asked %v after the moment", p, e, start.Sub(w.after).Round(time.Millisecond)))
	}
}

func (w *lateServing) check(t *testing.T, what string) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seen) > 0 {
		t.Errorf("%s served after %s: %v", w.node, what, w.seen)
	}
}

// TestReplicated_ProcessesKillOfALeaderLosesNothing: under 16 writers, kill
// -9 the node that leads the most partitions; every object is writable again
// within replFailoverCeiling (the figures are logged). The killed node comes
// back on its data and rejoins; then the node leading the most of the other
// two is killed, so that every partition needs the restarted node's
// replicas. Every acknowledged increment is there through every node, none
// counted twice, and the served-by epochs never interleave.
func TestReplicated_ProcessesKillOfALeaderLosesNothing(t *testing.T) {
	pc, objects := newReplicatedProcCluster(t, nil)
	l := newIncLedger(pc)
	stop := make(chan struct{})
	wait := l.load(stop, 16, objects, "load")
	l.waitAcks(200, 60*time.Second, "before the first kill")

	by, count := pc.leaders(objects)
	victim := mostLeading(count, "a", "b", "c")
	killed := time.Now()
	pc.kill(victim)
	took := l.writableAfter(killed, objects, l.anyNode, "kill1")
	t.Logf("kill -9 of %s (leading %d of %d partitions %v): every object written again after the kill: %s",
		victim, count[victim], replPartitions, count, failoverSummary(took, objects, by, victim))

	// Back on its data: it rejoins and its replicas catch up.
	pc.start(victim)
	l.waitAcks(300, 60*time.Second, "after the restart")
	for _, obj := range objects {
		pc.get(l.c, pc.nodeURL(victim), obj, 30*time.Second)
	}
	by, count = pc.leaders(objects)
	var others []string
	for _, id := range []string{"a", "b", "c"} {
		if id != victim {
			others = append(others, id)
		}
	}
	second := mostLeading(count, others...)
	killed = time.Now()
	pc.kill(second)
	took = l.writableAfter(killed, objects, l.anyNode, "kill2")
	_, after := pc.leaders(objects)
	t.Logf("kill -9 of %s (leading %d partitions %v) after %s came back: every object written again after the kill: %s; now %v",
		second, count[second], count, victim, failoverSummary(took, objects, by, second), after)
	l.waitAcks(100, 60*time.Second, "after the second kill")
	close(stop)
	wait()
	if err := pc.check.Verify(); err != nil {
		t.Error(err)
	}
	l.verify(objects)
	// Listing through each running node covers every partition, wherever
	// its leader is (issue 29): every object written, in byte order.
	want := strings.Join(slices.Sorted(slices.Values(objects)), "\n") + "\n"
	pc.mu.Lock()
	running := maps.Clone(pc.servers)
	pc.mu.Unlock()
	for id, s := range running {
		if got := cliOK(t, s, "object", "ls", "crash"); got != want {
			t.Errorf("holdfast object ls crash through %s printed\n%s\nwant\n%s", id, got, want)
		}
	}
}

// TestReplicated_ProcessesWipedDiskNeverServesOldReplicas: a node killed -9
// comes back under its nodeId with an empty data directory. It must run none
// of its old replicas (they would vote with a log they forgot) and say so in
// its log, route every request to the others at once, and get new, empty
// replicas filled by snapshot; once they are, another node is killed and
// the wiped node and the third hold every acknowledged increment.
func TestReplicated_ProcessesWipedDiskNeverServesOldReplicas(t *testing.T) {
	pc, objects := newReplicatedProcCluster(t, nil)
	l := newIncLedger(pc)
	stop := make(chan struct{})
	wait := l.load(stop, 16, objects, "load")
	l.waitAcks(200, 60*time.Second, "before the kill")

	by, count := pc.leaders(objects)
	victim := mostLeading(count, "a", "b", "c")
	pc.kill(victim)
	if err := os.RemoveAll(filepath.Join(pc.dir, victim)); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	pc.start(victim)
	line := pc.waitLog(victim, 30*time.Second, "level=ERROR", "lostReplicas")
	t.Logf("the wiped node %s says: %s", victim, line)
	took := l.writableAfter(restarted, objects, func() string { return pc.nodeURL(victim) }, "via-wiped")
	t.Logf("every object written through the wiped node %s: %s", victim, failoverSummary(took, objects, by, victim))
	for _, id := range []string{"a", "b", "c"} {
		if id != victim {
			l.writableAfter(time.Now(), objects, func() string { return pc.nodeURL(id) }, "via-"+id)
		}
	}
	// Its replicas are re-created: every partition has three live ones again.
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := cluster.ReadStatus(ctx, []string{pc.etcd}, pc.name)
		cancel()
		if err == nil && st.UnderReplicated == 0 && st.Served == st.Partitions {
			t.Logf("the wiped node's replicas re-created %v after its restart", time.Since(restarted).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas not re-created 90 s after the wiped node came back: %+v %v", st, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	l.waitAcks(200, 60*time.Second, "after the restart")
	var other string
	for _, id := range []string{"a", "b", "c"} {
		if id != victim {
			other = id
			break
		}
	}
	pc.kill(other)
	l.writableAfter(time.Now(), objects, l.anyNode, "after-kill-"+other)
	l.waitAcks(100, 60*time.Second, "with "+other+" down")
	close(stop)
	wait()
	if err := pc.check.Verify(); err != nil {
		t.Error(err)
	}
	l.verify(objects)
}

// TestReplicated_ProcessesRaftCutNodeStepsDown: every node's raft carrier
// is reached through a proxy; the one in front of the node leading the most
// partitions is blocked under load, so that node hears no raft traffic (no
// heartbeat acknowledgement, no vote). It must stop serving within its lease,
// the others elect and serve its partitions, every object is writable
// through every node (requests still travel over the nodes' other port),
// and after the heal nothing acknowledged is lost and the epochs never
// interleave.
func TestReplicated_ProcessesRaftCutNodeStepsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd process and several server processes")
	}
	via := map[string]raftAddrs{}
	proxies := map[string]*tcpproxy.Proxy{}
	for _, id := range []string{"a", "b", "c"} {
		bind := freeAddr(t)
		px, err := tcpproxy.Start(bind)
		if err != nil {
			t.Fatal(err)
		}
		defer px.Close()
		proxies[id], via[id] = px, raftAddrs{bind: bind, advertise: px.Addr()}
	}
	pc, objects := newReplicatedProcCluster(t, via)
	var late lateServing
	pc.hook = late.hook
	l := newIncLedger(pc)
	stop := make(chan struct{})
	wait := l.load(stop, 16, objects, "load")
	l.waitAcks(200, 60*time.Second, "before the cut")

	by, count := pc.leaders(objects)
	victim := mostLeading(count, "a", "b", "c")
	cut := time.Now()
	late.watch(victim, cut.Add(replCutLease))
	proxies[victim].Block()
	t.Logf("cut %s's incoming raft traffic at %s", victim, cut.Format("15:04:05.000"))

	// The others take its partitions over.
	var others []string
	for _, id := range []string{"a", "b", "c"} {
		if id != victim {
			others = append(others, id)
		}
	}
	othersPick := func() string { return pc.nodeURL(others[rand.Intn(len(others))]) }
	took := l.writableAfter(cut, objects, othersPick, "cut")
	t.Logf("cut %s's raft traffic (it led %d partitions %v): every object written again through the others after the cut: %s",
		victim, count[victim], count, failoverSummary(took, objects, by, victim))
	{ // a write forwarded to the leader as its raft traffic was cut is answered when it steps down
		for p, obj := range objects {
			if by[uint32(p)] == victim && took[obj] > 5*time.Second {
				t.Errorf("%s (partition %d, led by %s at the cut) written again only %v after the cut", obj, p, victim, took[obj])
			}
		}
	}
	// The others serve its partitions.
	for deadline := time.Now().Add(replFailoverCeiling); ; time.Sleep(100 * time.Millisecond) {
		_, c := pc.leaders(objects, others...)
		if c[victim] == 0 {
			t.Logf("%v after the cut the others serve every partition: %v", time.Since(cut).Round(time.Millisecond), c)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still serves partitions %v after its raft traffic was cut %v ago", victim, c, replFailoverCeiling)
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		took := l.writableAfter(time.Now(), objects, func() string { return pc.nodeURL(id) }, "cut-via-"+id)
		t.Logf("during the cut, every object written through %s: %s", id, failoverSummary(took, objects, by, victim))
	}
	l.waitAcks(200, 60*time.Second, "during the cut")
	late.check(t, "its raft traffic was cut")

	late.watch("", time.Time{})
	proxies[victim].Unblock()
	healed := time.Now()
	l.waitAcks(200, 60*time.Second, "after the heal")
	took = l.writableAfter(healed, objects, func() string { return pc.nodeURL(victim) }, "healed")
	t.Logf("after the heal, every object written through %s: %s", victim, failoverSummary(took, objects, by, victim))
	close(stop)
	wait()
	if err := pc.check.Verify(); err != nil {
		t.Error(err)
	}
	l.verify(objects)
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
