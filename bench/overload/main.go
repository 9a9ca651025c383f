// Command overload is issue 25's overload run: many more writers than a node
// can take, against a real `holdfast serve` process with a memory budget, and
// what it must show: the server's RSS stays under the budget, admitted writes
// keep a bounded p99, refused ones get 503 with retryAfterMs, and nothing
// acknowledged is lost, across a restart too.
//
//	go run ./bench/overload                           # 25 s baseline only, then 60 s of overload
//	go run ./bench/overload -duration 20s -baseline-duration 10s -md /tmp/overload.md
//
// Phases, on one server and one data directory:
//
//  1. baseline only (-baseline-duration, 0 skips it): -baseline-writers
//     writers increment counters on -objects objects, one request in flight
//     each. Its latencies are the reference.
//  2. overload (-duration): the same baseline writers, plus -writers writers
//     each putting a -min-value to -max-value byte value on a new object
//     (a fresh key every time), which drives the node's memory up.
//  3. the load stops; every acknowledged write is read back; the server gets
//     SIGTERM, starts again on the same data, and everything is read again.
//
// Every reply is recorded (status, latency, and for a refusal whether its body
// has retryAfterMs and it has a Retry-After header). Writers sleep a refusal's
// retryAfterMs before their next write, which always uses a new value (a 5xx's
// outcome is unknown, so a key is never retried blindly). The server's memory
// is sampled every 250 ms from /proc/<pid>/status (VmRSS, RssAnon, RssFile) and
// its live heap every 5 s from GET /metrics (a scrape is not free: it scans
// every partition's queue index in Badger). After the load it measures how long
// the node keeps refusing new activations.
//
// The Markdown report goes to stdout and to -md. The exit status is 1 when an
// acknowledged write was lost, a refusal lacked retryAfterMs, or RssAnon went
// over the budget.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

func main() { os.Exit(realMain()) }

// realMain runs the whole thing and returns the exit status, so that its
// deferred clean-ups run. The work directory is removed only after a run
// that showed everything the issue asks (unless -keep or -dir).
func realMain() int {
	var (
		duration   = flag.Duration("duration", 60*time.Second, "overload phase")
		baseDur    = flag.Duration("baseline-duration", 25*time.Second, "baseline-only phase before it (0 skips it)")
		baseW      = flag.Int("baseline-writers", 16, "baseline writers (counter increments)")
		objects    = flag.Int("objects", 1000, "counters of the baseline writers")
		writers    = flag.Int("writers", 80, "overload writers (large values on new objects)")
		minLen     = flag.Int("min-value", 512<<10, "smallest large value, bytes")
		maxLen     = flag.Int("max-value", 1<<20-64, "largest large value, bytes (a slot value is at most 1 MiB of JSON)")
		budget     = flag.Int64("budget", 1<<30, "the node's memory budget, bytes (HOLDFAST_MEMORY_BUDGET; under 1 GiB Badger's own heap leaves objects little room, docs/decisions.md)")
		bin        = flag.String("bin", "", "holdfast binary (default: go build ./cmd/holdfast)")
		dirFlag    = flag.String("dir", "", "work directory (default: a temporary one, removed unless -keep)")
		keep       = flag.Bool("keep", false, "keep the work directory (data and server.log)")
		mdOut      = flag.String("md", "", "also write the Markdown report to this file")
		timeout    = flag.Duration("timeout", 30*time.Second, "of one request; no reply in time is an unknown outcome")
		readers    = flag.Int("readers", 4, "concurrent reads of the read-back")
		sampleStep = flag.Duration("sample", 250*time.Millisecond, "RSS sampling interval")
		scrapeStep = flag.Duration("scrape", 5*time.Second, "GET /metrics interval (each scrape scans every partition's queue index in Badger: not free under load)")
		step       = flag.Duration("timeline", 5*time.Second, "step of the overload phase's timeline")
		verifyMax  = flag.Duration("verify-timeout", 3*time.Minute, "of one read-back of everything (reads refused past it count as unreadable)")
		recovery   = flag.Duration("recovery-wait", time.Minute, "how long to wait, after the load, for the node to accept new activations again")
	)
	flag.Parse()
	if *baseW < 1 || *objects < 1 || *writers < 0 || *minLen < 64 || *maxLen < *minLen || *maxLen > 1<<20-2 || *budget < 64<<20 ||
		*duration <= 0 || *baseDur < 0 || *readers < 1 || *sampleStep <= 0 {
		return fail(fmt.Errorf("flags out of range: need -baseline-writers, -objects, -readers >= 1; 64 <= -min-value <= -max-value <= %d; -budget >= 64 MiB; -duration > 0", 1<<20-2))
	}
	work := *dirFlag
	if work == "" {
		d, err := os.MkdirTemp("", "holdfast-overload-")
		if err != nil {
			return fail(err)
		}
		work = d
	} else if err := os.MkdirAll(work, 0o755); err != nil {
		return fail(err)
	}
	passed := false
	defer func() {
		if passed && !*keep && *dirFlag == "" {
			os.RemoveAll(work)
		} else {
			fmt.Fprintf(os.Stderr, "overload: the data and server.log are in %s (remove it when done)\n", work)
		}
	}()
	if *bin == "" {
		b, err := buildServer(work)
		if err != nil {
			return fail(err)
		}
		*bin = b
	}
	r := &runReport{
		Command: "go run ./bench/overload " + strings.Join(os.Args[1:], " "),
		Date:    time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		Machine: machine(), Scrape: *scrapeStep,
		Budget: *budget, Writers: *writers, BaseWriters: *baseW, Objects: *objects, MinLen: *minLen, MaxLen: *maxLen, Step: *step,
	}
	r.Command = strings.TrimSpace(r.Command)
	if err := run(r, *bin, work, runOpts{*duration, *baseDur, *timeout, *readers, *sampleStep, *scrapeStep, *verifyMax, *recovery}); err != nil {
		return fail(err)
	}
	var sb strings.Builder
	r.write(&sb)
	fmt.Print(sb.String())
	if *mdOut != "" {
		if err := os.WriteFile(*mdOut, []byte(sb.String()), 0o644); err != nil {
			return fail(err)
		}
	}
	if rssOK, retryOK, lostOK := r.verdicts(); !rssOK || !retryOK || !lostOK {
		return 1
	}
	passed = true
	return 0
}

type runOpts struct {
	duration, baseDur, timeout time.Duration
	readers                    int
	step, scrape               time.Duration
	verifyMax, recovery        time.Duration
}

// run does the phases and fills r.
func run(r *runReport, bin, work string, o runOpts) error {
	duration, baseDur, timeout, readers, step := o.duration, o.baseDur, o.timeout, o.readers, o.step
	dataDir := filepath.Join(work, "data")
	logFile := filepath.Join(work, "server.log")
	env := []string{fmt.Sprintf("HOLDFAST_MEMORY_BUDGET=%d", r.Budget)}
	progress("starting the server (budget %s, log %s)", mib(r.Budget), logFile)
	srv, err := startServer(bin, dataDir, logFile, env)
	if err != nil {
		return err
	}
	defer srv.kill()
	app, err := readApp(dataDir)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: r.Writers + r.BaseWriters + 16}}
	defer hc.CloseIdleConnections()
	c := &client{http: hc, url: srv.url, app: app}
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	sm := &sampler{pid: srv.pid(), url: srv.url, start: start, interval: step, scrapeEvery: o.scrape, client: hc}
	sampled := make(chan struct{})
	go func() { defer close(sampled); sm.run(ctx) }()
	stopSampler := func() { cancel(); <-sampled }
	defer stopSampler()

	l := &load{c: c, start: start, objects: r.Objects, minLen: r.MinLen, maxLen: r.MaxLen, vals: newValues(r.MaxLen, 0x9e3779b97f4a7c15), refusalBackoff: time.Second}
	var all [][]*writerLog
	if baseDur > 0 {
		progress("baseline only for %v: %d writers", baseDur, r.BaseWriters)
		from := time.Since(start)
		base, _ := l.phase(r.BaseWriters, 0, baseDur, 1)
		to := time.Since(start)
		all = append(all, base)
		ss, _, _ := sm.taken()
		r.Phases = append(r.Phases, phaseReport{Name: "baseline only", From: from, To: to, Mem: memOver(ss, from, to),
			Groups: []groupStats{groupOf("baseline", r.BaseWriters, to-from, base)}})
	}
	progress("overload for %v: %d baseline writers and %d large-value writers", duration, r.BaseWriters, r.Writers)
	from := time.Since(start)
	base, big := l.phase(r.BaseWriters, r.Writers, duration, 2)
	to := time.Since(start)
	all = append(all, base, big)
	if m, err := scrape(context.Background(), hc, srv.url); err == nil {
		r.FinalMetrics = m
	}
	ss, _, _ := sm.taken()
	r.Phases = append(r.Phases, phaseReport{Name: "overload", From: from, To: to, Mem: memOver(ss, from, to),
		Groups: []groupStats{groupOf("baseline", r.BaseWriters, to-from, base), groupOf("overload", r.Writers, to-from, big)}})
	r.Timeline = timeline(from, to, r.Step, base, big, ss)

	progress("waiting up to %v for the node to accept new activations", o.recovery)
	r.Recovery, r.Recovered, r.RecoveryRefusals = waitAccepting(c, o.recovery)
	a := mergeAcks(all...)
	vals := l.vals
	progress("reading back %d counters and %d large values", len(a.ackedIncr), len(a.big))
	vfrom := time.Since(start)
	r.Verify = verify(c, a, vals, readers, 30*time.Second, o.verifyMax)
	ss, perrs, serrs := sm.taken()
	r.VerifyMem = memOver(ss, vfrom, time.Since(start)+time.Second)

	progress("SIGTERM, then a restart")
	stopSampler()
	r.ProcErrs, r.ScrapeErrs = perrs, serrs
	r.StopTook, r.StopErr = srv.stop(2 * time.Minute)
	restartAt := time.Now()
	srv2, err := startServer(bin, dataDir, logFile, env)
	if err != nil {
		r.Warnings, r.RefusalLogs = srv.warningCount()
		return fmt.Errorf("restart after the load: %w", err)
	}
	defer srv2.kill()
	r.StartTook = time.Since(restartAt)
	c2 := &client{http: hc, url: srv2.url, app: app}
	ctx2, cancel2 := context.WithCancel(context.Background())
	sm2 := &sampler{pid: srv2.pid(), url: srv2.url, start: start, interval: step, scrapeEvery: o.scrape, client: hc}
	sampled2 := make(chan struct{})
	go func() { defer close(sampled2); sm2.run(ctx2) }()
	progress("reading everything back again")
	rfrom := time.Since(start)
	r.VerifyRestart = verify(c2, a, vals, readers, 30*time.Second, o.verifyMax)
	cancel2()
	<-sampled2
	ss2, perrs2, serrs2 := sm2.taken()
	r.RestartMem = memOver(ss2, rfrom, time.Since(start)+time.Second)
	r.ProcErrs, r.ScrapeErrs = r.ProcErrs+perrs2, r.ScrapeErrs+serrs2
	if _, err := srv2.stop(2 * time.Minute); err != nil {
		progress("the restarted server's exit: %v", err)
	}
	r.Warnings, r.RefusalLogs = srv.warningCount()
	w2, rl2 := srv2.warningCount()
	r.Warnings, r.RefusalLogs = r.Warnings+w2, r.RefusalLogs+rl2
	return nil
}

// waitAccepting asks, every 500 ms for at most wait, for a slot of a new
// object (an activation, which a node over its budget refuses), and returns
// how long until one was served (a 200 or a 404), whether one was, and how
// many were refused.
func waitAccepting(c *client, wait time.Duration) (time.Duration, bool, int) {
	start := time.Now()
	refusals := 0
	for i := 0; ; i++ {
		status, _, _ := c.do(context.Background(), "GET", fmt.Sprintf("/api/v1/objects/%s/probe/p%d/x", c.app.ID, i), nil)
		if status == 200 || status == 404 {
			return time.Since(start), true, refusals
		}
		if classify(status) == refused {
			refusals++
		}
		if time.Since(start) >= wait {
			return time.Since(start), false, refusals
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func machine() string {
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if _, v, ok := strings.Cut(l, ":"); ok {
					cpu = strings.TrimSpace(v)
				}
				break
			}
		}
	}
	return fmt.Sprintf("%d cores (%s), %s", runtime.NumCPU(), cpu, runtime.Version())
}

func progress(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "overload: %s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "overload:", err)
	return 1
}
