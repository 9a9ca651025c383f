package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/bench/peers"
)

// result is what one case prints, as one JSON line, from its own process.
type result struct {
	Case          string  `json:"case"`
	OpsPerSec     float64 `json:"opsPerSec,omitempty"`
	SyncsPerWrite float64 `json:"syncsPerWrite,omitempty"`
	// Memory case only.
	BytesPerActive   float64 `json:"bytesPerActive,omitempty"`
	BytesPerIdle     float64 `json:"bytesPerIdle,omitempty"`
	HighWaterPerPeak float64 `json:"highWaterPerPeakObject,omitempty"`
	// Large-log case only.
	LogRecords        int     `json:"logRecords,omitempty"`
	FillRecordsPerSec float64 `json:"fillRecordsPerSec,omitempty"`
	ReadRecordsPerSec float64 `json:"readRecordsPerSec,omitempty"`
	StartSeconds      float64 `json:"startSeconds,omitempty"`
	// Redelivery case only.
	RedeliveryP50Ms float64 `json:"redeliveryP50Ms,omitempty"`
	RedeliveryP99Ms float64 `json:"redeliveryP99Ms,omitempty"`
	// Peer write cases: one operation's latency over the measured interval.
	LatencyP50Ms float64 `json:"latencyP50Ms,omitempty"`
	LatencyP99Ms float64 `json:"latencyP99Ms,omitempty"`
	// Queue latency case only: enqueue call to push handler.
	QueueLatencyP50Ms float64 `json:"queueLatencyP50Ms,omitempty"`
	QueueLatencyP99Ms float64 `json:"queueLatencyP99Ms,omitempty"`
	// Costs over the measured interval: operations, bytes written to disk by
	// the server process (/proc/<pid>/io write_bytes), CPU seconds of this
	// process, and the payload bytes written (0 where it means nothing).
	Ops          int64   `json:"ops,omitempty"`
	DiskBytes    uint64  `json:"diskBytes,omitempty"`
	CPUSeconds   float64 `json:"cpuSeconds,omitempty"`
	ServerCPU    float64 `json:"serverCPUSeconds,omitempty"` // a separate server process's (Redis)
	PayloadBytes float64 `json:"payloadBytes,omitempty"`
	Note         string  `json:"note,omitempty"`
}

func main() {
	var (
		rounds   = flag.Int("rounds", 5, "rounds of every case")
		duration = flag.Duration("duration", 3*time.Second, "measured time per case")
		warmup   = flag.Duration("warmup", 500*time.Millisecond, "unmeasured time before each case")
		memObjs  = flag.Int("memory-objects", 100000, "objects for the memory case (0 skips it)")
		logRecs  = flag.Int("log-records", 1000000, "records of the restart case on every system, and of Holdfast's large-log reads (0 skips them)")
		jsonOut  = flag.String("json", "", "also write the summary as JSON to this file")
		mdOut    = flag.String("md", "", "also write the Markdown report to this file")
		dirFlag  = flag.String("dir", "", "directory for data and the probe file (default: a temporary directory)")
		only     = flag.String("case", "", "internal: run one case (system/workload, or probe, memory...) in this process")
		check    = flag.Bool("check", false, "exit 1 when a median ratio is below half its target")
		smoke    = flag.Bool("smoke", false, "the CI profile: 2 short rounds of the cases with targets, small restart case, no memory case; exit 1 only when a ratio is below a tenth of its target")
		filter   = flag.String("cases", "", "comma-separated workload names to run (default: all)")
		sysFlag  = flag.String("systems", strings.Join(systems, ","), "comma-separated systems to run: holdfast, holdfast-http, holdfast-client, redis, jetstream; and, only when named, the replicated systems holdfast-r3, etcd3, etcd1, jetstream-r3 (one-writer and 1000-objects)")
		fanout   = flag.Bool("fanout", false, "run the websocket fan-out benchmark instead of the write cases")
		floor    = flag.Bool("http-floor", false, "run the HTTP floor (net/http and fasthttp servers answering a fixed reply) beside Holdfast's REST increments and Redis's INCR, instead of the write cases")
		fSockets = flag.Int("fanout-sockets", 1000, "fan-out: websockets")
		fObjects = flag.Int("fanout-objects", 100, "fan-out: objects the sockets subscribe to")
		fRate    = flag.Int("fanout-rate", 500, "fan-out: writes per second over all objects")
		coldMode = flag.Bool("cold", false, "run the cold storage benchmark (cold/fs and a MinIO process) instead of the write cases")
		coldRecs = flag.Int("cold-records", 1000000, "cold: records in the log")
		alarmsOn = flag.Bool("alarms", false, "run the alarms benchmark instead of the write cases")
		aObjects = flag.Int("alarm-objects", 100000, "alarms: objects")
		aCount   = flag.Int("alarm-count", 1000000, "alarms: alarms (10 names per object at most)")
		aRate    = flag.Int("alarm-rate", 10000, "alarms: alarms falling due per second")
		aWindow  = flag.Duration("alarm-window", 30*time.Second, "alarms: how long firing is measured")
		aLead    = flag.Duration("alarm-lead", 90*time.Second, "alarms: the first alarm is due this long after the set phase starts")
		aT0      = flag.Int64("alarm-t0", 0, "internal: unix ms of the first alarm")
		clMode   = flag.Bool("cluster", false, "run the cluster benchmark (a cluster's nodes in one child process per phase) instead of the write cases")
		cMiB     = flag.Int("cluster-mib", 256, "cluster: MiB of log data the leaving node hands off")
		leasePar = flag.Int("lease-parallelism", 64, "internal: the http-server child's maxParallelism of leases")
		stMode   = flag.Bool("stall", false, "run the storage-maintenance stall benchmark (write latency with and without maintenance, each phase in a child process) instead of the write cases")
		stCalls  = flag.Int("stall-callers", 64, "stall: callers, one write in flight each, over 1,000 objects")
		stRate   = flag.Int("stall-big-rate", 16, "stall: 1 MiB values per second the maintenance phase's background writer overwrites")
		stMem    = flag.Int("stall-memtable-mib", 8, "stall: Badger's memtable size in both phases, MiB (at least 7; Holdfast's default is 128)")
		stSeg    = flag.Int("stall-segment-mib", 8, "stall: write-ahead log segment size in both phases, MiB (Holdfast's default is 64)")
		stVlog   = flag.Int("stall-vlog-mib", 8, "stall: value-log file size in both phases, MiB (Holdfast's default is 128)")
		stGC     = flag.Duration("stall-gc-every", 100*time.Millisecond, "stall: the value-log GC's interval in both phases; negative turns it off (and the memtable flushes it asks for)")
		rMode    = flag.Bool("replicated", false, "run the replicated-cluster benchmark (failover and catch-up, three holdfast serve processes) instead of the write cases")
		rKills   = flag.Int("replicated-kills", 10, "replicated: kills -9 of the node leading the most partitions")
		rMiB     = flag.Int("replicated-mib", 1024, "replicated: MiB of KV data before a node is rebuilt from nothing")
		rParts   = flag.Int("replicated-partitions", 256, "replicated: the cluster's partitions (256 is the default of a node)")
		rBin     = flag.String("replicated-bin", "", "replicated: the holdfast binary (default: build ./cmd/holdfast)")
	)
	flag.Parse()
	if httpClientKind != "" && httpClientKind != "nethttp" && httpClientKind != "fasthttp" {
		fatal(fmt.Errorf("HOLDFAST_BENCH_HTTP_CLIENT is %q: nethttp (the default) or fasthttp", httpClientKind))
	}
	acfg := alarmConfig{objects: *aObjects, count: *aCount, rate: *aRate, window: *aWindow, lead: *aLead}
	if *only == "alarms-set" || *only == "alarms-fire" {
		os.Exit(alarmChild(*only, *dirFlag, acfg, *aT0))
	}
	if *only == "fanout-server" {
		os.Exit(fanoutServer(*dirFlag))
	}
	if *only == "http-server" {
		os.Exit(httpServer(*dirFlag, *leasePar))
	}
	if kind, ok := strings.CutPrefix(*only, "server-floor-"); ok {
		os.Exit(floorServer("floor-" + kind))
	}
	if *only == floorNetHTTP || *only == floorFastHTTP {
		r, err := floorCase(*only, *duration, *warmup)
		if err != nil {
			fatal(err)
		}
		r.Case = *only
		_ = json.NewEncoder(os.Stdout).Encode(r)
		os.Exit(0)
	}
	if *only == "client-server" {
		os.Exit(clientServer(*dirFlag))
	}
	ccfg := clusterConfig{rounds: *rounds, d: *duration, warmup: *warmup, mib: *cMiB}
	if strings.HasPrefix(*only, "cluster-") {
		os.Exit(clusterChild(*only, *dirFlag, ccfg))
	}
	scfg := stallConfig{rounds: *rounds, d: *duration, warmup: *warmup, callers: *stCalls, bigRate: *stRate,
		memTableMiB: *stMem, segmentMiB: *stSeg, valueLogMiB: *stVlog, gcEvery: *stGC}
	if strings.HasPrefix(*only, "stall-") {
		os.Exit(stallChild(*only, *dirFlag, scfg))
	}
	if *only != "" {
		os.Exit(runChild(*only, *dirFlag, *duration, *warmup, *memObjs, *logRecs))
	}
	cfg := driveConfig{rounds: *rounds, d: *duration, warmup: *warmup, memObjs: *memObjs, logRecs: *logRecs,
		jsonOut: *jsonOut, mdOut: *mdOut, floor: 0}
	if *check {
		cfg.floor = 0.5
	}
	if *smoke {
		cfg.rounds, cfg.d, cfg.warmup, cfg.memObjs, cfg.logRecs, cfg.floor = 2, time.Second, 200*time.Millisecond, 0, 100000, 0.1
	}
	cfg.workloads = workloads
	if *smoke && *filter == "" {
		// The cases with targets and the KV writes; not 10,000 objects (JetStream
		// acknowledges 10,000 publishes in flight in waves of seconds, longer
		// than a smoke interval) nor the Holdfast-only log cases.
		*filter = "one-writer,1000-objects,hot-object-64-callers,kv-writes,batches-of-100,lease-cycles-1,lease-cycles-64,queue-enqueue-64,queue-cycles-64,increments-256,batch-increments-16x100"
	}
	if *filter != "" {
		keep := map[string]bool{}
		for _, n := range strings.Split(*filter, ",") {
			keep[n] = true
		}
		cfg.workloads = nil
		for _, w := range workloads {
			if keep[w.name] {
				cfg.workloads = append(cfg.workloads, w)
			}
		}
	}
	for _, s := range strings.Split(*sysFlag, ",") {
		if !knownSystem(s) {
			fatal(fmt.Errorf("unknown system %q (want %s)", s, strings.Join(slices.Concat(systems, replicatedSystems), ", ")))
		}
		cfg.systems = append(cfg.systems, s)
	}
	base := *dirFlag
	if base == "" {
		var err error
		if base, err = os.MkdirTemp("", "holdfast-bench-"); err != nil {
			fatal(err)
		}
		defer os.RemoveAll(base)
	}
	if *coldMode {
		os.Exit(runCold(base, *coldRecs, *rounds))
	}
	if *clMode {
		os.Exit(runCluster(base, ccfg, *mdOut, *jsonOut))
	}
	if *rMode {
		os.Exit(runReplicated(base, replConfig{bin: *rBin, kills: *rKills, mib: *rMiB, partitions: *rParts, valueKiB: 64,
			settleTimeout: 5 * time.Minute, progress: os.Stderr}, *dirFlag == "", *mdOut, *jsonOut))
	}
	if *stMode {
		if !flagSet("warmup") {
			// Long enough for the value log to fill files, and compactions to
			// find their garbage, before the measured interval.
			scfg.warmup = 3 * time.Second
		}
		os.Exit(runStall(base, scfg, *mdOut, *jsonOut))
	}
	if *floor {
		os.Exit(runHTTPFloor(base, *rounds, *duration, *warmup, *mdOut))
	}
	if *alarmsOn {
		os.Exit(runAlarms(base, acfg, *jsonOut))
	}
	if *fanout {
		os.Exit(runFanout(base, fanoutConfig{sockets: *fSockets, objects: *fObjects, rate: *fRate, duration: *duration, rounds: *rounds}, *jsonOut))
	}
	if slices.Contains(cfg.systems, sysRedis) {
		if err := ensureRedis(); err != nil {
			fatal(err)
		}
	}
	os.Exit(drive(base, cfg))
}

// flagSet says whether the command line set flag name.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// runChild runs one case and prints its result as JSON.
func runChild(name, dir string, d, warmup time.Duration, memObjs, logRecs int) int {
	var r result
	var err error
	peers.Warmup = warmup
	switch name {
	case "probe":
		r, err = probe(dir, d)
	case "memory":
		r, err = memory(dir, memObjs)
	case "redelivery":
		r, err = redeliveryDelay(dir, 200)
	case "queue-latency":
		r, err = queueLatency(dir, d, 500)
	default:
		system, wname, _ := strings.Cut(name, "/")
		w, found := findWorkload(wname)
		peers.LeaseRecords = leaseRecordsFor(d, warmup, w.fill)
		switch {
		case !found || !knownSystem(system):
			err = fmt.Errorf("unknown case %q", name)
		case system == sysHoldfastHTTP && w.name != restartCase:
			r, err = httpCase(w, dir, d, warmup)
		case system == sysHoldfastClient && w.name != restartCase:
			r, err = clientCase(w, dir, d, warmup)
		case system == sysHoldfastR3:
			r, err = holdfastR3Case(w, dir, d)
		case system != sysHoldfast:
			r, err = runPeerCase(system, w, dir, d, logRecs)
		case w.name == restartCase:
			r, err = logLarge(dir, logRecs)
		case w.holdfast == nil:
			err = fmt.Errorf("%s has no embedded form", w.name)
		default:
			if warmup > 0 {
				peers.LeaseRecords = leaseRecordsFor(warmup, 0, w.fill)
				if _, err = w.holdfast(filepath.Join(dir, "warmup"), warmup); err != nil {
					break
				}
				peers.LeaseRecords = leaseRecordsFor(d, warmup, w.fill)
			}
			stopProfile, stopTrace, stopAllocs := profileCPU(), traceRun(), profileAllocs()
			r, err = w.holdfast(filepath.Join(dir, "data"), d)
			stopAllocs()
			stopTrace()
			stopProfile()
			if !w.payload {
				r.PayloadBytes = 0
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", name+":", err)
		return 1
	}
	r.Case = name
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

// profileCPU starts a CPU profile into $HOLDFAST_BENCH_CPUPROFILE, when set;
// it returns the function that stops it.
func profileCPU() func() {
	return profileTo("HOLDFAST_BENCH_CPUPROFILE", pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// profileAllocs writes a heap profile into $HOLDFAST_BENCH_ALLOCPROFILE, when
// set, at the end of the measured interval; it returns the function that writes
// it. Its alloc_space counts every allocation since the process started, the
// warm-up's included.
func profileAllocs() func() {
	var out io.Writer
	return profileTo("HOLDFAST_BENCH_ALLOCPROFILE", func(w io.Writer) error {
		out = w
		return nil
	}, func() {
		runtime.GC() // the profile is as of the last GC: count up to now (as go test -memprofile does)
		if err := pprof.Lookup("allocs").WriteTo(out, 0); err != nil {
			fatal(err)
		}
	})
}

// traceRun writes an execution trace into $HOLDFAST_BENCH_TRACE, when set; it
// returns the function that stops it.
func traceRun() func() { return profileTo("HOLDFAST_BENCH_TRACE", trace.Start, trace.Stop) }

// profileTo runs start on the file named by the environment variable env,
// when set, and returns the function that stops it and closes the file.
func profileTo(env string, start func(io.Writer) error, stop func()) func() {
	path := os.Getenv(env)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		fatal(err)
	}
	if err := start(f); err != nil {
		fatal(err)
	}
	return func() { stop(); f.Close() }
}

// meter measures the costs of a measured interval in this process.
type meter struct {
	disk uint64
	cpu  time.Duration
}

func startMeter() meter {
	disk, _ := peers.DiskWriteBytes(os.Getpid())
	return meter{disk: disk, cpu: peers.ProcessCPU()}
}

// stop fills r's costs: ops operations, each with one 256-byte payload.
func (m meter) stop(r *result, ops int64) {
	disk, _ := peers.DiskWriteBytes(os.Getpid())
	if disk >= m.disk {
		r.DiskBytes = disk - m.disk
	}
	r.CPUSeconds = (peers.ProcessCPU() - m.cpu).Seconds()
	r.Ops = ops
	r.PayloadBytes = float64(ops) * peers.PayloadSize
}

// probe overwrites 4 KiB at the start of a pre-written file and fdatasyncs it, as
// often as it can for d.
func probe(dir string, d time.Duration) (result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return result{}, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		return result{}, err
	}
	defer f.Close()
	buf := make([]byte, 4096)
	rand.Read(buf)
	for i := 0; i < 256; i++ { // pre-write 1 MiB so that overwrites allocate nothing
		if _, err := f.Write(buf); err != nil {
			return result{}, err
		}
	}
	if err := f.Sync(); err != nil {
		return result{}, err
	}
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		buf[0] = byte(n)
		if _, err := f.WriteAt(buf, 0); err != nil {
			return result{}, err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return result{}, err
		}
		n++
	}
	return result{OpsPerSec: float64(n) / time.Since(start).Seconds()}, nil
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// throughput runs callers goroutines, each writing to object (i mod objects), one
// write at a time each, for d.
func throughput(dir string, d time.Duration, objects, callers int) (result, error) {
	var value any = string(peers.Payload()) // the peers' 256-byte value, boxed once
	return kvWrites(dir, d, objects, callers, func(ctx context.Context, o *holdfast.Object) error {
		_, err := o.Set(ctx, "v", value)
		return err
	})
}

// increments is the embedded form of increments-256: callers goroutines, caller
// c incrementing slot n of object c mod objects, one in flight each.
func increments(dir string, d time.Duration, objects, callers int) (result, error) {
	return kvWrites(dir, d, objects, callers, func(ctx context.Context, o *holdfast.Object) error {
		_, err := o.Increment(ctx, "n", 1)
		return err
	})
}

// kvWrites runs callers goroutines, caller c doing write on object c mod
// objects (all activated first), one write in flight each.
func kvWrites(dir string, d time.Duration, objects, callers int, write func(context.Context, *holdfast.Object) error) (result, error) {
	rt, err := holdfast.Open(holdfast.Options{DataDir: dir, Logger: quietLogger(), TuneGOMAXPROCS: true})
	if err != nil {
		return result{}, err
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	objs := make([]*holdfast.Object, objects)
	for i := range objs {
		objs[i] = rt.Object("app_bench", "bench", fmt.Sprintf("obj-%d", i))
	}
	if err := activate(objs); err != nil {
		return result{}, err
	}
	before := rt.Node().Stats().Pipeline
	m := startMeter()
	iv, err := runWorkers(callers, d, func(c int) (int64, error) {
		return 1, write(ctx, objs[c%objects])
	})
	if err != nil {
		return result{}, err
	}
	after := rt.Node().Stats().Pipeline
	r := result{
		OpsPerSec:     iv.perSec(),
		SyncsPerWrite: float64(after.Commits-before.Commits) / float64(after.Writes-before.Writes),
	}
	m.stop(&r, iv.ops)
	return r, nil
}

// The floor cases: 1,000 objects of a user-defined type, one request in flight
// each, whose handler either does nothing (the request path alone: routing, the
// actor's turn, the reply) or puts one 256-byte key (that plus one key through
// the commit pipeline and Badger, with no change log and no JSON). Side by side
// with 1000-objects, they split a KV write's CPU between the request path, the
// storage path and the KV object's own work.
type floorNoop struct{}
type floorPut struct{}

func userRequests(dir string, d time.Duration, objects int, write bool) (result, error) {
	value := peers.Payload()
	rt, err := holdfast.Open(holdfast.Options{DataDir: dir, Logger: quietLogger(), TuneGOMAXPROCS: true, Types: []holdfast.TypeSpec{{
		Name: "floor",
		Handle: func(c *holdfast.Context, msg any) (any, error) {
			if _, ok := msg.(floorPut); ok {
				return nil, c.Put("v", value)
			}
			return nil, nil
		},
	}}})
	if err != nil {
		return result{}, err
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	keys := make([]string, objects)
	for i := range keys {
		keys[i] = fmt.Sprintf("obj-%d", i)
	}
	var msg any = floorNoop{}
	if write {
		msg = floorPut{}
	}
	for _, k := range keys { // activate every object first
		if _, err := rt.Request(ctx, "app_bench", "floor", k, msg); err != nil {
			return result{}, err
		}
	}
	before := rt.Node().Stats().Pipeline
	m := startMeter()
	iv, err := runWorkers(objects, d, func(c int) (int64, error) {
		_, err := rt.Request(ctx, "app_bench", "floor", keys[c], msg)
		return 1, err
	})
	if err != nil {
		return result{}, err
	}
	r := result{OpsPerSec: iv.perSec()}
	if after := rt.Node().Stats().Pipeline; after.Writes > before.Writes {
		r.SyncsPerWrite = float64(after.Commits-before.Commits) / float64(after.Writes-before.Writes)
	}
	m.stop(&r, iv.ops)
	return r, nil
}

// activate writes each object once, 256 at a time, before the measured interval.
func activate(objs []*holdfast.Object) error {
	var wg sync.WaitGroup
	var failed atomic.Value
	sem := make(chan struct{}, 256)
	for _, o := range objs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := o.Set(context.Background(), "v", 0); err != nil {
				failed.Store(err)
			}
		}()
	}
	wg.Wait()
	err, _ := failed.Load().(error)
	return err
}

// memory activates n objects and measures the Go heap per active object once they
// are quiet; then it waits for them all to passivate and measures what is left. The
// runtime's routing tables keep the capacity of their peak size (Go maps never
// shrink), so the figure per idle object is the growth over a second round of n
// different objects: activated, passivated, measured against the first round.
func memory(dir string, n int) (result, error) {
	// Long enough that no object of a round passivates before the round is
	// measured: activating 100,000 objects takes 1-3 s here, then 2 s of quiet.
	const idle = 10 * time.Second
	rt, err := holdfast.Open(holdfast.Options{DataDir: dir, IdleTimeout: idle, Logger: quietLogger()})
	if err != nil {
		return result{}, err
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	heap := func() float64 {
		runtime.GC()
		debug.FreeOSMemory()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return float64(m.HeapAlloc)
	}
	activate := func(round int) error {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 256)
		var failed atomic.Value
		for i := 0; i < n; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func(i int) {
				defer wg.Done()
				defer func() { <-sem }()
				if _, err := rt.Object("app_bench", "mem", fmt.Sprintf("r%d-o%d", round, i)).Set(ctx, "v", i); err != nil {
					failed.Store(err)
				}
			}(i)
		}
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			return err
		}
		return nil
	}
	waitPassivated := func() error {
		deadline := time.Now().Add(idle*5 + 30*time.Second)
		for rt.Node().Stats().ActiveObjects > 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("%d objects still active", rt.Node().Stats().ActiveObjects)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	}
	// Warm the runtime (actor system, pipeline, Badger's memtable arena).
	if _, err := rt.Object("app_bench", "mem", "warm").Set(ctx, "v", 1); err != nil {
		return result{}, err
	}
	if err := waitPassivated(); err != nil {
		return result{}, err
	}
	base := heap()
	if err := activate(0); err != nil {
		return result{}, err
	}
	time.Sleep(2 * time.Second) // quiet, still active: applied writes' buffers are dropped
	afterActive := heap()
	if active := rt.Node().Stats().ActiveObjects; active != n {
		// The figure is per active object: one that passivated before the
		// measurement would leave its share of the heap to the others.
		return result{}, fmt.Errorf("%d of %d objects active when measured (the idle timeout of %s is too short for this machine)", active, n, idle)
	}
	perActive := (afterActive - base) / float64(n)
	if err := waitPassivated(); err != nil {
		return result{}, err
	}
	afterFirst := heap()
	if err := activate(1); err != nil {
		return result{}, err
	}
	if err := waitPassivated(); err != nil {
		return result{}, err
	}
	perIdle := (heap() - afterFirst) / float64(n)
	return result{BytesPerActive: perActive, BytesPerIdle: perIdle, HighWaterPerPeak: (afterFirst - base) / float64(n)}, nil
}
