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
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/holdfast/holdfast"
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
}

type caseSpec struct {
	name   string
	target float64 // minimum ratio to the probe; 0: none
	run    func(dir string, d time.Duration) (result, error)
}

var cases = []caseSpec{
	{"one-object-serial", 0.8, func(dir string, d time.Duration) (result, error) { return throughput(dir, d, 1, 1) }},
	{"1000-objects-1-in-flight", 30, func(dir string, d time.Duration) (result, error) { return throughput(dir, d, 1000, 1000) }},
	{"one-object-64-callers", 8, func(dir string, d time.Duration) (result, error) { return throughput(dir, d, 1, 64) }},
	// Records per second (not appends) against the probe's syncs per second.
	{"log-batches-of-100", 40, func(dir string, d time.Duration) (result, error) { return logAppends(dir, d, 1, 1, 100) }},
	{"log-batches-of-100-4-logs", 40, func(dir string, d time.Duration) (result, error) { return logAppends(dir, d, 4, 4, 100) }},
	{"log-1000-logs-single-records", 30, func(dir string, d time.Duration) (result, error) { return logAppends(dir, d, 1000, 1000, 1) }},
	// Lease+ack cycles (10 records each) per second on one consumer.
	{"log-lease-ack-1-poller", 0, func(dir string, d time.Duration) (result, error) { return leaseCycles(dir, d, 1) }},
	{"log-lease-ack-64-pollers", 0, func(dir string, d time.Duration) (result, error) { return leaseCycles(dir, d, 64) }},
}

func main() {
	var (
		rounds   = flag.Int("rounds", 5, "rounds of every case")
		duration = flag.Duration("duration", 3*time.Second, "measured time per case")
		warmup   = flag.Duration("warmup", 500*time.Millisecond, "unmeasured time before each case")
		memObjs  = flag.Int("memory-objects", 100000, "objects for the memory case (0 skips it)")
		logRecs  = flag.Int("log-records", 1000000, "records of the large-log case: reads and start-up (0 skips it)")
		jsonOut  = flag.String("json", "", "also write the summary as JSON to this file")
		dirFlag  = flag.String("dir", "", "directory for data and the probe file (default: a temporary directory)")
		only     = flag.String("case", "", "internal: run one case in this process")
		check    = flag.Bool("check", false, "exit 1 when a median ratio is below half its target")
		filter   = flag.String("cases", "", "comma-separated case names to run (default: all)")
		fanout   = flag.Bool("fanout", false, "run the websocket fan-out benchmark instead of the write cases")
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
	)
	flag.Parse()
	acfg := alarmConfig{objects: *aObjects, count: *aCount, rate: *aRate, window: *aWindow, lead: *aLead}
	if *only == "alarms-set" || *only == "alarms-fire" {
		os.Exit(alarmChild(*only, *dirFlag, acfg, *aT0))
	}
	if *only == "fanout-server" {
		os.Exit(fanoutServer(*dirFlag))
	}
	if *only != "" {
		os.Exit(runChild(*only, *dirFlag, *duration, *warmup, *memObjs, *logRecs))
	}
	if *filter != "" {
		keep := map[string]bool{}
		for _, n := range strings.Split(*filter, ",") {
			keep[n] = true
		}
		var sel []caseSpec
		for _, c := range cases {
			if keep[c.name] {
				sel = append(sel, c)
			}
		}
		cases = sel
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
	if *alarmsOn {
		os.Exit(runAlarms(base, acfg, *jsonOut))
	}
	if *fanout {
		os.Exit(runFanout(base, fanoutConfig{sockets: *fSockets, objects: *fObjects, rate: *fRate, duration: *duration, rounds: *rounds}, *jsonOut))
	}
	os.Exit(drive(base, *rounds, *duration, *warmup, *memObjs, *logRecs, *jsonOut, *check))
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// runChild runs one case and prints its result as JSON.
func runChild(name, dir string, d, warmup time.Duration, memObjs, logRecs int) int {
	var r result
	var err error
	switch name {
	case "probe":
		r, err = probe(dir, d)
	case "memory":
		r, err = memory(dir, memObjs)
	case "log-large":
		r, err = logLarge(dir, logRecs)
	case "redelivery":
		r, err = redeliveryDelay(dir, 200)
	default:
		found := false
		for _, c := range cases {
			if c.name == name {
				found = true
				if warmup > 0 {
					if _, err = c.run(filepath.Join(dir, "warmup"), warmup); err != nil {
						break
					}
				}
				r, err = c.run(filepath.Join(dir, "data"), d)
			}
		}
		if !found {
			err = fmt.Errorf("unknown case %q", name)
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
	rt, err := holdfast.Open(holdfast.Options{DataDir: dir, Logger: quietLogger()})
	if err != nil {
		return result{}, err
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	objs := make([]*holdfast.Object, objects)
	for i := range objs {
		objs[i] = rt.Object("app_bench", "bench", fmt.Sprintf("obj-%d", i))
		if _, err := objs[i].Set(ctx, "v", 0); err != nil { // activate before measuring
			return result{}, err
		}
	}
	before := rt.Node().Stats().Pipeline
	var ops atomic.Int64
	var failed atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	value := strings.Repeat("x", 200) // a 256-byte-ish record with the JSON and slot name
	start := time.Now()
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			o := objs[c%objects]
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := o.Set(ctx, "v", value); err != nil {
					failed.Store(err)
					return
				}
				ops.Add(1)
			}
		}(c)
	}
	time.Sleep(d) // the measured interval
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		return result{}, err
	}
	after := rt.Node().Stats().Pipeline
	writes := after.Writes - before.Writes
	return result{
		OpsPerSec:     float64(ops.Load()) / elapsed.Seconds(),
		SyncsPerWrite: float64(after.Commits-before.Commits) / float64(writes),
	}, nil
}

// memory activates n objects and measures the Go heap per active object once they
// are quiet; then it waits for them all to passivate and measures what is left. The
// runtime's routing tables keep the capacity of their peak size (Go maps never
// shrink), so the figure per idle object is the growth over a second round of n
// different objects: activated, passivated, measured against the first round.
func memory(dir string, n int) (result, error) {
	const idle = 2 * time.Second
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
	time.Sleep(idle / 2) // quiet, still active: applied writes' buffers are dropped
	active := rt.Node().Stats().ActiveObjects
	perActive := (heap() - base) / float64(active)
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

// drive runs the rounds, each case in a child process, and reports.
func drive(base string, rounds int, d, warmup time.Duration, memObjs, logRecs int, jsonOut string, check bool) int {
	self, err := os.Executable()
	if err != nil {
		fatal(err)
	}
	probes := make([][]float64, rounds)
	byCase := map[string][]result{}
	ratios := map[string][]float64{}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	run := func(round int, name string) result {
		dir := filepath.Join(base, fmt.Sprintf("r%d-%s", round, name))
		defer os.RemoveAll(dir)
		cmd := exec.Command(self, "-case", name, "-dir", dir, "-duration", d.String(), "-warmup", warmup.String(), fmt.Sprintf("-memory-objects=%d", memObjs), fmt.Sprintf("-log-records=%d", logRecs))
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			fatal(fmt.Errorf("case %s: %w", name, err))
		}
		var r result
		if err := json.Unmarshal(out, &r); err != nil {
			fatal(fmt.Errorf("case %s printed %q", name, out))
		}
		return r
	}
	for round := 0; round < rounds; round++ {
		order := rng.Perm(len(cases))
		p1 := run(round, "probe").OpsPerSec
		var got []result
		for _, i := range order {
			got = append(got, run(round, cases[i].name))
		}
		p2 := run(round, "probe").OpsPerSec
		probes[round] = []float64{p1, p2}
		mean := (p1 + p2) / 2
		for _, r := range got {
			byCase[r.Case] = append(byCase[r.Case], r)
			ratios[r.Case] = append(ratios[r.Case], r.OpsPerSec/mean)
		}
		fmt.Fprintf(os.Stderr, "round %d: probe %.0f/%.0f per s\n", round+1, p1, p2)
	}
	var mem *result
	if memObjs > 0 {
		r := run(0, "memory")
		mem = &r
	}
	var large *result
	if logRecs > 0 {
		r := run(0, "log-large")
		red := run(0, "redelivery")
		r.RedeliveryP50Ms, r.RedeliveryP99Ms = red.RedeliveryP50Ms, red.RedeliveryP99Ms
		large = &r
	}
	return report(probes, byCase, ratios, mem, memObjs, large, d, jsonOut, check)
}

type stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func summarize(xs []float64) stat {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{Median: m, Min: s[0], Max: s[len(s)-1]}
}

func report(probes [][]float64, byCase map[string][]result, ratios map[string][]float64, mem *result, memObjs int, large *result, d time.Duration, jsonOut string, check bool) int {
	var all []float64
	for _, p := range probes {
		all = append(all, p...)
	}
	ps := summarize(all)
	summary := map[string]any{"rounds": len(probes), "duration": d.String(), "probe": ps, "cases": map[string]any{}}
	fmt.Printf("| case | ops/s median (min-max) | ratio to probe median (min-max) | target | syncs per write |\n|---|---|---|---|---|\n")
	fmt.Printf("| fsync probe (4 KiB overwrite + fdatasync) | %.0f (%.0f-%.0f) | 1 | | 1 |\n", ps.Median, ps.Min, ps.Max)
	failed := 0
	for _, c := range cases {
		var ops, syncs []float64
		for _, r := range byCase[c.name] {
			ops = append(ops, r.OpsPerSec)
			syncs = append(syncs, r.SyncsPerWrite)
		}
		os, rs, ss := summarize(ops), summarize(ratios[c.name]), summarize(syncs)
		mark := ""
		if rs.Median < c.target {
			mark = " (below target)"
			if check && rs.Median < c.target/2 {
				failed++
			}
		}
		fmt.Printf("| %s | %.0f (%.0f-%.0f) | %.2fx (%.2f-%.2f)%s | %.1fx | %.4f |\n", c.name, os.Median, os.Min, os.Max, rs.Median, rs.Min, rs.Max, mark, c.target, ss.Median)
		summary["cases"].(map[string]any)[c.name] = map[string]any{"opsPerSec": os, "ratio": rs, "target": c.target, "syncsPerWrite": ss}
	}
	if mem != nil {
		fmt.Printf("\n| memory, %d objects | Go heap bytes |\n|---|---|\n| per active object (quiet) | %.0f |\n| per idle (passivated) object: growth over a second round of %d other objects | %.0f |\n| routing tables' high-water mark, per object of the peak | %.0f |\n", memObjs, mem.BytesPerActive, memObjs, mem.BytesPerIdle, mem.HighWaterPerPeak)
		summary["memory"] = mem
	}
	if large != nil {
		fmt.Printf("\n| one log of %d records (256-byte bodies) | value |\n|---|---|\n| filled at (batches of 1,000) | %.0f records/s |\n| sequential read, pages of 1,000 (median of 3) | %.0f records/s |\n| start to ready: open the data directory, first read of the log (median of 5) | %.3f s (target under 1 s) |\n",
			large.LogRecords, large.FillRecordsPerSec, large.ReadRecordsPerSec, large.StartSeconds)
		fmt.Printf("\n| lease redelivery after expiry (leases of 100 ms, a poller asking every 1 ms, 200 expiries) | p50 %.0f ms, p99 %.0f ms |\n|---|---|\n", large.RedeliveryP50Ms, large.RedeliveryP99Ms)
		summary["largeLog"] = large
	}
	if jsonOut != "" {
		b, _ := json.MarshalIndent(summary, "", "  ")
		if err := os.MkdirAll(filepath.Dir(jsonOut), 0o755); err == nil {
			_ = os.WriteFile(jsonOut, b, 0o644)
		}
	}
	if failed > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d cases below half their target\n", failed)
		return 1
	}
	return 0
}
