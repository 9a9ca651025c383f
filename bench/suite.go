package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/holdfast/holdfast/bench/peers"
)

// The systems a workload runs on. Holdfast runs embedded (its Go API, no
// network), as JetStream does (embedded server, its client over 127.0.0.1);
// Redis is a redis-server child process with its client over 127.0.0.1.
// Holdfast also runs in a child process, its clients in the case's process:
// over HTTP (holdfast-http, httpbench.go) and as an in-cluster Go client
// (holdfast-client, clientbench.go).
const (
	sysHoldfast  = "holdfast"
	sysRedis     = "redis"
	sysJetStream = "jetstream"
)

var systems = []string{sysHoldfast, sysHoldfastHTTP, sysHoldfastClient, sysRedis, sysJetStream}

// The replicated peers (issue 27), run only when -systems names them and only
// for replicatedWorkloads: a 3-member etcd cluster (three processes of the
// etcd binary built from the module cache), a 1-member one for reference, and
// JetStream R3 (three embedded servers in the case's process); and Holdfast
// itself with three replicas (holdfast-r3, holdfastr3.go), three nodes in the
// case's process.
const (
	sysEtcd3       = "etcd3"
	sysEtcd1       = "etcd1"
	sysJetStreamR3 = "jetstream-r3"
)

var replicatedSystems = []string{sysHoldfastR3, sysEtcd3, sysEtcd1, sysJetStreamR3}

// replicatedWorkloads are the workloads the replicated peers run: writes.
var replicatedWorkloads = []string{"one-writer", "1000-objects"}

// knownSystem says whether s is a system -systems may name.
func knownSystem(s string) bool {
	return slices.Contains(systems, s) || slices.Contains(replicatedSystems, s)
}

// workload is one row of the table: the same work on every system that has
// it, with Holdfast's targets.
type workload struct {
	name  string
	title string
	unit  string // what OpsPerSec counts
	// target is Holdfast's minimum median ratio to the probe; 0: none.
	target float64
	// vsRedis and vsJetStream are Holdfast's minimum median ratios to the
	// peer's figure; 0: none.
	vsRedis, vsJetStream float64
	// wire says that vsRedis and vsJetStream are targets of Holdfast's REST
	// figure, not of the embedded one (issue 28's cases).
	wire bool
	// vsRedisClient is the in-cluster Go client's minimum median ratio to
	// Redis's figure (issue 28 point 3); 0: none.
	vsRedisClient float64
	// payload says that every operation carries one 256-byte payload, so disk
	// bytes per payload byte make sense.
	payload bool
	// holdfast runs the workload embedded; nil: not run embedded (a wire
	// case with no embedded form, such as HTTP batches).
	holdfast func(dir string, d time.Duration) (result, error)
	// peer runs the workload on a started peer; nil: Holdfast only.
	peer func(p peers.Peer, d time.Duration) (peers.Result, error)
	// peerOnly, when set, is the one peer that has the workload (Redis's
	// INCR: JetStream has no increment).
	peerOnly string
	// http is the workload over Holdfast's REST API; nil: embedded only.
	http *httpSpec
	// client is the workload through an in-cluster Go client; nil: not run
	// there.
	client *clientSpec
	// r3 is the workload on holdfast-r3; nil: not run there.
	r3 *r3Spec
	// fill, for the lease and queue cases, is how many records per second of
	// the run they put in the log or queue first.
	fill int
}

func writes(objects, callers int) func(peers.Peer, time.Duration) (peers.Result, error) {
	return func(p peers.Peer, d time.Duration) (peers.Result, error) { return p.Writes(objects, callers, d) }
}

// incrs is the Redis form of the increment cases (peers.Redis.Increments).
func incrs(objects, callers, pipeline int) func(peers.Peer, time.Duration) (peers.Result, error) {
	return func(p peers.Peer, d time.Duration) (peers.Result, error) {
		r, ok := p.(*peers.Redis)
		if !ok {
			return peers.Result{}, fmt.Errorf("%s has no increments", p.Name())
		}
		return r.Increments(objects, callers, pipeline, d)
	}
}

var workloads = []workload{
	{name: "one-writer", title: "one writer, one write at a time", unit: "writes/s", target: 0.9, payload: true,
		holdfast: func(dir string, d time.Duration) (result, error) { return throughput(dir, d, 1, 1) }, peer: writes(1, 1), http: httpWrites(1, 1),
		r3: &r3Spec{objects: 1, callers: 1}},
	{name: "1000-objects", title: "1,000 objects, one write in flight each", unit: "writes/s", target: 40, vsRedis: 2.5, vsJetStream: 10, payload: true,
		holdfast: func(dir string, d time.Duration) (result, error) { return throughput(dir, d, 1000, 1000) }, peer: writes(1000, 1000), http: httpWrites(1000, 1000),
		r3: &r3Spec{objects: 1000, callers: 1000}},
	{name: "10000-objects", title: "10,000 objects, one write in flight each", unit: "writes/s", payload: true,
		holdfast: func(dir string, d time.Duration) (result, error) { return throughput(dir, d, 10000, 10000) }, peer: writes(10000, 10000), http: httpWrites(10000, 10000)},
	// The wire (issue 28): increments, over REST one at a time and in
	// batches (POST /api/v1/batch), and through an in-cluster Go client one at
	// a time, against Redis's INCR one at a time and pipelined by the same
	// number of clients.
	{name: "increments-256", title: "increments, 1,000 objects, 256 callers, one in flight each", unit: "increments/s", vsRedis: 0.4, wire: true, vsRedisClient: 1,
		holdfast: func(dir string, d time.Duration) (result, error) { return increments(dir, d, 1000, 256) },
		peer:     incrs(1000, 256, 1), peerOnly: sysRedis, http: httpIncrements(1000, 256), client: clientIncrements(1000, 256)},
	{name: "batch-increments-16x100", title: "increments, 1,000 objects, 16 clients each sending 100 at once (REST: one batch; Redis: one pipeline)", unit: "increments/s", vsRedis: 0.3, wire: true,
		peer: incrs(1000, 16, 100), peerOnly: sysRedis, http: httpBatchIncrements(1000, 16, 100)},
	// Holdfast only: the floor under 1000-objects (userRequests).
	{name: "1000-objects-noop", title: "1,000 objects of a user type, a handler that does nothing", unit: "requests/s",
		holdfast: func(dir string, d time.Duration) (result, error) { return userRequests(dir, d, 1000, false) }},
	{name: "1000-objects-put", title: "1,000 objects of a user type, a handler that puts one 256-byte key", unit: "writes/s", payload: true,
		holdfast: func(dir string, d time.Duration) (result, error) { return userRequests(dir, d, 1000, true) }},
	{name: "hot-object-64-callers", title: "one hot object, 64 callers", unit: "writes/s", target: 8, payload: true,
		holdfast: func(dir string, d time.Duration) (result, error) { return throughput(dir, d, 1, 64) }, peer: writes(1, 64), http: httpWrites(1, 64)},
	{name: "kv-writes", title: "KV writes: 64 callers over 1,000 keys", unit: "writes/s", payload: true,
		holdfast: func(dir string, d time.Duration) (result, error) { return throughput(dir, d, 1000, 64) },
		peer:     func(p peers.Peer, d time.Duration) (peers.Result, error) { return p.KVWrites(64, 1000, d) }, http: httpWrites(1000, 64)},
	{name: "batches-of-100", title: "batches of 100 records, one producer", unit: "records/s", target: 40, payload: true,
		holdfast: func(dir string, d time.Duration) (result, error) { return logAppends(dir, d, 1, 1, 100) },
		peer:     func(p peers.Peer, d time.Duration) (peers.Result, error) { return p.Batches(100, d) }, http: httpBatches(100)},
	{name: "lease-cycles-1", title: "lease cycles (take 10, ack), 1 consumer", unit: "cycles/s", vsRedis: 1, fill: 60_000,
		holdfast: func(dir string, d time.Duration) (result, error) { return leaseCycles(dir, d, 1) },
		peer:     func(p peers.Peer, d time.Duration) (peers.Result, error) { return p.LeaseCycles(1, d) }, http: httpLeases(1)},
	{name: "lease-cycles-64", title: "lease cycles (take 10, ack), 64 consumers", unit: "cycles/s", vsRedis: 2, fill: 500_000,
		holdfast: func(dir string, d time.Duration) (result, error) { return leaseCycles(dir, d, 64) },
		peer:     func(p peers.Peer, d time.Duration) (peers.Result, error) { return p.LeaseCycles(64, d) }, http: httpLeases(64)},
	// The write-ahead queue against Redis streams (XADD; XREADGROUP + XACK).
	{name: "queue-enqueue-64", title: "queue: enqueue, 64 producers, one message in flight each", unit: "messages/s", payload: true,
		holdfast: func(dir string, d time.Duration) (result, error) { return queueEnqueue(dir, d, 64, 1) },
		peer:     func(p peers.Peer, d time.Duration) (peers.Result, error) { return p.StreamAdds(64, d) }},
	{name: "queue-enqueue-batches-100", title: "queue: enqueue batches of 100, one producer", unit: "messages/s", payload: true,
		holdfast: func(dir string, d time.Duration) (result, error) { return queueEnqueue(dir, d, 1, 100) },
		peer:     func(p peers.Peer, d time.Duration) (peers.Result, error) { return p.Batches(100, d) }},
	{name: "queue-cycles-1", title: "queue: receive 10 + ack, 1 consumer", unit: "cycles/s", fill: 30_000,
		holdfast: func(dir string, d time.Duration) (result, error) { return queueCycles(dir, d, 1) },
		peer:     func(p peers.Peer, d time.Duration) (peers.Result, error) { return p.LeaseCycles(1, d) }},
	{name: "queue-cycles-64", title: "queue: receive 10 + ack, 64 consumers", unit: "cycles/s", fill: 200_000,
		holdfast: func(dir string, d time.Duration) (result, error) { return queueCycles(dir, d, 64) },
		peer:     func(p peers.Peer, d time.Duration) (peers.Result, error) { return p.LeaseCycles(64, d) }},
	// Holdfast only: how group commit behaves across several logs.
	{name: "batches-of-100-4-logs", title: "batches of 100 records, 4 producers on 4 logs", unit: "records/s", target: 40, payload: true,
		holdfast: func(dir string, d time.Duration) (result, error) { return logAppends(dir, d, 4, 4, 100) }},
	{name: "1000-logs-single-records", title: "single records, 1,000 logs, one in flight each", unit: "records/s", target: 30, payload: true,
		holdfast: func(dir string, d time.Duration) (result, error) { return logAppends(dir, d, 1000, 1000, 1) }},
}

// peerTarget is one of a workload's targets over a peer: the minimum median
// ratio of one Holdfast system's figure to the peer's.
type peerTarget struct {
	system string // whose figure: holdfast, holdfast-http or holdfast-client
	min    float64
}

// targetsOver returns w's targets over peer: vsRedis and vsJetStream on the
// embedded figure, or on the REST one for a wire case; vsRedisClient on the
// in-cluster Go client's.
func (w workload) targetsOver(peer string) []peerTarget {
	on := sysHoldfast
	if w.wire {
		on = sysHoldfastHTTP
	}
	var out []peerTarget
	switch {
	case peer == sysRedis && w.vsRedis > 0:
		out = append(out, peerTarget{on, w.vsRedis})
	case peer == sysJetStream && w.vsJetStream > 0:
		out = append(out, peerTarget{on, w.vsJetStream})
	}
	if peer == sysRedis && w.vsRedisClient > 0 {
		out = append(out, peerTarget{sysHoldfastClient, w.vsRedisClient})
	}
	return out
}

// caseName names one process of the driver: a system and a workload.
func caseName(system, workload string) string { return system + "/" + workload }

// restartCase is the one-off case "restart with N records", per system.
const restartCase = "restart"

// has says whether the workload runs on system s.
func (w workload) has(s string) bool {
	switch s {
	case sysHoldfast:
		return w.holdfast != nil
	case sysHoldfastHTTP:
		return w.http != nil
	case sysHoldfastClient:
		return w.client != nil
	case sysHoldfastR3:
		return w.r3 != nil
	}
	if slices.Contains(replicatedSystems, s) {
		return w.peer != nil && slices.Contains(replicatedWorkloads, w.name)
	}
	return w.peer != nil && (w.peerOnly == "" || w.peerOnly == s)
}

// runPeerCase starts the peer in dir, runs the workload (peers.Warmup first),
// and stops the peer.
func runPeerCase(system string, w workload, dir string, d time.Duration, restartRecords int) (result, error) {
	p, err := peers.Start(system, dir)
	if err != nil {
		return result{}, err
	}
	defer p.Close()
	if w.name == restartCase {
		s, err := p.FillAndRestart(restartRecords)
		return result{LogRecords: restartRecords, StartSeconds: s}, err
	}
	r, err := w.peer(p, d)
	if err != nil {
		return result{}, err
	}
	out := result{OpsPerSec: r.OpsPerSec, Ops: r.Ops, DiskBytes: r.DiskBytes, CPUSeconds: r.ClientCPU.Seconds(), Note: r.Note,
		LatencyP50Ms: ms(r.LatencyP50), LatencyP99Ms: ms(r.LatencyP99)}
	if p.PID() != os.Getpid() {
		out.ServerCPU = r.ServerCPU.Seconds()
	}
	if w.payload {
		out.PayloadBytes = float64(r.Ops) * peers.PayloadSize
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ensureRedis installs Debian's redis-server when it is missing and the driver
// may (root, apt-get present); the driver starts its own servers.
func ensureRedis() error {
	if _, err := exec.LookPath("redis-server"); err == nil {
		return nil
	}
	if os.Geteuid() != 0 {
		return errors.New("redis-server is not installed; install Debian's redis-server (apt-get install redis-server) or run the driver as root")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return errors.New("redis-server is not installed and there is no apt-get to install it")
	}
	fmt.Fprintln(os.Stderr, "bench: installing redis-server (apt-get)")
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "redis-server"}} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("apt-get %v: %w", args, err)
		}
	}
	_, err := exec.LookPath("redis-server")
	return err
}

// leaseRecordsFor is how many records a lease or queue case puts in its log
// or queue first: perSec records for each second of the warm-up and the
// measured interval (enough for the fastest system seen here, with room to
// spare). A case that runs dry anyway is measured up to that moment and says
// so in its note.
func leaseRecordsFor(d, warmup time.Duration, perSec int) int {
	return max(20_000, int(float64(perSec)*(d+warmup).Seconds()))
}

func findWorkload(name string) (workload, bool) {
	if name == restartCase {
		return workload{name: restartCase}, true
	}
	for _, w := range workloads {
		if w.name == name {
			return w, true
		}
	}
	return workload{}, false
}

// childDir is a case's fresh data directory.
func childDir(base string, round int, name string) string {
	return filepath.Join(base, fmt.Sprintf("r%d-%s", round, strings.ReplaceAll(name, "/", "-")))
}
