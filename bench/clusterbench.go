package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/bench/peers"
	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/internal/devetcd"
	"github.com/holdfast/holdfast/persistence"
)

// The cluster benchmark: nodes of one cluster (64 partitions, an embedded etcd)
// in one process, which is a child of the driver, one per phase and round:
//
//   - cluster-latency: 3 nodes; KV sets of 256 bytes to objects owned by node a,
//     through a and through b (forwarded), by 1 writer and by 64 writers on 64
//     objects: writes per second, latency p50 and p99.
//   - cluster-handoff: 2 nodes; -cluster-mib MiB of log records (batches of 16
//     records of 64 KiB) written to a's partitions, then a leaves gracefully:
//     the time from the start of a.Close until the table shows every partition
//     at b and available, per GiB of payload.
//   - cluster-gap: 3 nodes; one writer per partition (one object each), one
//     write at a time through b, while a leaves gracefully: per partition, the
//     longest time between two successful writes from 1 s before the leave to
//     1 s after a.Close returned, and the failed writes.
//
// Every node shares the process and its CPU cores. HOLDFAST_BENCH_LOG=1 sends
// the nodes' logs (debug level) to stderr.

const clusterPartitions = 64

type clusterConfig struct {
	rounds    int
	d, warmup time.Duration
	mib       int
}

// writeFigures are one case of the latency phase.
type writeFigures struct {
	PerSec float64 `json:"perSec"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
}

// clusterResult is what one phase's child prints.
type clusterResult struct {
	// Latency phase, by case: owner-1, other-1, owner-64, other-64.
	Writes map[string]writeFigures `json:"writes,omitempty"`
	// Handoff phase.
	PayloadBytes   int64   `json:"payloadBytes,omitempty"`
	OnDiskBytes    int64   `json:"onDiskBytes,omitempty"`    // the leaving node's data directory (blocks allocated)
	HandoffSeconds float64 `json:"handoffSeconds,omitempty"` // Close start until every partition is at b and available
	CloseSeconds   float64 `json:"closeSeconds,omitempty"`   // Close start until it returned
	DiskBytes      uint64  `json:"diskBytes,omitempty"`      // written by the process (every node) meanwhile
	// Gap phase, in ms: the longest gap of each partition, max and p99 over the
	// partitions, and the median over those that moved.
	MaxGapMs   float64 `json:"maxGapMs,omitempty"`
	P99GapMs   float64 `json:"p99GapMs,omitempty"`
	MovedGapMs float64 `json:"movedGapMs,omitempty"`
	QuietGapMs float64 `json:"quietGapMs,omitempty"` // the max over partitions in 3 s without a leave

	LeaveSeconds float64 `json:"leaveSeconds,omitempty"`
	Failed       int64   `json:"failed,omitempty"`
	FirstError   string  `json:"firstError,omitempty"`
}

// benchCluster is the nodes of one cluster in this process.
type benchCluster struct {
	etcd  *devetcd.Server
	nodes map[string]*cluster.Node
	st    *cluster.Status // once started: every partition settled
}

func startCluster(dir string, ids ...string) (*benchCluster, error) {
	e, err := devetcd.Start(devetcd.Config{Dir: filepath.Join(dir, "etcd")})
	if err != nil {
		return nil, err
	}
	c := &benchCluster{etcd: e, nodes: map[string]*cluster.Node{}}
	log := quietLogger()
	if os.Getenv("HOLDFAST_BENCH_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	for _, id := range ids {
		n, err := cluster.Start(cluster.Config{
			DataDir: filepath.Join(dir, id), Partitions: clusterPartitions, IdleTimeout: time.Minute, Logger: log.With("node", id),
			Cluster: &cluster.ClusterConfig{Name: "bench", NodeID: id, Advertise: "127.0.0.1:0", Endpoints: []string{e.Endpoint()}, LeaseTTL: 2 * time.Second, ReplicationFactor: 1},
		})
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", id, err)
		}
		c.nodes[id] = n
	}
	c.st, err = c.waitFor(time.Minute, func(st *cluster.Status) bool {
		count := map[string]int{}
		for _, p := range st.Parts {
			count[p.Owner]++
		}
		for _, id := range ids {
			if n := count[id]; n < clusterPartitions/len(ids) || n > clusterPartitions/len(ids)+1 {
				return false
			}
		}
		return settled(st, "")
	})
	return c, err
}

// settled says that every partition is available, not moving, and not owned
// by node gone.
func settled(st *cluster.Status, gone string) bool {
	for _, p := range st.Parts {
		if !p.Available || p.Target != "" || p.Owner == gone {
			return false
		}
	}
	return true
}

// waitFor polls the cluster's status every 20 ms until ok holds.
func (c *benchCluster) waitFor(timeout time.Duration, ok func(*cluster.Status) bool) (*cluster.Status, error) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		st, err := cluster.ReadStatus(context.Background(), []string{c.etcd.Endpoint()}, "bench")
		if err == nil && ok(st) {
			return st, nil
		}
	}
	return nil, fmt.Errorf("the cluster's partitions did not settle within %v", timeout)
}

// distinct is keep, true once per partition.
func distinct(keep func(p uint32) bool) func(p uint32) bool {
	seen := map[uint32]bool{}
	return func(p uint32) bool {
		fresh := keep(p) && !seen[p]
		seen[p] = seen[p] || fresh
		return fresh
	}
}

// objectsOf returns n objects of type typ whose partitions satisfy keep.
func objectsOf(typ string, n int, keep func(p uint32) bool) []actors.ObjectID {
	var out []actors.ObjectID
	for i := 0; len(out) < n; i++ {
		id := actors.ObjectID{App: "app_bench", Type: typ, Key: fmt.Sprintf("k%d", i)}
		if keep(persistence.Partition(id, clusterPartitions)) {
			out = append(out, id)
		}
	}
	return out
}

// owned is the partitions node owned once the cluster started.
func (c *benchCluster) owned(node string) map[uint32]bool {
	out := map[uint32]bool{}
	for _, p := range c.st.Parts {
		if p.Owner == node {
			out[p.Partition] = true
		}
	}
	return out
}

func clusterChild(phase, dir string, cfg clusterConfig) int {
	var r clusterResult
	var err error
	switch phase {
	case "cluster-latency":
		r, err = clusterLatency(dir, cfg)
	case "cluster-handoff":
		r, err = clusterHandoff(dir, cfg)
	case "cluster-gap":
		r, err = clusterGap(dir)
	default:
		err = fmt.Errorf("unknown case %q", phase)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", phase+":", err)
		return 1
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0 // the nodes go with the process; the driver removes dir
}

func clusterLatency(dir string, cfg clusterConfig) (clusterResult, error) {
	c, err := startCluster(dir, "a", "b", "c")
	if err != nil {
		return clusterResult{}, err
	}
	mine := c.owned("a")
	objs := objectsOf("kv", 64, func(p uint32) bool { return mine[p] })
	ctx := context.Background()
	for _, id := range objs { // activate, and check that a serves them
		_, s, err := c.nodes["b"].RequestServed(ctx, id, &actors.KVWrite{Route: actors.RoutePut, Ops: []actors.Op{{Op: "set", Key: "v", Value: []byte(`0`)}}})
		if err != nil || s.Node != "a" {
			return clusterResult{}, fmt.Errorf("activate %s: served by %q: %v", id, s.Node, err)
		}
	}
	value := string(peers.Payload())
	run := func(node *cluster.Node, writers int, d time.Duration) (writeFigures, error) {
		lat := make([][]time.Duration, writers)
		iv, err := runWorkers(writers, d, func(w int) (int64, error) {
			t := time.Now()
			_, err := actors.NewKV(node, objs[w]).Set(ctx, "v", value)
			lat[w] = append(lat[w], time.Since(t))
			return 1, err
		})
		all := slices.Concat(lat...)
		slices.Sort(all)
		return writeFigures{PerSec: iv.perSec(), P50Ms: quantileMs(all, 0.5), P99Ms: quantileMs(all, 0.99)}, err
	}
	r := clusterResult{Writes: map[string]writeFigures{}}
	for _, writers := range []int{1, 64} {
		for _, via := range []struct{ node, name string }{{"a", "owner"}, {"b", "other"}} {
			if _, err := run(c.nodes[via.node], writers, cfg.warmup); err != nil {
				return r, err
			}
			stopProfile := func() {}
			if via.name == "other" && writers == 64 {
				// HOLDFAST_BENCH_CPUPROFILE profiles the forward under load,
				// HOLDFAST_BENCH_TRACE traces it.
				stopCPU, stopTrace := profileCPU(), traceRun()
				stopProfile = func() { stopCPU(); stopTrace() }
			}
			f, err := run(c.nodes[via.node], writers, cfg.d)
			stopProfile()
			if err != nil {
				return r, err
			}
			r.Writes[fmt.Sprint(via.name, "-", writers)] = f
		}
	}
	return r, nil
}

// quantileMs is the q quantile of sorted, in milliseconds.
func quantileMs(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(float64(len(sorted)-1)*q)]) / 1e6
}

func clusterHandoff(dir string, cfg clusterConfig) (clusterResult, error) {
	c, err := startCluster(dir, "a", "b")
	if err != nil {
		return clusterResult{}, err
	}
	mine := c.owned("a")
	// One log per partition of a; appends of 16 records of 64 KiB (1 MiB).
	logs := objectsOf("log", len(mine), distinct(func(p uint32) bool { return mine[p] }))
	const perAppend, recordBytes = 16, 64 << 10
	body := make([]byte, recordBytes)
	for i := range body {
		body[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[rand.Intn(36)]
	}
	body[0], body[len(body)-1] = '"', '"'
	batch := make([]actors.LogInput, perAppend)
	for i := range batch {
		batch[i].Body = body
	}
	appends := int64(cfg.mib) * (1 << 20) / (perAppend * recordBytes)
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for _, id := range logs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= appends {
				if _, err := actors.NewLog(c.nodes["a"], id).Append(context.Background(), batch...); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return clusterResult{}, fmt.Errorf("fill: %w", err)
	}
	r := clusterResult{PayloadBytes: appends * perAppend * recordBytes, OnDiskBytes: diskUsage(filepath.Join(dir, "a"))}
	disk0, _ := peers.DiskWriteBytes(os.Getpid())
	moved, closed, err := c.leave("a", func() {
		disk, _ := peers.DiskWriteBytes(os.Getpid())
		r.DiskBytes = disk - disk0
	})
	r.HandoffSeconds, r.CloseSeconds = moved.Seconds(), closed.Seconds()
	return r, err
}

// leave closes node id (a graceful leave) and returns the time from the start
// of Close until the table shows every partition settled elsewhere (then it
// calls atMoved), and until Close returned.
func (c *benchCluster) leave(id string, atMoved func()) (moved, closed time.Duration, err error) {
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- c.nodes[id].Close(context.Background()) }()
	if _, err := c.waitFor(5*time.Minute, func(st *cluster.Status) bool { return settled(st, id) }); err != nil {
		return 0, 0, err
	}
	moved = time.Since(start)
	atMoved()
	err = <-done
	return moved, time.Since(start), err
}

// diskUsage is the bytes allocated to the files under dir.
func diskUsage(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if info, ierr := d.Info(); err == nil && ierr == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

func clusterGap(dir string) (clusterResult, error) {
	c, err := startCluster(dir, "a", "b", "c")
	if err != nil {
		return clusterResult{}, err
	}
	mine := c.owned("a")
	objs := objectsOf("gap", clusterPartitions, distinct(func(uint32) bool { return true })) // one per partition
	var (
		stop     atomic.Bool
		counting atomic.Bool // the leave started
		failed   atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
	)
	times := make([][]time.Time, clusterPartitions)
	for i, id := range objs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kv := actors.NewKV(c.nodes["b"], id)
			for !stop.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := kv.Increment(ctx, "n", 1)
				cancel()
				if err != nil {
					if counting.Load() && failed.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
					time.Sleep(10 * time.Millisecond)
					continue
				}
				times[i] = append(times[i], time.Now())
			}
		}()
	}
	start := time.Now()
	time.Sleep(5 * time.Second) // 1 s warm-up, 3 s without a leave (for comparison), then the window opens 1 s before the leave
	counting.Store(true)
	leaveStart := time.Now()
	moved, closed, err := c.leave("a", func() {})
	time.Sleep(time.Second)
	stop.Store(true)
	wg.Wait()
	if err != nil {
		return clusterResult{}, err
	}
	r := clusterResult{LeaveSeconds: moved.Seconds(), Failed: failed.Load()}
	r.FirstError, _ = firstErr.Load().(string)
	var gaps, movedGaps []float64
	for i, id := range objs {
		r.QuietGapMs = max(r.QuietGapMs, float64(longestGap(times[i], start.Add(time.Second), start.Add(4*time.Second)))/1e6)
		g := float64(longestGap(times[i], leaveStart.Add(-time.Second), leaveStart.Add(closed+time.Second))) / 1e6
		gaps = append(gaps, g)
		if mine[persistence.Partition(id, clusterPartitions)] {
			movedGaps = append(movedGaps, g)
		}
	}
	slices.Sort(gaps)
	r.MaxGapMs, r.P99GapMs = gaps[len(gaps)-1], gaps[int(float64(len(gaps)-1)*0.99)]
	r.MovedGapMs = summarize(movedGaps).Median
	return r, nil
}

// longestGap returns the longest time between two consecutive successes (times,
// in order) that overlaps [from, to]; the window's ends count as successes
// when nothing succeeded beyond them.
func longestGap(times []time.Time, from, to time.Time) time.Duration {
	var longest time.Duration
	prev := from
	for _, t := range times {
		if !t.After(from) {
			prev = t
			continue
		}
		longest = max(longest, t.Sub(prev))
		prev = t
		if !t.Before(to) {
			return longest
		}
	}
	return max(longest, to.Sub(prev))
}

// childJSON runs this program with args and decodes the JSON it prints into v.
func childJSON(v any, args ...string) error {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%v: %w", args[:2], err)
	}
	return json.Unmarshal(out, v)
}

// clusterRound is one round: the mean of the probes before and after, and
// each phase's result.
type clusterRound struct {
	Probe                 float64
	Latency, Handoff, Gap clusterResult
}

// runCluster runs the rounds, each phase in its own process, each round
// bracketed by the fsync probe, and prints the report.
func runCluster(base string, cfg clusterConfig, mdOut, jsonOut string) int {
	var rounds []clusterRound
	for r := range cfg.rounds {
		var round clusterRound
		var before, after result
		dir := func(name string) string { return filepath.Join(base, fmt.Sprintf("%s-%d", name, r)) }
		phase := func(name string, out *clusterResult) error {
			defer os.RemoveAll(dir(name))
			return childJSON(out, "-case", name, "-dir", dir(name), "-duration", cfg.d.String(), "-warmup", cfg.warmup.String(), "-cluster-mib", fmt.Sprint(cfg.mib))
		}
		for _, err := range []error{childJSON(&before, "-case", "probe", "-dir", dir("probe"), "-duration", "1s"),
			phase("cluster-latency", &round.Latency), phase("cluster-handoff", &round.Handoff), phase("cluster-gap", &round.Gap),
			childJSON(&after, "-case", "probe", "-dir", dir("probe"), "-duration", "1s")} {
			if err != nil {
				fatal(err)
			}
		}
		os.RemoveAll(dir("probe"))
		round.Probe = (before.OpsPerSec + after.OpsPerSec) / 2
		rounds = append(rounds, round)
		b, _ := json.Marshal(round)
		fmt.Fprintf(os.Stderr, "round %d: %s\n", r+1, b)
	}
	over := func(format string, f func(clusterRound) float64) string {
		var xs []float64
		for _, r := range rounds {
			xs = append(xs, f(r))
		}
		return fmtStat(summarize(xs), format)
	}
	var out bytes.Buffer
	w := io.MultiWriter(os.Stdout, &out)
	fmt.Fprintf(w, "One cluster of 64 partitions per phase, all its nodes and an embedded etcd in one process: their CPU shares the machine's %d cores. Medians of %d rounds (min–max).\n\n", runtime.NumCPU(), cfg.rounds)
	fmt.Fprintf(w, "| KV sets of 256 bytes to objects owned by node a, 3 nodes, %v per case | through the owner (a) | through another node (b) | b ÷ a |\n|---|---|---|---|\n", cfg.d)
	for _, row := range []struct {
		label, n, format string
		f                func(writeFigures) float64
	}{
		{"1 writer: writes/s", "1", "%.0f", func(f writeFigures) float64 { return f.PerSec }},
		{"1 writer: latency p50 (ms)", "1", "%.2f", func(f writeFigures) float64 { return f.P50Ms }},
		{"1 writer: latency p99 (ms)", "1", "%.2f", func(f writeFigures) float64 { return f.P99Ms }},
		{"64 writers on 64 objects: writes/s", "64", "%.0f", func(f writeFigures) float64 { return f.PerSec }},
		{"64 writers: latency p50 (ms)", "64", "%.2f", func(f writeFigures) float64 { return f.P50Ms }},
		{"64 writers: latency p99 (ms)", "64", "%.2f", func(f writeFigures) float64 { return f.P99Ms }},
	} {
		a := func(r clusterRound) float64 { return row.f(r.Latency.Writes["owner-"+row.n]) }
		b := func(r clusterRound) float64 { return row.f(r.Latency.Writes["other-"+row.n]) }
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", row.label, over(row.format, a), over(row.format, b), over("%.2fx", func(r clusterRound) float64 { return b(r) / a(r) }))
	}
	fmt.Fprintf(w, "| fsync probe: syncs/s; 1 writer's writes/s ÷ probe | %s | %s | %s |\n\n", over("%.0f", func(r clusterRound) float64 { return r.Probe }),
		over("%.2fx", func(r clusterRound) float64 { return r.Latency.Writes["owner-1"].PerSec / r.Probe }),
		over("%.2fx", func(r clusterRound) float64 { return r.Latency.Writes["other-1"].PerSec / r.Probe }))
	const mib = 1 << 20
	fmt.Fprintf(w, "| graceful leave of node a (a.Close) | value |\n|---|---|\n")
	for _, row := range []struct {
		label, format string
		f             func(r clusterRound) float64
	}{
		{fmt.Sprintf("handoff, 2 nodes: a holds %d MiB of log records (64 KiB each) in its 32 partitions; MiB on disk at a", cfg.mib), "%.0f", func(r clusterRound) float64 { return float64(r.Handoff.OnDiskBytes) / mib }},
		{"handoff: seconds from a.Close to every partition available at b", "%.2f", func(r clusterRound) float64 { return r.Handoff.HandoffSeconds }},
		{"handoff: seconds per GiB of payload", "%.1f", func(r clusterRound) float64 {
			return r.Handoff.HandoffSeconds / (float64(r.Handoff.PayloadBytes) / (1 << 30))
		}},
		{"handoff: seconds until a.Close returned", "%.2f", func(r clusterRound) float64 { return r.Handoff.CloseSeconds }},
		{"handoff: bytes written to disk (both nodes) until every partition was at b, per payload byte", "%.2f", func(r clusterRound) float64 { return float64(r.Handoff.DiskBytes) / float64(r.Handoff.PayloadBytes) }},
		{"gap, 3 nodes, a writer per partition through b: seconds until a's partitions were available elsewhere", "%.2f", func(r clusterRound) float64 { return r.Gap.LeaveSeconds }},
		{"gap: the longest between two successful writes of one partition, max over the 64 (target < 1 s), ms", "%.0f", func(r clusterRound) float64 { return r.Gap.MaxGapMs }},
		{"gap: p99 over the 64 partitions, ms", "%.0f", func(r clusterRound) float64 { return r.Gap.P99GapMs }},
		{"gap: median over a's partitions (those that moved), ms", "%.0f", func(r clusterRound) float64 { return r.Gap.MovedGapMs }},
		{"gap: for comparison, the longest in 3 s before the leave, max over the 64, ms", "%.0f", func(r clusterRound) float64 { return r.Gap.QuietGapMs }},
		{"gap: writes that failed during the leave (503), per round", "%.0f", func(r clusterRound) float64 { return float64(r.Gap.Failed) }},
	} {
		fmt.Fprintf(w, "| %s | %s |\n", row.label, over(row.format, row.f))
	}
	for i, r := range rounds {
		if r.Gap.FirstError != "" {
			fmt.Fprintf(w, "\nRound %d, the first write that failed during the leave: %s\n", i+1, r.Gap.FirstError)
		}
	}
	if mdOut != "" {
		writeFile(mdOut, out.Bytes())
	}
	if jsonOut != "" {
		b, _ := json.MarshalIndent(map[string]any{"config": map[string]any{"duration": cfg.d.String(), "mib": cfg.mib}, "rounds": rounds}, "", "  ")
		writeFile(jsonOut, b)
	}
	return 0
}
