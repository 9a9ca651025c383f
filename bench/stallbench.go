package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/bench/peers"
	"github.com/holdfast/holdfast/internal/storetune"
)

// The stall benchmark (issue 25, point 5): the latency of acknowledged writes
// with storage maintenance going on, against the same load without it.
//
// Every phase runs in its own process (-case stall-quiet, -case
// stall-maintenance) on a fresh data directory, with the same storage
// configuration (stallConfig.storage: small memtables, log segments and value-log
// files, the value-log GC every 100 ms) and the same primary load: callers
// goroutines, each with one KV set of 256 bytes in flight, over 1,000 objects
// (caller c owns the objects o with o mod callers == c and writes them in
// turn). Every acknowledged primary write's latency is recorded, and the
// longest time in which no caller's write was acknowledged (a node-wide stall
// would show there first).
//
//   - quiet: the primary load alone. Memtable flushes and segment releases
//     happen only as often as that load makes them; the value-log GC finds no
//     value-log file.
//   - maintenance: the primary load plus a background writer that overwrites
//     stallBigKeys keys of a user type with values of 1 MiB (which Badger keeps
//     in its value log) at -stall-big-rate values per second: log segments fill
//     and are released, the GC loop has Badger flush its memtables every two
//     value-log files, compactions find the overwritten values' garbage, and the
//     value-log GC rewrites and deletes files.
//
// The background writer's values go through the same group commit as the
// primary writes, so the maintenance phase measures the extra load's own cost
// too, not maintenance alone. A round runs both phases, in alternating order;
// the summary is the median over rounds of p99(maintenance) / p99(quiet), whose
// target is at most 2.
//
// What happened in each phase is counted from the data directory: tables
// written (NNNNNN.sst: flushes and compactions), log segments released
// (the oldest live NNN.wal moves up) and value-log files the GC reclaimed
// (PipelineStats.ValueLogReclaimed).

const (
	stallObjects = 1000
	stallBigKeys = 8
	stallBigSize = 1 << 20 // Badger's largest value threshold: this goes to its value log
)

type stallConfig struct {
	rounds    int
	d, warmup time.Duration
	callers   int
	bigRate   int // background values of 1 MiB per second (maintenance phase)
	// Storage sizes of both phases, in MiB (-stall-memtable-mib and so on). By
	// default 8 MiB each: the smallest power of two memtable whose Badger batch
	// (15%) holds a 1 MiB value, and log segments and value-log files as small.
	memTableMiB, segmentMiB, valueLogMiB int
	// gcEvery is the value-log GC's interval in both phases (-stall-gc-every,
	// default 100 ms); negative turns the GC loop off, and with it the memtable
	// flushes it asks for: the maintenance phase is then the background
	// writer's load alone, to tell its cost from the GC's.
	gcEvery time.Duration
}

// storage is the phases' storage configuration.
func (c stallConfig) storage() storetune.Config {
	return storetune.Config{MemTableSize: int64(c.memTableMiB) << 20, SegmentSize: int64(c.segmentMiB) << 20,
		ValueLogFileSize: int64(c.valueLogMiB) << 20, ValueLogGCEvery: c.gcEvery}
}

// stallPhase is what one phase's child prints.
type stallPhase struct {
	Phase  string  `json:"phase"`
	Writes int64   `json:"writes"` // primary writes acknowledged in the measured interval
	PerSec float64 `json:"perSec"`
	latencyFigures
	// LongestSilenceMs is the longest time in the measured interval in which
	// no primary write was acknowledged, by any caller: a node-wide stall.
	LongestSilenceMs  float64 `json:"longestSilenceMs"`
	CPUMicrosPerWrite float64 `json:"cpuMicrosPerWrite"` // the whole process's CPU (background writer and maintenance included) per primary write
	SyncsPerWrite     float64 `json:"syncsPerWrite"`     // commits per write, background writes included
	// Maintenance counted over the measured interval.
	TablesWritten     int64   `json:"tablesWritten"`
	SegmentsReleased  int64   `json:"segmentsReleased"`
	ValueLogReclaimed uint64  `json:"valueLogReclaimed"`
	ValueLogMiB       float64 `json:"valueLogMiB"` // value-log files on disk at the end
	BigWrites         int64   `json:"bigWrites"`   // background values of 1 MiB acknowledged
	BigPerSec         float64 `json:"bigPerSec"`
}

// latencyFigures summarizes a set of latencies, in milliseconds.
type latencyFigures struct {
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
	P999Ms float64 `json:"p999Ms"`
	MaxMs  float64 `json:"maxMs"`
}

// percentile is the q quantile (0 < q <= 1) of sorted by the nearest-rank
// method: the smallest value that at least q of the values do not exceed.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// The epsilon keeps q*n that is whole in decimal (0.99*1000) from rounding up.
	i := int(math.Ceil(q*float64(len(sorted))-1e-9)) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// summarizeLatencies sorts lat and returns its percentiles.
func summarizeLatencies(lat []time.Duration) latencyFigures {
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	return latencyFigures{P50Ms: ms(percentile(lat, 0.5)), P99Ms: ms(percentile(lat, 0.99)),
		P999Ms: ms(percentile(lat, 0.999)), MaxMs: ms(percentile(lat, 1))}
}

// longestSilence is the longest time within [from, to] without an
// acknowledgement, over every caller's acknowledgement times (each in order).
func longestSilence(acks [][]time.Time, from, to time.Time) time.Duration {
	all := slices.Concat(acks...)
	slices.SortFunc(all, func(a, b time.Time) int { return a.Compare(b) })
	return longestGap(all, from, to)
}

// stallRound is one round: the fsync probe before it, each phase's figures,
// and the order the phases ran in.
type stallRound struct {
	Probe       float64    `json:"probeSyncsPerSec"`
	First       string     `json:"first"`
	Quiet       stallPhase `json:"quiet"`
	Maintenance stallPhase `json:"maintenance"`
}

// ratio is maintenance's figure over quiet's in one round.
func (r stallRound) ratio(f func(stallPhase) float64) float64 {
	if q := f(r.Quiet); q > 0 {
		return f(r.Maintenance) / q
	}
	return math.Inf(1)
}

// p99Ratios summarizes p99(maintenance) / p99(quiet) over rounds.
func p99Ratios(rounds []stallRound) stat {
	var xs []float64
	for _, r := range rounds {
		xs = append(xs, r.ratio(func(p stallPhase) float64 { return p.P99Ms }))
	}
	return summarize(xs)
}

// numberedIDs returns the lowest and highest n of the files named n<ext> in
// dir (0, 0 when there is none).
func numberedIDs(dir, ext string) (lo, hi int64, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	lo = -1
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ext)
		if !ok {
			continue
		}
		id, perr := strconv.ParseInt(name, 10, 64)
		if perr != nil {
			continue
		}
		if lo < 0 || id < lo {
			lo = id
		}
		hi = max(hi, id)
	}
	return max(lo, 0), hi, nil
}

// storageCounts are the data directory's file numbers at one moment.
type storageCounts struct {
	newestTable, oldestSegment int64
	reclaimed                  uint64
}

func countStorage(rt *holdfast.Runtime, dir string) (storageCounts, error) {
	var c storageCounts
	var err error
	bdir := filepath.Join(dir, "badger")
	if _, c.newestTable, err = numberedIDs(bdir, ".sst"); err != nil {
		return c, err
	}
	if c.oldestSegment, _, err = numberedIDs(filepath.Join(dir, "wal"), ".wal"); err != nil {
		return c, err
	}
	c.reclaimed = rt.Node().Stats().Pipeline.ValueLogReclaimed
	return c, nil
}

// valueLogMiB is the size of Badger's value-log files under dir.
func valueLogMiB(dir string) float64 {
	paths, _ := filepath.Glob(filepath.Join(dir, "badger", "*.vlog"))
	var n int64
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil {
			n += st.Size()
		}
	}
	return float64(n) / (1 << 20)
}

type stallBigPut struct{}

// stallChild runs one phase in this process and prints its figures as JSON.
func stallChild(phase, dir string, cfg stallConfig) int {
	r, err := stallRun(phase, dir, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", phase+":", err)
		return 1
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

func stallRun(phase, dir string, cfg stallConfig) (stallPhase, error) {
	maintenance := phase == "stall-maintenance"
	if !maintenance && phase != "stall-quiet" {
		return stallPhase{}, fmt.Errorf("unknown case %q", phase)
	}
	big := make([]byte, stallBigSize)
	rand.Read(big) // incompressible, as a user's blob would be
	storage := cfg.storage()
	rt, err := holdfast.Open(holdfast.Options{DataDir: dir, Logger: quietLogger(), Storage: &storage,
		Types: []holdfast.TypeSpec{{Name: "stallbig", Handle: func(c *holdfast.Context, msg any) (any, error) {
			return nil, c.Put("v", big)
		}}}})
	if err != nil {
		return stallPhase{}, err
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	objs := make([]*holdfast.Object, stallObjects)
	for i := range objs {
		objs[i] = rt.Object("app_bench", "bench", fmt.Sprintf("obj-%d", i))
	}
	if err := activate(objs); err != nil {
		return stallPhase{}, err
	}
	// Caller c writes its own objects in turn: every object is written, and
	// no two callers wait on one object.
	mine := make([][]*holdfast.Object, cfg.callers)
	for i, o := range objs {
		mine[i%cfg.callers] = append(mine[i%cfg.callers], o)
	}
	var value any = string(peers.Payload())

	var bigWrites atomic.Int64
	stopBig := func() error { return nil }
	if maintenance {
		stopBig = startBigWriter(ctx, rt, cfg.bigRate, &bigWrites)
	}
	lat := make([][]time.Duration, cfg.callers)
	acks := make([][]time.Time, cfg.callers)
	next := make([]int, cfg.callers)
	recording := false
	write := func(c int) (int64, error) {
		o := mine[c][next[c]%len(mine[c])]
		next[c]++
		t := time.Now()
		_, err := o.Set(ctx, "v", value)
		if recording && err == nil {
			now := time.Now()
			lat[c] = append(lat[c], now.Sub(t))
			acks[c] = append(acks[c], now)
		}
		return 1, err
	}
	if _, err := runWorkers(cfg.callers, cfg.warmup, write); err != nil {
		_ = stopBig()
		return stallPhase{}, fmt.Errorf("warm-up: %w", err)
	}
	for c := range lat {
		lat[c] = make([]time.Duration, 0, 1<<14)
		acks[c] = make([]time.Time, 0, 1<<14)
	}
	recording = true // runWorkers' goroutines start after this and end before it returns
	before, err := countStorage(rt, dir)
	if err != nil {
		_ = stopBig()
		return stallPhase{}, err
	}
	pipe0, big0 := rt.Node().Stats().Pipeline, bigWrites.Load()
	stopProfile, stopTrace := profileCPU(), traceRun() // HOLDFAST_BENCH_CPUPROFILE, HOLDFAST_BENCH_TRACE
	m := startMeter()
	start := time.Now()
	iv, err := runWorkers(cfg.callers, cfg.d, write)
	var cost result
	m.stop(&cost, iv.ops)
	stopTrace()
	stopProfile()
	pipe1, big1 := rt.Node().Stats().Pipeline, bigWrites.Load()
	after, cerr := countStorage(rt, dir)
	if serr := stopBig(); err == nil {
		err = serr
	}
	if err == nil {
		err = cerr
	}
	if err != nil {
		return stallPhase{}, err
	}
	r := stallPhase{
		Phase:             phase,
		Writes:            iv.ops,
		PerSec:            iv.perSec(),
		latencyFigures:    summarizeLatencies(slices.Concat(lat...)),
		LongestSilenceMs:  float64(longestSilence(acks, start, start.Add(iv.elapsed))) / 1e6,
		CPUMicrosPerWrite: cost.CPUSeconds * 1e6 / float64(iv.ops),
		SyncsPerWrite:     float64(pipe1.Commits-pipe0.Commits) / float64(pipe1.Writes-pipe0.Writes),
		TablesWritten:     after.newestTable - before.newestTable,
		SegmentsReleased:  after.oldestSegment - before.oldestSegment,
		ValueLogReclaimed: after.reclaimed - before.reclaimed,
		ValueLogMiB:       valueLogMiB(dir),
		BigWrites:         big1 - big0,
		BigPerSec:         float64(big1-big0) / iv.elapsed.Seconds(),
	}
	return r, nil
}

// startBigWriter overwrites stallBigKeys objects of type stallbig with 1 MiB
// values, rate per second at most (two writers, one value in flight each; a
// tick missed while both are busy is dropped, not made up), counting the
// acknowledged ones in n. The returned function stops it, waits for it, and
// returns its first error.
func startBigWriter(ctx context.Context, rt *holdfast.Runtime, rate int, n *atomic.Int64) (stop func() error) {
	const writers = 2
	ticks := make(chan struct{})
	done := make(chan struct{})
	var failed atomic.Value
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the pacer
		defer wg.Done()
		t := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				select {
				case ticks <- struct{}{}:
				default:
				}
			}
		}
	}()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i += writers {
				select {
				case <-done:
					return
				case <-ticks:
				}
				if _, err := rt.Request(ctx, "app_bench", "stallbig", fmt.Sprintf("big-%d", i%stallBigKeys), stallBigPut{}); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				n.Add(1)
			}
		}()
	}
	return func() error {
		close(done)
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			return fmt.Errorf("background writer: %w", err)
		}
		return nil
	}
}

// stallArgs are a phase child's arguments.
func stallArgs(phase, dir string, cfg stallConfig) []string {
	return []string{"-case", phase, "-dir", dir, "-duration", cfg.d.String(), "-warmup", cfg.warmup.String(),
		"-stall-callers", fmt.Sprint(cfg.callers), "-stall-big-rate", fmt.Sprint(cfg.bigRate),
		"-stall-memtable-mib", fmt.Sprint(cfg.memTableMiB), "-stall-segment-mib", fmt.Sprint(cfg.segmentMiB), "-stall-vlog-mib", fmt.Sprint(cfg.valueLogMiB),
		"-stall-gc-every", cfg.gcEvery.String()}
}

// runStall runs the rounds, each phase in its own process, each round after
// an fsync probe, and prints the report.
func runStall(base string, cfg stallConfig, mdOut, jsonOut string) int {
	var rounds []stallRound
	for r := range cfg.rounds {
		var round stallRound
		dir := func(name string) string { return filepath.Join(base, fmt.Sprintf("%s-%d", name, r)) }
		var probe result
		if err := childJSON(&probe, "-case", "probe", "-dir", dir("probe"), "-duration", "1s"); err != nil {
			fatal(err)
		}
		os.RemoveAll(dir("probe"))
		round.Probe = probe.OpsPerSec
		phases := []struct {
			name string
			out  *stallPhase
		}{{"stall-quiet", &round.Quiet}, {"stall-maintenance", &round.Maintenance}}
		if r%2 == 1 {
			phases[0], phases[1] = phases[1], phases[0]
		}
		round.First = strings.TrimPrefix(phases[0].name, "stall-")
		for _, p := range phases {
			err := childJSON(p.out, stallArgs(p.name, dir(p.name), cfg)...)
			os.RemoveAll(dir(p.name))
			if err != nil {
				fatal(err)
			}
			fmt.Fprintf(os.Stderr, "round %d %s: %.0f writes/s, p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.1f ms, longest silence %.1f ms; tables %d, segments released %d, value-log files reclaimed %d, 1 MiB values %.1f/s\n",
				r+1, p.out.Phase, p.out.PerSec, p.out.P50Ms, p.out.P99Ms, p.out.P999Ms, p.out.MaxMs, p.out.LongestSilenceMs,
				p.out.TablesWritten, p.out.SegmentsReleased, p.out.ValueLogReclaimed, p.out.BigPerSec)
		}
		rounds = append(rounds, round)
	}
	var out bytes.Buffer
	w := io.MultiWriter(os.Stdout, &out)
	writeStallReport(w, cfg, rounds)
	if mdOut != "" {
		writeFile(mdOut, out.Bytes())
	}
	if jsonOut != "" {
		b, _ := json.MarshalIndent(map[string]any{"config": map[string]any{
			"rounds": cfg.rounds, "duration": cfg.d.String(), "warmup": cfg.warmup.String(), "callers": cfg.callers,
			"objects": stallObjects, "bigRate": cfg.bigRate, "bigKeys": stallBigKeys, "storage": cfg.storage(),
		}, "rounds": rounds, "p99Ratio": p99Ratios(rounds)}, "", "  ")
		writeFile(jsonOut, b)
	}
	return 0
}

// gcEvery describes the value-log GC's interval for the report.
func gcEvery(d time.Duration) string {
	if d < 0 {
		return "off"
	}
	return "every " + d.String()
}

func writeStallReport(w io.Writer, cfg stallConfig, rounds []stallRound) {
	fmt.Fprintf(w, "Holdfast embedded, %d objects, %d callers each with one KV set of 256 bytes in flight; %v measured per phase after a %v warm-up, every phase in a fresh process and data directory. "+
		"Storage in both phases: memtables %d MiB, log segments %d MiB, value-log files %d MiB, value-log GC %s. "+
		"Maintenance adds a writer of 1 MiB values over %d keys at %d values/s. %d cores; latencies in ms; the longest silence is the longest time no write was acknowledged by any caller; counts over the measured interval.\n\n",
		stallObjects, cfg.callers, cfg.d, cfg.warmup, cfg.memTableMiB, cfg.segmentMiB, cfg.valueLogMiB, gcEvery(cfg.gcEvery), stallBigKeys, cfg.bigRate, runtime.NumCPU())
	fmt.Fprintf(w, "| round | phase | writes/s | p50 | p99 | p99.9 | max | longest silence | CPU µs/write | tables written | log segments released | value-log files reclaimed | value log at end (MiB) | 1 MiB values/s |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, r := range rounds {
		ps := []stallPhase{r.Quiet, r.Maintenance}
		if r.First != "quiet" {
			ps[0], ps[1] = ps[1], ps[0]
		}
		for _, p := range ps {
			fmt.Fprintf(w, "| %d | %s | %.0f | %.2f | %.2f | %.2f | %.1f | %.1f | %.1f | %d | %d | %d | %.0f | %.1f |\n", i+1, strings.TrimPrefix(p.Phase, "stall-"),
				p.PerSec, p.P50Ms, p.P99Ms, p.P999Ms, p.MaxMs, p.LongestSilenceMs, p.CPUMicrosPerWrite, p.TablesWritten, p.SegmentsReleased,
				p.ValueLogReclaimed, p.ValueLogMiB, p.BigPerSec)
		}
	}
	over := func(format string, f func(stallRound) float64) string {
		var xs []float64
		for _, r := range rounds {
			xs = append(xs, f(r))
		}
		return fmtStat(summarize(xs), format)
	}
	fmt.Fprintf(w, "\n| median of %d rounds (min–max) | quiet | maintenance | maintenance ÷ quiet |\n|---|---|---|---|\n", len(rounds))
	for _, row := range []struct {
		label, format string
		f             func(stallPhase) float64
	}{
		{"writes/s", "%.0f", func(p stallPhase) float64 { return p.PerSec }},
		{"p50 (ms)", "%.2f", func(p stallPhase) float64 { return p.P50Ms }},
		{"p99 (ms)", "%.2f", func(p stallPhase) float64 { return p.P99Ms }},
		{"p99.9 (ms)", "%.2f", func(p stallPhase) float64 { return p.P999Ms }},
		{"max (ms)", "%.1f", func(p stallPhase) float64 { return p.MaxMs }},
		{"longest time without any write acknowledged (ms)", "%.1f", func(p stallPhase) float64 { return p.LongestSilenceMs }},
		{"CPU µs per primary write (the whole process)", "%.1f", func(p stallPhase) float64 { return p.CPUMicrosPerWrite }},
		{"syncs per write (background writes included)", "%.3f", func(p stallPhase) float64 { return p.SyncsPerWrite }},
	} {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", row.label, over(row.format, func(r stallRound) float64 { return row.f(r.Quiet) }),
			over(row.format, func(r stallRound) float64 { return row.f(r.Maintenance) }), over("%.2fx", func(r stallRound) float64 { return r.ratio(row.f) }))
	}
	for _, row := range []struct {
		label string
		f     func(stallPhase) float64
	}{
		{"tables written per s (flushes and compactions)", func(p stallPhase) float64 { return float64(p.TablesWritten) / cfg.d.Seconds() }},
		{"log segments released per s", func(p stallPhase) float64 { return float64(p.SegmentsReleased) / cfg.d.Seconds() }},
		{"value-log files reclaimed per s", func(p stallPhase) float64 { return float64(p.ValueLogReclaimed) / cfg.d.Seconds() }},
	} {
		fmt.Fprintf(w, "| %s | %s | %s | |\n", row.label, over("%.1f", func(r stallRound) float64 { return row.f(r.Quiet) }),
			over("%.1f", func(r stallRound) float64 { return row.f(r.Maintenance) }))
	}
	fmt.Fprintf(w, "| fsync probe (syncs/s, before each round) | %s | | |\n", over("%.0f", func(r stallRound) float64 { return r.Probe }))
	ratio := p99Ratios(rounds)
	verdict := "within"
	if ratio.Median > 2 {
		verdict = "over"
	}
	fmt.Fprintf(w, "\np99(maintenance) ÷ p99(quiet), median of %d rounds: %s (target at most 2.00x: %s)\n", len(rounds), fmtStat(ratio, "%.2fx"), verdict)
}
