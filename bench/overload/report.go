package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// groupStats is one group's replies over one phase.
type groupStats struct {
	Name       string
	Writers    int
	Duration   time.Duration
	Writes     int
	Acked      int
	Refused    int
	Other      int
	WithMs     int         // refusals with retryAfterMs in the body
	WithHeader int         // refusals with a Retry-After header
	Statuses   map[int]int // of the replies that were not 2xx (0: no reply)
	Admitted   latencies   // of the acknowledged writes
	Refusals   latencies   // of the refused ones
	AckedBytes int64       // large values acknowledged
}

func groupOf(name string, writers int, d time.Duration, logs []*writerLog) groupStats {
	g := groupStats{Name: name, Writers: writers, Duration: d, Statuses: map[int]int{}}
	var ok, ref []time.Duration
	for _, w := range logs {
		for _, r := range w.replies {
			g.Writes++
			switch r.Class {
			case acked:
				g.Acked++
				ok = append(ok, r.Latency)
				continue
			case refused:
				g.Refused++
				ref = append(ref, r.Latency)
				if r.HasMs {
					g.WithMs++
				}
				if r.HasHeader {
					g.WithHeader++
				}
			default:
				g.Other++
			}
			g.Statuses[r.Status]++
		}
		for _, b := range w.big {
			g.AckedBytes += int64(b.N)
		}
	}
	g.Admitted, g.Refusals = summarize(ok), summarize(ref)
	return g
}

// memMax is the highest of each figure over the samples in [from, to).
type memMax struct {
	Samples                           int
	VmRSS, RssAnon, RssFile, RssShmem int64
	Live, HeapInuse, Active           float64
}

func memOver(ss []sample, from, to time.Duration) memMax {
	var m memMax
	for _, s := range ss {
		if s.At < from || s.At >= to {
			continue
		}
		m.Samples++
		m.VmRSS, m.RssAnon, m.RssFile, m.RssShmem = max(m.VmRSS, s.VmRSS), max(m.RssAnon, s.RssAnon), max(m.RssFile, s.RssFile), max(m.RssShmem, s.RssShmem)
		m.Live, m.HeapInuse, m.Active = max(m.Live, s.Live), max(m.HeapInuse, s.HeapInuse), max(m.Active, s.Active)
	}
	return m
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func mibf(b float64) string {
	if b < 0 {
		return "n/a"
	}
	return mib(int64(b))
}

func ms(d time.Duration) string {
	switch {
	case d == 0:
		return "–"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	case d < 10*time.Second:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func pct(n, of int) string {
	if of == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

func statuses(m map[int]int) string {
	if len(m) == 0 {
		return "–"
	}
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		name := fmt.Sprint(k)
		if k == 0 {
			name = "no reply"
		}
		parts = append(parts, fmt.Sprintf("%s: %d", name, m[k]))
	}
	return strings.Join(parts, ", ")
}

// phaseReport is one phase of load.
type phaseReport struct {
	Name     string
	From, To time.Duration // since the run started
	Groups   []groupStats
	Mem      memMax
}

// bucket is a slice of the overload phase's timeline.
type bucket struct {
	From                   time.Duration
	BigAcked, BigRefused   int
	BaseAcked, BaseRefused int
	BaseP99                time.Duration
	RssAnon, RssFile       int64
	Live                   float64
}

func timeline(from, to, step time.Duration, base, big []*writerLog, ss []sample) []bucket {
	if step <= 0 || to <= from {
		return nil
	}
	// The last bucket takes the remainder (a phase runs a little over its
	// duration), so that no bucket is nearly empty.
	n := max(1, int((to-from)/step))
	bs := make([]bucket, n)
	lat := make([][]time.Duration, n)
	idx := func(at time.Duration) int {
		if at < from || at >= to {
			return -1
		}
		return min(n-1, int((at-from)/step))
	}
	for i := range bs {
		bs[i].From = time.Duration(i) * step
	}
	for _, w := range base {
		for _, r := range w.replies {
			if i := idx(r.At); i >= 0 {
				switch r.Class {
				case acked:
					bs[i].BaseAcked++
					lat[i] = append(lat[i], r.Latency)
				case refused:
					bs[i].BaseRefused++
				}
			}
		}
	}
	for _, w := range big {
		for _, r := range w.replies {
			if i := idx(r.At); i >= 0 {
				switch r.Class {
				case acked:
					bs[i].BigAcked++
				case refused:
					bs[i].BigRefused++
				}
			}
		}
	}
	for i := range bs {
		bs[i].BaseP99 = summarize(lat[i]).P99
		end := from + bs[i].From + step
		if i == n-1 {
			end = to
		}
		m := memOver(ss, from+bs[i].From, end)
		bs[i].RssAnon, bs[i].RssFile, bs[i].Live = m.RssAnon, m.RssFile, m.Live
	}
	return bs
}

// runReport is everything the Markdown report says.
type runReport struct {
	Command, Date, Machine string
	Budget                 int64
	Writers, BaseWriters   int
	Objects                int
	MinLen, MaxLen         int
	Phases                 []phaseReport
	Timeline               []bucket
	Step                   time.Duration
	Verify, VerifyRestart  verifyResult
	VerifyMem, RestartMem  memMax
	StopTook, StartTook    time.Duration
	// After the load: how long until the node served a new activation.
	Recovery              time.Duration
	Recovered             bool
	RecoveryRefusals      int
	StopErr               error
	ProcErrs              int // /proc/<pid>/status reads that failed
	ScrapeErrs            int // GET /metrics that failed (a 5 s timeout included)
	Warnings, RefusalLogs int
	Scrape                time.Duration
	FinalMetrics          map[string]float64
}

// verdicts are the requirements, each true when it held. lostOK
// needs every acknowledged write read back, before and after the restart: a
// write that could not be read is not shown to be kept.
func (r *runReport) verdicts() (rssOK, retryOK, lostOK bool) {
	rssOK = true
	refusals, withMs := 0, 0
	for _, p := range r.Phases {
		if p.Mem.RssAnon > r.Budget {
			rssOK = false
		}
		for _, g := range p.Groups {
			refusals += g.Refused
			withMs += g.WithMs
		}
	}
	retryOK = refusals == withMs
	lostOK = len(r.Verify.Problems)+len(r.VerifyRestart.Problems)+len(r.Verify.Unreadable)+len(r.VerifyRestart.Unreadable) == 0
	return rssOK, retryOK, lostOK
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "**NO**"
}

func (r *runReport) write(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("## Overload (issue 25)\n\n")
	p("`%s`, %s, on %s.\n\n", r.Command, r.Date, r.Machine)
	p("A `holdfast serve` process with `HOLDFAST_MEMORY_BUDGET=%d` (%s); %d baseline writers each\n", r.Budget, mib(r.Budget), r.BaseWriters)
	p("incrementing a random one of %d counters (`POST .../counter/c{n}/n/increment`), and %d overload\n", r.Objects, r.Writers)
	p("writers each putting a %d-%d byte value on a new object (`PUT .../big/{fresh key}/v`). Each writer\n", r.MinLen, r.MaxLen)
	p("has one request in flight, sleeps a refusal's `retryAfterMs` and then writes a new key.\n\n")

	p("| phase | group | writers | writes | acked | refused (503/429) | other | acked/s | admitted p50 | p99 | max | refusals: statuses |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, ph := range r.Phases {
		for _, g := range ph.Groups {
			rate := float64(g.Acked) / g.Duration.Seconds()
			extra := ""
			if g.AckedBytes > 0 {
				extra = fmt.Sprintf(" (%.0f MiB/s)", float64(g.AckedBytes)/(1<<20)/g.Duration.Seconds())
			}
			p("| %s (%.0f s) | %s | %d | %d | %d | %d (%s) | %d | %.0f%s | %s | %s | %s | %s |\n",
				ph.Name, g.Duration.Seconds(), g.Name, g.Writers, g.Writes, g.Acked, g.Refused, pct(g.Refused, g.Writes), g.Other,
				rate, extra, ms(g.Admitted.P50), ms(g.Admitted.P99), ms(g.Admitted.Max), statuses(g.Statuses))
		}
	}
	p("\nRefusals:")
	for _, ph := range r.Phases {
		for _, g := range ph.Groups {
			if g.Refused == 0 {
				continue
			}
			p(" %s/%s %d, %s with `retryAfterMs` and %s with `Retry-After` (refusal latency p50 %s, p99 %s);",
				ph.Name, g.Name, g.Refused, pct(g.WithMs, g.Refused), pct(g.WithHeader, g.Refused), ms(g.Refusals.P50), ms(g.Refusals.P99))
		}
	}
	p("\n\n")

	p("Memory of the server process, the highest of the samples (every 250 ms from `/proc/<pid>/status`;\n")
	p("the live heap and heap in use from `GET /metrics` every %.0f s). The budget bounds the Go heap\n", r.Scrape.Seconds())
	p("(the governor reads the live heap); `RssFile` is file-backed pages, mostly Badger's memory-mapped\n")
	p("tables and value log, which the kernel can drop and which the budget does not count.\n\n")
	p("| phase | samples | VmRSS | RssAnon | RssFile | live heap | heap in use | active objects | budget |\n")
	p("|---|---|---|---|---|---|---|---|---|\n")
	row := func(name string, m memMax) {
		p("| %s | %d | %s | %s | %s | %s | %s | %.0f | %s |\n", name, m.Samples, mib(m.VmRSS), mib(m.RssAnon), mib(m.RssFile), mibf(m.Live), mibf(m.HeapInuse), m.Active, mib(r.Budget))
	}
	for _, ph := range r.Phases {
		row(ph.Name, ph.Mem)
	}
	row("read-back", r.VerifyMem)
	row("read-back after restart", r.RestartMem)
	p("\n")

	if r.Recovered {
		p("After the load stopped, the node served a new activation (`GET` of a new object) after %.1f s (%d probes refused before).\n\n", r.Recovery.Seconds(), r.RecoveryRefusals)
	} else {
		p("After the load stopped, the node **still refused new activations %.0f s later** (%d probes, every 500 ms, all refused).\n\n", r.Recovery.Seconds(), r.RecoveryRefusals)
	}
	p("Read-back of every acknowledged write (counters: at least the acknowledged increments, at\n")
	p("most those plus the ones of unknown outcome; large values: byte for byte):\n\n")
	p("| when | counters | large values | lost or wrong | unreadable | reads refused and retried | took |\n|---|---|---|---|---|---|---|\n")
	for _, v := range []struct {
		name string
		v    verifyResult
	}{{"after the load", r.Verify}, {"after SIGTERM and restart", r.VerifyRestart}} {
		p("| %s | %d | %d | %d | %d | %d | %.1f s |\n", v.name, v.v.Counters, v.v.Slots, len(v.v.Problems), len(v.v.Unreadable), v.v.Refusals, v.v.Took.Seconds())
	}
	stopNote := ""
	if r.StopErr != nil {
		stopNote = fmt.Sprintf(" (%v)", r.StopErr)
	}
	p("\nSIGTERM to exit: %.1f s%s; restart to listening: %.1f s. Server log: %d lines at WARN or ERROR, and %d `request failed` lines at ERROR, one per refusal.\n",
		r.StopTook.Seconds(), stopNote, r.StartTook.Seconds(), r.Warnings, r.RefusalLogs)
	if len(r.FinalMetrics) > 0 {
		p("At the end of the load: `holdfast_memory_refusals_total` %.0f, `holdfast_memory_passivations_total` %.0f.\n",
			r.FinalMetrics["holdfast_memory_refusals_total"], r.FinalMetrics["holdfast_memory_passivations_total"])
	}
	for _, l := range append(append([]string(nil), firstN(r.Verify.Problems, 10)...), firstN(r.VerifyRestart.Problems, 10)...) {
		p("- %s\n", l)
	}
	for _, l := range append(append([]string(nil), firstN(r.Verify.Unreadable, 5)...), firstN(r.VerifyRestart.Unreadable, 5)...) {
		p("- unreadable: %s\n", l)
	}
	p("\n")

	if len(r.Timeline) > 0 {
		p("The overload phase every %.0f s (writes by the time they were sent; memory the highest sample):\n\n", r.Step.Seconds())
		p("| t | large acked | large refused | baseline acked | baseline refused | baseline p99 | RssAnon | RssFile | live heap |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, b := range r.Timeline {
			p("| %.0f s | %d | %d | %d | %d | %s | %s | %s | %s |\n", b.From.Seconds(), b.BigAcked, b.BigRefused, b.BaseAcked, b.BaseRefused, ms(b.BaseP99), mib(b.RssAnon), mib(b.RssFile), mibf(b.Live))
		}
		p("\n")
	}

	rssOK, retryOK, lostOK := r.verdicts()
	p("What the issue asks: RssAnon under the budget in every phase: %s; every refusal with `retryAfterMs`: %s;\n", yes(rssOK), yes(retryOK))
	unread := len(r.Verify.Unreadable) + len(r.VerifyRestart.Unreadable)
	switch lost := len(r.Verify.Problems) + len(r.VerifyRestart.Problems); {
	case lost == 0 && unread > 0:
		p("no acknowledged write lost (before and after the restart): **not shown**: no write was lost or wrong, but %d reads got no answer.\n", unread)
	default:
		p("no acknowledged write lost (before and after the restart): %s.\n", yes(lostOK))
	}
	if r.ProcErrs > 0 || r.ScrapeErrs > 0 {
		p("(%d reads of /proc/<pid>/status and %d scrapes of /metrics failed.)\n", r.ProcErrs, r.ScrapeErrs)
	}
}

func firstN(s []string, n int) []string { return s[:min(n, len(s))] }
