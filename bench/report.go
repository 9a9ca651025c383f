package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// driveConfig is what one run of the driver does.
type driveConfig struct {
	rounds         int
	d, warmup      time.Duration
	memObjs        int
	logRecs        int
	jsonOut, mdOut string
	floor          float64 // exit 1 when a median ratio is below floor × its target; 0: never
	workloads      []workload
	systems        []string
	base           string   // filled by drive: where the data directories are
	caseNames      []string // filled by drive
}

// fastProbe is the probe rate above which ratios to the probe are not checked:
// on a disk that syncs this fast, the cases are bound by the CPU, not by syncs,
// and a ratio to the probe no longer says whether syncs are shared.
const fastProbe = 20000

// drive runs the rounds, each case in a child process with a fresh data
// directory, and reports.
func drive(base string, cfg driveConfig) int {
	self, err := os.Executable()
	if err != nil {
		fatal(err)
	}
	cfg.base = base
	var failures []string
	run := func(round int, name string) (result, bool) {
		dir := childDir(base, round, name)
		defer os.RemoveAll(dir)
		cmd := exec.Command(self, "-case", name, "-dir", dir, "-duration", cfg.d.String(), "-warmup", cfg.warmup.String(),
			fmt.Sprintf("-memory-objects=%d", cfg.memObjs), fmt.Sprintf("-log-records=%d", cfg.logRecs))
		var stderr bytes.Buffer
		cmd.Stderr = io.MultiWriter(os.Stderr, &stderr)
		out, err := cmd.Output()
		var r result
		if err == nil {
			err = json.Unmarshal(out, &r)
		}
		if err != nil {
			failures = append(failures, fmt.Sprintf("round %d, %s: %v %s", round+1, name, err, strings.TrimSpace(stderr.String())))
			fmt.Fprintf(os.Stderr, "bench: %s failed: %v\n", name, err)
			return result{}, false
		}
		return r, true
	}
	for _, w := range cfg.workloads {
		for _, s := range cfg.systems {
			if w.has(s) {
				cfg.caseNames = append(cfg.caseNames, caseName(s, w.name))
			}
		}
	}
	rep := &report{cfg: cfg, cases: map[string][]result{}, ratios: map[string][]float64{}, vs: map[string][]float64{}}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	for round := 0; round < cfg.rounds; round++ {
		p1, _ := run(round, "probe")
		got := map[string]result{}
		for _, i := range rng.Perm(len(cfg.caseNames)) {
			name := cfg.caseNames[i]
			if r, ok := run(round, name); ok {
				got[name] = r
			}
		}
		p2, _ := run(round, "probe")
		rep.probes = append(rep.probes, p1.OpsPerSec, p2.OpsPerSec)
		mean := (p1.OpsPerSec + p2.OpsPerSec) / 2
		for name, r := range got {
			rep.cases[name] = append(rep.cases[name], r)
			if mean > 0 {
				rep.ratios[name] = append(rep.ratios[name], r.OpsPerSec/mean)
			}
		}
		// Ratios to the peers, side by side in the same round.
		for k, v := range roundRatios(cfg.workloads, got) {
			rep.vs[k] = append(rep.vs[k], v)
		}
		fmt.Fprintf(os.Stderr, "round %d of %d: probe %.0f/%.0f per s\n", round+1, cfg.rounds, p1.OpsPerSec, p2.OpsPerSec)
	}
	if cfg.logRecs > 0 {
		rep.restart = map[string]result{}
		for _, s := range cfg.systems {
			if s == sysHoldfastHTTP || s == sysHoldfastClient || slices.Contains(replicatedSystems, s) {
				continue // the same start as embedded; the replicated peers only write
			}
			if r, ok := run(0, caseName(s, restartCase)); ok {
				rep.restart[s] = r
			}
		}
		if slices.Contains(cfg.systems, sysHoldfast) {
			if r, ok := run(0, "redelivery"); ok {
				rep.redelivery = &r
			}
		}
	}
	if slices.Contains(cfg.systems, sysHoldfast) {
		if r, ok := run(0, "queue-latency"); ok {
			rep.queueLatency = &r
		}
	}
	if cfg.memObjs > 0 && slices.Contains(cfg.systems, sysHoldfast) {
		if r, ok := run(0, "memory"); ok {
			rep.memory = &r
		}
	}
	rep.failures = failures
	return rep.write()
}

// roundRatios returns one round's ratios to the peers, keyed as report.vs:
// under a peer's case name, Holdfast's figure over the peer's (on
// holdfast-r3's case, the single node's over R3's); with "/http" appended,
// Holdfast over HTTP's; with "/client" appended, the in-cluster Go client's;
// with "/r3" appended, Holdfast R3's over a replicated peer's (issue 27's
// targets).
func roundRatios(ws []workload, got map[string]result) map[string]float64 {
	out := map[string]float64{}
	for _, w := range ws {
		h, hok := got[caseName(sysHoldfast, w.name)]
		hh, hhok := got[caseName(sysHoldfastHTTP, w.name)]
		hc, hcok := got[caseName(sysHoldfastClient, w.name)]
		r3, r3ok := got[caseName(sysHoldfastR3, w.name)]
		for _, peer := range slices.Concat([]string{sysRedis, sysJetStream}, replicatedSystems) {
			name := caseName(peer, w.name)
			p, ok := got[name]
			if !ok || p.OpsPerSec <= 0 {
				continue
			}
			if hok {
				out[name] = h.OpsPerSec / p.OpsPerSec
			}
			if hhok { // with or without an embedded form (batch-increments-16x100 has none)
				out[name+"/http"] = hh.OpsPerSec / p.OpsPerSec
			}
			if hcok {
				out[name+"/client"] = hc.OpsPerSec / p.OpsPerSec
			}
			if r3ok && peer != sysHoldfastR3 && slices.Contains(replicatedSystems, peer) {
				out[name+"/r3"] = r3.OpsPerSec / p.OpsPerSec
			}
		}
	}
	return out
}

// report is what the rounds measured.
type report struct {
	cfg          driveConfig
	probes       []float64
	cases        map[string][]result  // by case name
	ratios       map[string][]float64 // to the mean probe of the round, by case name
	vs           map[string][]float64 // Holdfast over the peer, by the peer's case name
	restart      map[string]result    // by system
	redelivery   *result
	queueLatency *result
	memory       *result
	failures     []string
}

type stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

func summarize(xs []float64) stat {
	if len(xs) == 0 {
		return stat{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

func (r *report) field(name string, f func(result) float64) stat {
	var xs []float64
	for _, c := range r.cases[name] {
		xs = append(xs, f(c))
	}
	return summarize(xs)
}

func fmtStat(s stat, format string) string {
	if s.N == 0 {
		return "—"
	}
	if s.N == 1 {
		return fmt.Sprintf(format, s.Median)
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", s.Median, s.Min, s.Max)
}

// systemFigures is one system's figures for one workload, in the JSON file.
type systemFigures struct {
	OpsPerSec stat `json:"opsPerSec"`
	// RatioToProbe is OpsPerSec over the mean of the round's two probes.
	RatioToProbe stat `json:"ratioToProbe"`
	// CPUMicrosPerOp is the CPU time of the process that ran the case (for
	// Redis, Holdfast over HTTP and its in-cluster Go client the client
	// only) per operation.
	CPUMicrosPerOp stat `json:"cpuMicrosPerOp"`
	// ServerCPUMicrosPerOp is a separate server process's CPU time per
	// operation (Redis, Holdfast over HTTP and its in-cluster Go client's node).
	ServerCPUMicrosPerOp *stat `json:"serverCpuMicrosPerOp,omitempty"`
	// DiskBytesPerPayloadByte is what the server process wrote to disk per
	// byte of payload (write cases only).
	DiskBytesPerPayloadByte *stat `json:"diskBytesPerPayloadByte,omitempty"`
	// HoldfastOver is Holdfast's figure over this peer's, round by round;
	// HoldfastHTTPOver the same for Holdfast over HTTP, HoldfastClientOver
	// for its in-cluster Go client.
	HoldfastOver       *stat `json:"holdfastOver,omitempty"`
	HoldfastHTTPOver   *stat `json:"holdfastHttpOver,omitempty"`
	HoldfastClientOver *stat `json:"holdfastClientOver,omitempty"`
	// HoldfastR3Over is Holdfast R3's figure over this replicated peer's,
	// round by round.
	HoldfastR3Over *stat `json:"holdfastR3Over,omitempty"`
	SyncsPerOp     *stat `json:"syncsPerOp,omitempty"`
	// LatencyP50Ms and LatencyP99Ms are one operation's latency (the peers'
	// write cases).
	LatencyP50Ms *stat    `json:"latencyP50Ms,omitempty"`
	LatencyP99Ms *stat    `json:"latencyP99Ms,omitempty"`
	Notes        []string `json:"notes,omitempty"`
}

func (r *report) figures(w workload, system string) (systemFigures, bool) {
	name := caseName(system, w.name)
	if len(r.cases[name]) == 0 {
		return systemFigures{}, false
	}
	f := systemFigures{
		OpsPerSec:    r.field(name, func(c result) float64 { return c.OpsPerSec }),
		RatioToProbe: summarize(r.ratios[name]),
		CPUMicrosPerOp: r.field(name, func(c result) float64 {
			if c.Ops == 0 {
				return 0
			}
			return c.CPUSeconds * 1e6 / float64(c.Ops)
		}),
	}
	if system == sysRedis || system == sysHoldfastHTTP || system == sysHoldfastClient || system == sysEtcd3 || system == sysEtcd1 {
		s := r.field(name, func(c result) float64 {
			if c.Ops == 0 {
				return 0
			}
			return c.ServerCPU * 1e6 / float64(c.Ops)
		})
		f.ServerCPUMicrosPerOp = &s
	}
	if w.payload {
		s := r.field(name, func(c result) float64 {
			if c.PayloadBytes == 0 {
				return 0
			}
			return float64(c.DiskBytes) / c.PayloadBytes
		})
		f.DiskBytesPerPayloadByte = &s
	}
	if system == sysHoldfast {
		s := r.field(name, func(c result) float64 { return c.SyncsPerWrite })
		f.SyncsPerOp = &s
	}
	if vs := r.vs[name]; len(vs) > 0 {
		s := summarize(vs)
		f.HoldfastOver = &s
	}
	if p50 := r.field(name, func(c result) float64 { return c.LatencyP50Ms }); p50.Median > 0 {
		p99 := r.field(name, func(c result) float64 { return c.LatencyP99Ms })
		f.LatencyP50Ms, f.LatencyP99Ms = &p50, &p99
	}
	if vs := r.vs[name+"/http"]; len(vs) > 0 {
		s := summarize(vs)
		f.HoldfastHTTPOver = &s
	}
	if vs := r.vs[name+"/client"]; len(vs) > 0 {
		s := summarize(vs)
		f.HoldfastClientOver = &s
	}
	if vs := r.vs[name+"/r3"]; len(vs) > 0 {
		s := summarize(vs)
		f.HoldfastR3Over = &s
	}
	for _, c := range r.cases[name] {
		for _, n := range strings.Split(c.Note, "; ") {
			// Notes that carry a measurement (fill times) differ run to run;
			// the report keeps the ones that say what the figures mean.
			if n != "" && !strings.HasPrefix(n, "pre-filled") && !slices.Contains(f.Notes, n) {
				f.Notes = append(f.Notes, n)
			}
		}
	}
	return f, true
}

// holdfastOver is the ratio of the Holdfast system system's figure to this
// peer's, round by round; nil when there is none.
func (f systemFigures) holdfastOver(system string) *stat {
	switch system {
	case sysHoldfast:
		return f.HoldfastOver
	case sysHoldfastHTTP:
		return f.HoldfastHTTPOver
	case sysHoldfastClient:
		return f.HoldfastClientOver
	}
	return nil
}

// overCell is a peer's "Holdfast ÷ peer" cell: the embedded figure's ratio
// to peer's figures f ("—" when none), then over HTTP's and the in-cluster
// Go client's where they have a ratio or a target, each followed by its
// target.
func overCell(f systemFigures, targets []peerTarget) string {
	var parts []string
	for _, s := range []struct{ system, label string }{{sysHoldfast, ""}, {sysHoldfastHTTP, "over HTTP "}, {sysHoldfastClient, "Go client "}} {
		over := f.holdfastOver(s.system)
		i := slices.IndexFunc(targets, func(t peerTarget) bool { return t.system == s.system })
		if over == nil && i < 0 && s.system != sysHoldfast {
			continue
		}
		part := s.label + "—"
		if over != nil {
			part = s.label + fmtStat(*over, "%.2fx")
		}
		if i >= 0 {
			part += fmt.Sprintf(" (target %gx)", targets[i].min)
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, "; ")
}

var systemTitle = map[string]string{sysHoldfast: "Holdfast", sysHoldfastHTTP: "Holdfast over HTTP", sysHoldfastClient: "Holdfast's in-cluster Go client", sysRedis: "Redis", sysJetStream: "JetStream",
	sysEtcd3: "etcd, 3 members", sysEtcd1: "etcd, 1 member", sysJetStreamR3: "JetStream R3", sysHoldfastR3: "Holdfast R3"}

// write prints the Markdown report, writes the JSON and Markdown files, and
// returns the exit code.
func (r *report) write() int {
	var md strings.Builder
	ps := summarize(r.probes)
	mach := machine(r.cfg.base)
	fmt.Fprintf(&md, "Machine: %s\n\n", mach)
	fmt.Fprintf(&md, "%d rounds in shuffled order, %v measured per case after a %v warm-up, each case in its own process with a fresh data directory. "+
		"Figures are medians over the rounds (min–max in brackets); ratios are to the mean of the fsync probe run before and after the round's cases, "+
		"and Holdfast's ratio to a peer is taken round by round.\n\n", r.cfg.rounds, r.cfg.d, r.cfg.warmup)
	fmt.Fprintf(&md, "| case | unit | Holdfast | Holdfast ÷ probe | target | Holdfast over HTTP | Holdfast's in-cluster Go client | Redis | Holdfast ÷ Redis | JetStream | Holdfast ÷ JetStream |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&md, "| fsync probe (4 KiB overwrite + fdatasync) | syncs/s | %s | 1 | | | | | | | |\n", fmtStat(ps, "%.0f"))
	summary := map[string]any{"machine": mach, "rounds": r.cfg.rounds, "duration": r.cfg.d.String(), "warmup": r.cfg.warmup.String(),
		"probe": ps, "workloads": map[string]any{}}
	var below []string
	checkProbe := ps.Median > 0 && ps.Median <= fastProbe
	for _, w := range r.cfg.workloads {
		entry := map[string]any{"title": w.title, "unit": w.unit}
		figs := map[string]systemFigures{}
		for _, s := range r.cfg.systems {
			if f, ok := r.figures(w, s); ok {
				figs[s] = f
				entry[s] = f
			}
		}
		h, hok := figs[sysHoldfast]
		target := ""
		if w.target > 0 {
			target = fmt.Sprintf("%gx probe", w.target)
			entry["targetRatioToProbe"] = w.target
			if hok && h.RatioToProbe.N > 0 && h.RatioToProbe.Median < w.target {
				if r.cfg.floor > 0 && checkProbe && h.RatioToProbe.Median < w.target*r.cfg.floor {
					below = append(below, fmt.Sprintf("%s: %.2fx the probe, below %g × its target %gx", w.name, h.RatioToProbe.Median, r.cfg.floor, w.target))
				}
			}
		}
		ops := func(s string) string {
			if f, ok := figs[s]; ok {
				return fmtStat(f.OpsPerSec, "%.0f")
			}
			return "—"
		}
		over := map[string]string{}
		for _, peer := range []string{sysRedis, sysJetStream} {
			targets := w.targetsOver(peer)
			over[peer] = overCell(figs[peer], targets)
			for _, t := range targets {
				key := "targetOver" + systemTitle[peer] // on the REST figure in a wire case
				if t.system == sysHoldfastClient {
					key += "Client"
				}
				entry[key] = t.min
				if got := figs[peer].holdfastOver(t.system); got != nil && r.cfg.floor > 0 && got.Median < t.min*r.cfg.floor {
					below = append(below, fmt.Sprintf("%s: %s at %.2fx %s, below %g × its target %gx", w.name, systemTitle[t.system], got.Median, systemTitle[peer], r.cfg.floor, t.min))
				}
			}
		}
		hOps, hRatio := "—", "—"
		if hok {
			hOps, hRatio = fmtStat(h.OpsPerSec, "%.0f"), fmtStat(h.RatioToProbe, "%.2fx")
		}
		httpOps, clientOps := ops(sysHoldfastHTTP), ops(sysHoldfastClient)
		if f, ok := figs[sysHoldfastHTTP]; ok {
			httpOps += fmt.Sprintf(" [%.2fx probe]", f.RatioToProbe.Median)
		}
		if f, ok := figs[sysHoldfastClient]; ok {
			clientOps += fmt.Sprintf(" [%.2fx probe]", f.RatioToProbe.Median)
		}
		fmt.Fprintf(&md, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", w.title, w.unit, hOps, hRatio, target, httpOps, clientOps,
			ops(sysRedis), over[sysRedis], ops(sysJetStream), over[sysJetStream])
		summary["workloads"].(map[string]any)[w.name] = entry
	}

	// Costs.
	fmt.Fprintf(&md, "\nCosts over the measured interval. CPU is the process that ran the case: Holdfast and JetStream run embedded, so theirs includes the server; "+
		"Redis's, Holdfast-over-HTTP's and Holdfast's in-cluster Go client's clients and servers are separate processes, given apart. Disk bytes are what the server process wrote (`write_bytes` of `/proc/<pid>/io`) per byte of 256-byte payload.\n\n")
	fmt.Fprintf(&md, "| case | CPU µs per op: Holdfast | HTTP client | HTTP server | Go client | its node | Redis client | Redis server | JetStream | disk bytes per payload byte: Holdfast | Redis | JetStream | Holdfast syncs per op |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, w := range r.cfg.workloads {
		cpu := map[string]string{}
		disk := map[string]string{}
		server := map[string]string{}
		for _, s := range systems {
			cpu[s], disk[s], server[s] = "—", "—", "—"
			if f, ok := r.figures(w, s); ok {
				cpu[s] = fmtStat(f.CPUMicrosPerOp, "%.1f")
				if f.ServerCPUMicrosPerOp != nil {
					server[s] = fmtStat(*f.ServerCPUMicrosPerOp, "%.1f")
				}
				if f.DiskBytesPerPayloadByte != nil {
					disk[s] = fmtStat(*f.DiskBytesPerPayloadByte, "%.2f")
				}
			}
		}
		syncs := "—"
		if f, ok := r.figures(w, sysHoldfast); ok && f.SyncsPerOp != nil {
			syncs = fmtStat(*f.SyncsPerOp, "%.4f")
		}
		fmt.Fprintf(&md, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", w.title, cpu[sysHoldfast], cpu[sysHoldfastHTTP], server[sysHoldfastHTTP],
			cpu[sysHoldfastClient], server[sysHoldfastClient], cpu[sysRedis], server[sysRedis], cpu[sysJetStream], disk[sysHoldfast], disk[sysRedis], disk[sysJetStream], syncs)
	}

	r.writeReplicated(&md)

	if len(r.restart) > 0 {
		fmt.Fprintf(&md, "\n| restart with %d records in one log | Holdfast | Redis | JetStream |\n|---|---|---|---|\n| seconds from start to serving the data (target for Holdfast: under 1 s) |", r.cfg.logRecs)
		rs := map[string]any{}
		for _, s := range []string{sysHoldfast, sysRedis, sysJetStream} {
			if x, ok := r.restart[s]; ok {
				fmt.Fprintf(&md, " %.3f |", x.StartSeconds)
				rs[s] = x
			} else {
				fmt.Fprintf(&md, " — |")
			}
		}
		fmt.Fprintln(&md)
		summary["restart"] = rs
		if x, ok := r.restart[sysHoldfast]; ok {
			fmt.Fprintf(&md, "\nHoldfast's log of %d records: filled at %.0f records/s (batches of 1,000), read at %.0f records/s (pages of 1,000). "+
				"Its start is the median of 5 (open the data directory, read the last record); Redis's is from launching redis-server until it has loaded the AOF; "+
				"JetStream's from creating the embedded server until every stream answers with its message count.\n", x.LogRecords, x.FillRecordsPerSec, x.ReadRecordsPerSec)
			if x.StartSeconds >= 1 && r.cfg.floor > 0 {
				below = append(below, fmt.Sprintf("restart: %.3f s, target under 1 s", x.StartSeconds))
			}
		}
	}
	if r.redelivery != nil {
		fmt.Fprintf(&md, "\nLease redelivery after expiry (Holdfast; leases of 100 ms, a poller asking every 1 ms, 200 expiries): p50 %.0f ms, p99 %.0f ms.\n",
			r.redelivery.RedeliveryP50Ms, r.redelivery.RedeliveryP99Ms)
		summary["redelivery"] = r.redelivery
	}
	if ql := r.queueLatency; ql != nil {
		fmt.Fprintf(&md, "\nQueue latency (Holdfast; %d messages at 500 per second, from the enqueue call to the push handler, both fsyncs included): p50 %.2f ms, p99 %.2f ms.\n",
			ql.Ops, ql.QueueLatencyP50Ms, ql.QueueLatencyP99Ms)
		summary["queueLatency"] = ql
	}
	if m := r.memory; m != nil {
		fmt.Fprintf(&md, "\n| Holdfast memory, %d objects | Go heap bytes |\n|---|---|\n| per active object (quiet) | %.0f |\n| per idle (passivated) object: growth over a second round of %d other objects | %.0f |\n| routing tables' high-water mark, per object of the peak | %.0f |\n",
			r.cfg.memObjs, m.BytesPerActive, r.cfg.memObjs, m.BytesPerIdle, m.HighWaterPerPeak)
		summary["memory"] = m
	}

	// Where a peer promises less, and what else the figures mean.
	fmt.Fprintf(&md, "\nNotes from the runs:\n\n")
	seen := map[string]bool{}
	for _, w := range r.cfg.workloads {
		for _, s := range slices.Concat(systems, replicatedSystems) {
			if f, ok := r.figures(w, s); ok {
				for _, n := range f.Notes {
					if !seen[n] {
						seen[n] = true
						fmt.Fprintf(&md, "- %s (%s): %s\n", systemTitle[s], w.name, n)
					}
				}
			}
		}
	}
	if !checkProbe && r.cfg.floor > 0 {
		fmt.Fprintf(&md, "\nThe probe ran at %.0f syncs/s, above %d: on a disk this fast the cases are bound by the CPU, so ratios to the probe were not checked.\n", ps.Median, fastProbe)
	}
	if len(r.failures) > 0 {
		fmt.Fprintf(&md, "\nFailed cases:\n\n")
		for _, f := range r.failures {
			fmt.Fprintf(&md, "- %s\n", f)
		}
		summary["failures"] = r.failures
	}
	if len(below) > 0 {
		summary["belowFloor"] = below
	}

	fmt.Print(md.String())
	if r.cfg.mdOut != "" {
		writeFile(r.cfg.mdOut, []byte(md.String()))
	}
	if r.cfg.jsonOut != "" {
		b, _ := json.MarshalIndent(summary, "", "  ")
		writeFile(r.cfg.jsonOut, b)
	}
	code := 0
	if len(r.failures) > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d cases failed\n", len(r.failures))
		code = 1
	}
	for _, b := range below {
		fmt.Fprintf(os.Stderr, "bench: far below target: %s\n", b)
		code = 1
	}
	return code
}

func writeFile(path string, b []byte) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		fatal(err)
	}
}

// machine describes this machine for the report: CPU, memory, kernel, the
// file system of dir, and the versions of the systems measured.
func machine(dir string) string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.0f GiB", float64(kb)/(1<<20))
		}
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = ", Linux " + strings.TrimSpace(string(b))
	}
	fs := ""
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err == nil {
		names := map[int64]string{0xEF53: "ext4", 0x58465342: "xfs", 0x01021994: "tmpfs", 0x794c7630: "overlayfs", 0x9123683E: "btrfs"}
		name, ok := names[int64(st.Type)]
		if !ok {
			name = fmt.Sprintf("file system 0x%x", st.Type)
		}
		fs = fmt.Sprintf(", data on %s (%s)", name, dir)
	}
	redis := "redis-server not found"
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		if f := strings.Fields(string(out)); len(f) >= 3 {
			redis = "Redis " + strings.TrimPrefix(f[2], "v=")
		}
	}
	return fmt.Sprintf("%d cores (%s)%s%s%s; %s; %s, nats-server %s", runtime.NumCPU(), cpu, mem, kernel, fs, runtime.Version(), redis, server.VERSION)
}

// writeReplicated adds the table of the replicated peers (issue 27), one row
// per case and system, when the run had one: throughput, ratio to the probe,
// Holdfast's ratio to it (when Holdfast ran; on Holdfast R3's row, the single
// node's over R3's), Holdfast R3's ratio to it (when it ran), CPU per
// operation of the client
// and of the servers, disk bytes per payload byte, and one operation's
// latency.
func (r *report) writeReplicated(md *strings.Builder) {
	if !slices.ContainsFunc(r.cfg.systems, func(s string) bool { return slices.Contains(replicatedSystems, s) }) {
		return
	}
	fmt.Fprintf(md, "\nReplicated peers (issue 27), side by side with the systems of the same run. Holdfast ÷ it is the single node's throughput over the system's (on Holdfast R3's row: the single node over R3), "+
		"Holdfast R3 ÷ it the same for Holdfast with three replicas, each round by round. "+
		"CPU: the case's process (client; for JetStream R3, Holdfast and Holdfast R3, client and servers together), "+
		"and the member processes summed (etcd; Redis's server). Latency: one operation, from the call to its acknowledgement, over the measured interval (medians over the rounds of each round's percentile).\n\n")
	fmt.Fprintf(md, "| case | system | ops/s | ÷ probe | Holdfast ÷ it | Holdfast R3 ÷ it | CPU µs/op: process | servers | disk bytes per payload byte | p50 ms | p99 ms |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, w := range r.cfg.workloads {
		if !slices.Contains(replicatedWorkloads, w.name) {
			continue
		}
		for _, s := range slices.Concat(systems, replicatedSystems) {
			if !slices.Contains(r.cfg.systems, s) {
				continue
			}
			f, ok := r.figures(w, s)
			if !ok {
				continue
			}
			opt := func(st *stat, format string) string {
				if st == nil {
					return "—"
				}
				return fmtStat(*st, format)
			}
			fmt.Fprintf(md, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", w.name, systemTitle[s],
				fmtStat(f.OpsPerSec, "%.0f"), fmtStat(f.RatioToProbe, "%.2fx"), opt(f.HoldfastOver, "%.2fx"), opt(f.HoldfastR3Over, "%.2fx"),
				fmtStat(f.CPUMicrosPerOp, "%.1f"), opt(f.ServerCPUMicrosPerOp, "%.1f"), opt(f.DiskBytesPerPayloadByte, "%.2f"),
				opt(f.LatencyP50Ms, "%.2f"), opt(f.LatencyP99Ms, "%.2f"))
		}
	}
}
