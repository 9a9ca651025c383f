package actors

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync/atomic"
	"time"
)

// The node's memory budget (Config.MemoryBudget). One governor per Host samples
// the Go heap and acts on the share of the budget that live objects take:
//
//   - from memShedAt (60%) it passivates the least recently used idle objects,
//     as many as it estimates will bring the heap down to memShedTo (55%);
//   - from memRefuseAt (75%) it also refuses new activations and writes that add
//     data (ErrOverBudget: 503 with a retry time), until the heap is back under
//     memResumeAt (65%). Reads of active objects are still served.
//
// The bands between the thresholds are the hysteresis: a node just under a
// threshold does not flip on every sample. They leave room above them for what
// arrives between a sample and the refusal (writes in flight, their buffers in
// the commit pipeline) and for the garbage that the GC has not collected yet:
// `holdfast serve` sets the Go runtime's memory limit to 85% of the budget
// (debug.SetMemoryLimit), so that the GC works harder well before the budget.
const (
	memShedAt    = 60 // percent of the budget: passivate LRU idle objects
	memShedTo    = 55 // percent: how far one round of passivation aims
	memRefuseAt  = 75 // percent: refuse new activations and writes
	memResumeAt  = 65 // percent: stop refusing below this
	memNormalAt  = 55 // percent: the state goes back to normal below this
	memRetryWait = 500 * time.Millisecond

	// memEvery is how often the governor samples the heap. Reading two
	// runtime/metrics values costs about a microsecond, so the sampling itself
	// is free at this rate; what bounds the interval is how much can arrive
	// between two samples: at disk speed (a few hundred MB/s of large writes)
	// 100 ms is tens of MB, well inside the 25% between memShedAt and the
	// memory limit for any budget of a few hundred MB or more. Shorter would
	// not help: the live heap is only measured at the end of a GC cycle.
	memEvery = 100 * time.Millisecond
	// memForceGC is how long the governor waits for a GC cycle to show the
	// effect of a passivation round, or while it refuses requests, before it
	// runs one itself: an idle node may not collect for two minutes, and
	// requests would be refused all that time for memory already released.
	// While a forced GC does not end the refusal (the heap is full of what no
	// passivation frees), the wait doubles up to memForceGCMax, so that a node
	// stuck over its budget does not spend a core on collections.
	memForceGC    = time.Second
	memForceGCMax = 32 * time.Second
	// activationBytes is the estimated fixed cost of one activation (actor,
	// mailbox, object, routing entry; protoactor alone is about 1.9 KB).
	activationBytes = 4 << 10
)

// MinMemoryBudget is the smallest MemoryBudget accepted: a smaller one is
// most likely a unit mistake (MiB meant, bytes written).
const MinMemoryBudget = 32 << 20

// fallbackMemoryBudget is the budget when the machine's memory cannot be read.
const fallbackMemoryBudget = 1 << 30

// CodeOverBudget marks the unavailable error of a node over its memory budget.
const CodeOverBudget = "memory_budget"

// ErrOverBudget matches (errors.Is) the refusal of a node over its memory
// budget. It is also an ErrUnavailable: the gateway answers 503 with
// retryAfterMs.
var ErrOverBudget = &Error{Kind: KindUnavailable, Code: CodeOverBudget, Msg: "over the memory budget"}

func errOverBudget() error {
	return &Error{Kind: KindUnavailable, Code: CodeOverBudget, RetryAfter: memRetryWait,
		Msg: "the node is over its memory budget; retry later"}
}

// Validate checks the configuration; cluster.Start calls it before it opens
// anything, NewHost falls back to defaults for what it refuses.
func (c *Config) Validate() error {
	if c.MemoryBudget != 0 && c.MemoryBudget < MinMemoryBudget {
		return fmt.Errorf("actors: memory budget %d bytes is below the minimum %d (32 MiB); 0 means half of the machine's memory", c.MemoryBudget, MinMemoryBudget)
	}
	return nil
}

// memState is the governor's state.
type memState int32

const (
	memNormal   memState = iota
	memShedding          // over memShedAt: idle objects are passivated
	memRefusing          // over memRefuseAt: new activations and writes are refused
)

func (s memState) String() string {
	return [...]string{"normal", "shedding", "refusing"}[s]
}

// heapSample is one reading of the Go heap.
type heapSample struct {
	live   uint64 // bytes of the heap marked live by the last GC cycle
	cycles uint64 // GC cycles completed so far
}

// readHeap reads the heap through runtime/metrics. It uses the live heap of
// the last GC, not the heap in use now: that one includes the garbage that
// the GC (paced by GOGC and the memory limit) will collect anyway, and would
// make the governor shed objects to make room for garbage.
func readHeap(buf []metrics.Sample) heapSample {
	metrics.Read(buf)
	var s heapSample
	if buf[0].Value.Kind() == metrics.KindUint64 {
		s.live = buf[0].Value.Uint64()
	}
	if buf[1].Value.Kind() == metrics.KindUint64 {
		s.cycles = buf[1].Value.Uint64()
	}
	return s
}

// memGovernor holds the budget and the state the request path reads. Its
// other fields belong to the governor's goroutine (govern), or to a test that
// calls tick itself instead.
type memGovernor struct {
	budget int64
	state  atomic.Int32 // a memState; read on the request path

	live       atomic.Int64 // the last sample (metrics)
	peak       atomic.Int64 // the largest sample since Start (tests)
	passivated atomic.Int64 // activations passivated to free memory
	refused    atomic.Int64 // requests refused over the budget

	// Test knobs, set before Start.
	sample func() heapSample // reads the heap
	gc     func()            // runs a GC cycle
	every  time.Duration     // the sampling interval

	lastCycles  uint64
	lastGC      time.Time     // when a GC cycle was last seen to complete
	shedPending bool          // a passivation round waits for a GC to show its effect
	forceAfter  time.Duration // the wait for a GC before forcing one (memForceGC..memForceGCMax)
}

// MemoryStats is a snapshot of the memory governor.
type MemoryStats struct {
	Budget     int64  // bytes
	Live       int64  // the live heap at the last sample, bytes
	State      string // normal, shedding or refusing
	Passivated int64  // activations passivated to free memory, since start
	Refused    int64  // requests refused over the budget, since start
}

// MemoryStats returns the memory governor's counters.
func (h *Host) MemoryStats() MemoryStats {
	g := &h.mem
	return MemoryStats{Budget: g.budget, Live: g.live.Load(), State: memState(g.state.Load()).String(),
		Passivated: g.passivated.Load(), Refused: g.refused.Load()}
}

// initMemory resolves the budget and sets the governor's defaults (NewHost).
func (h *Host) initMemory() {
	g := &h.mem
	if err := h.cfg.Validate(); err != nil {
		h.log.Error("invalid memory budget; using the default", "err", err)
		h.cfg.MemoryBudget = 0
	}
	g.budget = h.cfg.MemoryBudget
	if g.budget == 0 {
		g.budget = DefaultMemoryBudget()
	}
	buf := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/cycles/total:gc-cycles"}}
	g.sample = func() heapSample { return readHeap(buf) }
	g.gc = runtime.GC
	g.every = memEvery
}

// startMemory takes a first sample, so that a node that starts over its budget
// refuses at once, and starts the governor (Start).
func (h *Host) startMemory() {
	h.memTick(time.Now())
	h.swept.Add(1)
	go h.govern()
}

// govern samples the heap every memEvery until the host closes.
func (h *Host) govern() {
	defer h.swept.Done()
	tick := time.NewTicker(h.mem.every)
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case now := <-tick.C:
			h.memTick(now)
		}
	}
}

// memTick takes one sample and acts on it.
func (h *Host) memTick(now time.Time) {
	g := &h.mem
	state := memState(g.state.Load())
	forced := false
	if (state == memRefusing || g.shedPending) && !g.lastGC.IsZero() && now.Sub(g.lastGC) >= max(g.forceAfter, memForceGC) {
		g.gc()
		forced = true
	}
	s := g.sample()
	if s.cycles != g.lastCycles || g.lastGC.IsZero() {
		g.lastCycles, g.lastGC, g.shedPending = s.cycles, now, false
	}
	live := int64(s.live)
	g.live.Store(live)
	if live > g.peak.Load() {
		g.peak.Store(live)
	}
	pct := func(p int64) int64 { return g.budget / 100 * p }
	next := state
	switch {
	case live >= pct(memRefuseAt):
		next = memRefusing
	case state == memRefusing && live >= pct(memResumeAt):
	case live >= pct(memShedAt):
		next = memShedding
	case state >= memShedding && live >= pct(memNormalAt):
		next = memShedding
	default:
		next = memNormal
	}
	switch {
	case next != memRefusing:
		g.forceAfter = memForceGC
	case forced:
		g.forceAfter = min(2*max(g.forceAfter, memForceGC), memForceGCMax)
	}
	if next != state {
		g.state.Store(int32(next))
		attrs := []any{"live_bytes", live, "budget_bytes", g.budget, "percent", live * 100 / g.budget}
		switch {
		case next == memRefusing:
			h.log.Warn("over 75% of the memory budget: refusing new activations and writes until under 65%", attrs...)
		case state == memRefusing:
			h.log.Info("back under 65% of the memory budget: accepting new activations and writes", attrs...)
		case next == memShedding:
			h.log.Info("over 60% of the memory budget: passivating least recently used objects", attrs...)
		default:
			h.log.Info("back under 55% of the memory budget", attrs...)
		}
	}
	// One round per GC cycle: until a cycle ends, the live heap does not show
	// what the last round released, and another round would shed too much.
	if live >= pct(memShedAt) && !g.shedPending {
		if h.shed(live-pct(memShedTo)) > 0 {
			g.shedPending = true
		}
	}
}

// shed asks the least recently used idle activations to passivate, as many as
// it estimates hold need bytes, and returns how many it asked. An activation
// that cannot go yet (a write not yet applied) stays; the next round may ask
// it again.
func (h *Host) shed(need int64) int {
	type cand struct {
		a    *activation
		used int64
	}
	var cands []cand
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.RLock()
		for _, a := range s.m {
			if a.inflight.Load() == 0 && a.subscribed.Load() == 0 {
				cands = append(cands, cand{a, a.lastUsed.Load()})
			}
		}
		s.mu.RUnlock()
	}
	slices.SortFunc(cands, func(x, y cand) int {
		switch {
		case x.used < y.used:
			return -1
		case x.used > y.used:
			return 1
		}
		return 0
	})
	n := 0
	var freed int64
	for _, c := range cands {
		if freed >= need {
			break
		}
		// Sent without a lock held: the object's turn may run right here.
		h.send(c.a, passivate{memory: true}, false)
		freed += c.a.bytes.Load() + activationBytes
		n++
	}
	return n
}

// refuses reports whether the request msg is refused over the budget, and
// counts it. Only messages that add data are: KV writes other than deletes,
// log appends, queue messages and alarms. Reads, acknowledgements, deletes,
// trims and user-defined messages (whose handler may or may not write) pass.
func (h *Host) refuses(msg any) bool {
	if memState(h.mem.state.Load()) != memRefusing || !addsData(msg) {
		return false
	}
	h.mem.refused.Add(1)
	return true
}

// refusesActivation reports whether a new activation is refused over the
// budget, and counts it.
func (h *Host) refusesActivation() bool {
	if memState(h.mem.state.Load()) != memRefusing {
		return false
	}
	h.mem.refused.Add(1)
	return true
}

func addsData(msg any) bool {
	switch m := msg.(type) {
	case *KVWrite:
		if m.Purge {
			return false
		}
		for _, op := range m.Ops {
			if op.Op != "delete" {
				return true
			}
		}
		return false
	case LogAppend, QueueEnqueue, AlarmSet:
		return true
	}
	return false
}

// noteBytes records the activation's resident state for the governor's
// estimates; called after each message in the object's turn.
func (o *object) noteBytes() {
	if o.kv != nil {
		o.act.bytes.Store(int64(o.kv.size))
	}
}

// RefusesWrites reports whether the node is over its memory budget and refuses
// writes that add data (and new activations) now: the gateway then answers a
// write with a body 503 before it reads the body, which would only add to the
// memory the node is short of.
func (h *Host) RefusesWrites() bool { return memState(h.mem.state.Load()) == memRefusing }
