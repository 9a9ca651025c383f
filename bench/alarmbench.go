package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast"
)

// The alarms benchmark (issue 7): set N alarms across M objects, due at a fixed
// rate from T0 on; restart the node in a fresh process and measure how fast it
// is ready, the memory it holds with every alarm pending, and how late alarms
// fire while they fall due at that rate.

type alarmConfig struct {
	objects, count, rate int
	window, lead         time.Duration
}

type alarmResult struct {
	Phase string `json:"phase"`
	// Set phase.
	Set       int     `json:"set,omitempty"`
	SetPerSec float64 `json:"setPerSec,omitempty"`
	T0        int64   `json:"t0,omitempty"` // unix ms of the first alarm
	// Fire phase.
	OpenSeconds  float64 `json:"openSeconds,omitempty"`  // the node accepts requests
	ReadySeconds float64 `json:"readySeconds,omitempty"` // the scheduler loaded its index
	HeapBytes    uint64  `json:"heapBytes,omitempty"`    // Go heap in use after GC, everything pending
	// BaselineHeapBytes is the heap of a node on an empty data directory.
	BaselineHeapBytes uint64 `json:"baselineHeapBytes,omitempty"`
	RSSBytes          uint64 `json:"rssBytes,omitempty"`
	Resident          int64  `json:"resident,omitempty"` // index entries the scheduler holds
	// One second before the first alarm is due.
	HeapBeforeFirstBytes uint64  `json:"heapBeforeFirstBytes,omitempty"`
	ResidentBeforeFirst  int64   `json:"residentBeforeFirst,omitempty"`
	Fired                int64   `json:"fired,omitempty"`
	FirePerSec           float64 `json:"firePerSec,omitempty"`
	LateP50Ms            float64 `json:"lateP50Ms,omitempty"`
	LateP99Ms            float64 `json:"lateP99Ms,omitempty"`
	LateMaxMs            float64 `json:"lateMaxMs,omitempty"`
	Early                int64   `json:"early"` // alarms that ran before their time: must be 0
}

const alarmNames = 10

// lateness is a histogram of firing lateness in 100µs buckets up to 60s.
type lateness struct {
	buckets [600000]atomic.Int64
	n       atomic.Int64
	early   atomic.Int64
	max     atomic.Int64
}

func (l *lateness) add(d time.Duration) {
	if d < 0 {
		l.early.Add(1)
		return
	}
	l.n.Add(1)
	for {
		m := l.max.Load()
		if int64(d) <= m || l.max.CompareAndSwap(m, int64(d)) {
			break
		}
	}
	b := min(int(d/(100*time.Microsecond)), len(l.buckets)-1)
	l.buckets[b].Add(1)
}

func (l *lateness) quantile(q float64) float64 {
	want := int64(q * float64(l.n.Load()))
	var seen int64
	for i := range l.buckets {
		seen += l.buckets[i].Load()
		if seen > want {
			return float64(i) / 10
		}
	}
	return float64(len(l.buckets)) / 10
}

func alarmRuntime(dir string, late *lateness) (*holdfast.Runtime, error) {
	handlers := map[string]holdfast.AlarmHandler{}
	for i := range alarmNames {
		handlers[fmt.Sprintf("a%d", i)] = func(c *holdfast.Context, call holdfast.AlarmCall) error {
			if late != nil {
				late.add(time.Since(call.ScheduledTime))
			}
			return nil
		}
	}
	return holdfast.Open(holdfast.Options{DataDir: dir, Logger: quietLogger(), TuneGOMAXPROCS: true, Types: []holdfast.TypeSpec{{
		Name:   "timer",
		Handle: func(*holdfast.Context, any) (any, error) { return nil, nil },
		Alarms: handlers,
	}}})
}

// alarmSet schedules cfg.count alarms: alarm i belongs to object i mod objects
// and is due at t0 + i/rate.
func alarmSet(dir string, cfg alarmConfig) (alarmResult, error) {
	rt, err := alarmRuntime(dir, nil)
	if err != nil {
		return alarmResult{}, err
	}
	ctx := context.Background()
	t0 := time.Now().Add(cfg.lead)
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= cfg.count {
					return
				}
				at := t0.Add(time.Duration(i) * time.Second / time.Duration(cfg.rate))
				obj := i % cfg.objects
				name := fmt.Sprintf("a%d", (i/cfg.objects)%alarmNames)
				if _, err := rt.Alarms("app_bench", "timer", fmt.Sprintf("t%d", obj)).Set(ctx, name, at, nil); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		return alarmResult{}, err
	}
	if err := rt.Close(ctx); err != nil {
		return alarmResult{}, err
	}
	return alarmResult{Phase: "set", Set: cfg.count, SetPerSec: float64(cfg.count) / elapsed.Seconds(), T0: t0.UnixMilli()}, nil
}

func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func rss() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// alarmFire restarts the node on the set phase's data and measures it.
func alarmFire(dir string, cfg alarmConfig, t0 time.Time) (alarmResult, error) {
	// The heap of a node with nothing pending, for comparison: Badger's memtable
	// and caches are most of a node's heap.
	empty, err := alarmRuntime(filepath.Join(dir, "..", "alarms-empty"), nil)
	if err != nil {
		return alarmResult{}, err
	}
	<-empty.Node().AlarmsReady()
	baseline := heapAfterGC()
	if err := empty.Close(context.Background()); err != nil {
		return alarmResult{}, err
	}
	late := &lateness{}
	start := time.Now()
	rt, err := alarmRuntime(dir, late)
	if err != nil {
		return alarmResult{}, err
	}
	open := time.Since(start)
	<-rt.Node().AlarmsReady()
	ready := time.Since(start)
	r := alarmResult{Phase: "fire", OpenSeconds: open.Seconds(), ReadySeconds: ready.Seconds(), HeapBytes: heapAfterGC(), BaselineHeapBytes: baseline,
		RSSBytes: rss(), Resident: rt.Node().Stats().Alarms.Resident}
	if time.Now().After(t0) {
		fmt.Fprintf(os.Stderr, "bench: alarms: the node was ready %v after the first alarm's time; raise -alarm-lead\n", time.Since(t0))
	}
	// Just before the first alarm: the scheduler holds the near future.
	time.Sleep(time.Until(t0.Add(-time.Second)))
	r.HeapBeforeFirstBytes, r.ResidentBeforeFirst = heapAfterGC(), rt.Node().Stats().Alarms.Resident
	if path := os.Getenv("HOLDFAST_BENCH_CPUPROFILE"); path != "" {
		time.Sleep(time.Until(t0))
		f, err := os.Create(path)
		if err != nil {
			return alarmResult{}, err
		}
		_ = pprof.StartCPUProfile(f)
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	time.Sleep(time.Until(t0.Add(cfg.window)))
	fmt.Fprintf(os.Stderr, "bench: alarms: scheduler %+v\n", rt.Node().Stats().Alarms)
	r.Fired = late.n.Load() + late.early.Load()
	// Alarms due within the window, fired by its end.
	r.FirePerSec = float64(r.Fired) / cfg.window.Seconds()
	r.LateP50Ms, r.LateP99Ms = late.quantile(0.5), late.quantile(0.99)
	r.LateMaxMs = float64(late.max.Load()) / 1e6
	r.Early = late.early.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return r, rt.Close(ctx)
}

func alarmChild(phase, dir string, cfg alarmConfig, t0 int64) int {
	var r alarmResult
	var err error
	if phase == "alarms-set" {
		r, err = alarmSet(dir, cfg)
	} else {
		r, err = alarmFire(dir, cfg, time.UnixMilli(t0))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", phase+":", err)
		return 1
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

func alarmArgs(phase, dir string, cfg alarmConfig, t0 int64) []string {
	return []string{"-case", phase, "-dir", dir, "-alarm-objects", fmt.Sprint(cfg.objects), "-alarm-count", fmt.Sprint(cfg.count),
		"-alarm-rate", fmt.Sprint(cfg.rate), "-alarm-window", cfg.window.String(), "-alarm-lead", cfg.lead.String(), "-alarm-t0", fmt.Sprint(t0)}
}

func runAlarmPhase(phase, dir string, cfg alarmConfig, t0 int64) (alarmResult, error) {
	cmd := exec.Command(os.Args[0], alarmArgs(phase, dir, cfg, t0)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return alarmResult{}, fmt.Errorf("%s: %w", phase, err)
	}
	var r alarmResult
	return r, json.Unmarshal(out, &r)
}

// runAlarms runs the alarms benchmark, each phase in its own process.
func runAlarms(base string, cfg alarmConfig, jsonOut string) int {
	dir := filepath.Join(base, "alarms")
	set, err := runAlarmPhase("alarms-set", dir, cfg, 0)
	if err != nil {
		fatal(err)
	}
	fire, err := runAlarmPhase("alarms-fire", dir, cfg, set.T0)
	if err != nil {
		fatal(err)
	}
	fmt.Printf("## Alarms: %d alarms across %d objects, due at %d/s\n\n", cfg.count, cfg.objects, cfg.rate)
	fmt.Printf("| figure | value |\n|---|---|\n")
	fmt.Printf("| set rate (alarms/s, 256 callers, each set durable) | %.0f |\n", set.SetPerSec)
	fmt.Printf("| restart: node open (s) | %.3f |\n", fire.OpenSeconds)
	fmt.Printf("| restart: scheduler ready (s) | %.3f |\n", fire.ReadySeconds)
	fmt.Printf("| Go heap after restart, all pending (MiB) | %.1f (an empty node: %.1f; difference %.1f) |\n",
		float64(fire.HeapBytes)/(1<<20), float64(fire.BaselineHeapBytes)/(1<<20), (float64(fire.HeapBytes)-float64(fire.BaselineHeapBytes))/(1<<20))
	fmt.Printf("| process RSS after restart (MiB) | %.1f |\n", float64(fire.RSSBytes)/(1<<20))
	fmt.Printf("| index entries resident in the scheduler after restart | %d |\n", fire.Resident)
	fmt.Printf("| 1s before the first alarm: resident entries, Go heap (MiB) | %d, %.1f (%.1f over an empty node) |\n", fire.ResidentBeforeFirst,
		float64(fire.HeapBeforeFirstBytes)/(1<<20), (float64(fire.HeapBeforeFirstBytes)-float64(fire.BaselineHeapBytes))/(1<<20))
	fmt.Printf("| fired in the %v window (per s) | %d (%.0f) |\n", cfg.window, fire.Fired, fire.FirePerSec)
	fmt.Printf("| lateness p50 / p99 / max (ms) | %.1f / %.1f / %.1f |\n", fire.LateP50Ms, fire.LateP99Ms, fire.LateMaxMs)
	fmt.Printf("| fired early | %d |\n", fire.Early)
	if jsonOut != "" {
		b, _ := json.MarshalIndent(map[string]any{"config": map[string]any{"objects": cfg.objects, "count": cfg.count, "rate": cfg.rate, "window": cfg.window.String()}, "set": set, "fire": fire}, "", "  ")
		if err := os.WriteFile(jsonOut, b, 0o644); err != nil {
			fatal(err)
		}
	}
	if fire.Early > 0 {
		return 1
	}
	return 0
}
