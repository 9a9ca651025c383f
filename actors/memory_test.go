package actors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

// fakeHeap stands in for the Go heap: the test sets what the governor reads,
// and drives it with memTick instead of its ticker.
type fakeHeap struct {
	live, cycles atomic.Uint64
	gcs          atomic.Int64
	// onGC, if set, runs on a forced GC (it may lower live).
	onGC func()
}

func (f *fakeHeap) install(h *Host) {
	h.mem.sample = func() heapSample { return heapSample{live: f.live.Load(), cycles: f.cycles.Load()} }
	h.mem.gc = func() {
		f.gcs.Add(1)
		if f.onGC != nil {
			f.onGC()
		}
		f.cycles.Add(1)
	}
	h.mem.every = time.Hour // the test ticks
}

// startMemNode is startNode with setup run on the host before Start.
func startMemNode(t *testing.T, o nodeOpts, setup func(h *Host)) *testNode {
	t.Helper()
	o.setup = setup
	return startNode(t, t.TempDir(), o)
}

func (n *testNode) active(typ, key string) bool {
	id := ObjectID{App: "app_t", Type: typ, Key: key}
	s := n.host.shard(id)
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[id] != nil
}

// pct is p percent of the budget, as the governor counts it.
func (n *testNode) pct(p int64) uint64 { return uint64(n.host.mem.budget / 100 * p) }

func wantOverBudget(t *testing.T, what string, err error) {
	t.Helper()
	var e *Error
	if !errors.Is(err, ErrOverBudget) || !errors.Is(err, ErrUnavailable) || !errors.As(err, &e) || e.RetryAfter <= 0 {
		t.Fatalf("%s: %v, want the over-budget refusal (unavailable, with a retry time)", what, err)
	}
}

func TestHost_MemoryPassivatesLeastRecentlyUsed(t *testing.T) {
	heap := &fakeHeap{}
	n := startMemNode(t, nodeOpts{}, func(h *Host) {
		heap.install(h)
		h.mem.budget = 4 << 20 // a test knob: below MinMemoryBudget
	})
	ctx := context.Background()
	big := strings.Repeat("x", 100<<10)
	for i := 0; i < 10; i++ {
		if _, err := n.kv("m", fmt.Sprint(i)).Set(ctx, "v", big); err != nil {
			t.Fatal(err)
		}
	}
	// An object with a subscriber is never passivated, however old.
	subscribe(t, n, n.kv("m", "sub"), &recorder{}, nil)
	n.pipe.WaitApplied(context.Background()) // an object passivates once Badger shows its writes
	// Used last to first: 9 is the least recently used, then 8...
	for i := 9; i >= 0; i-- {
		if _, err := n.kv("m", fmt.Sprint(i)).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	est := int64(len(`"`+big+`"`)+1) + activationBytes
	// Over 60%, by what three and a half objects hold over 55%: four go.
	heap.live.Store(n.pct(memShedTo) + uint64(est*7/2))
	if heap.live.Load() < n.pct(memShedAt) {
		t.Fatalf("test set-up: %d is under the shedding threshold %d", heap.live.Load(), n.pct(memShedAt))
	}
	// The ticks are all at t0, just after a GC cycle ended: none forces one.
	t0 := time.Now()
	heap.cycles.Add(1)
	n.host.memTick(t0)
	waitFor(t, "four objects to passivate", func() bool { return n.host.Active() == 7 })
	for i := 0; i < 10; i++ {
		if got, want := n.active("m", fmt.Sprint(i)), i < 6; got != want {
			t.Errorf("object %d active: %v, want %v (the four least recently used go)", i, got, want)
		}
	}
	if !n.active("m", "sub") {
		t.Error("the subscribed object was passivated")
	}
	if st := n.host.MemoryStats(); st.Passivated != 4 || st.State != "shedding" {
		t.Fatalf("stats %+v, want 4 passivated, shedding", st)
	}
	// Until a GC cycle ends the sample cannot show what went: no second round.
	n.host.memTick(t0)
	if st := n.host.MemoryStats(); st.Passivated != 4 || n.host.Active() != 7 {
		t.Fatalf("a second round before a GC: %+v, %d active", st, n.host.Active())
	}
	heap.cycles.Add(1)
	n.host.memTick(t0)
	waitFor(t, "four more objects to passivate", func() bool { return n.host.Active() == 3 })
	// Passivated objects reactivate from disk with their data.
	for i := 0; i < 10; i++ {
		v, err := n.kv("m", fmt.Sprint(i)).GetSlot(ctx, "v")
		var s string
		if err != nil || json.Unmarshal(v, &s) != nil || s != big {
			t.Fatalf("object %d after passivation: %d bytes, %v", i, len(v), err)
		}
	}
}

func TestHost_MemoryRefusesNewActivationsAndWritesThenRecovers(t *testing.T) {
	heap := &fakeHeap{}
	n := startMemNode(t, nodeOpts{cfg: Config{MemoryBudget: 64 << 20}}, func(h *Host) { heap.install(h) })
	ctx := context.Background()
	// Fillers used before the hot object: passivating them is enough, so the
	// hot one stays active.
	filler := strings.Repeat("f", 1<<20-2)
	for i := 0; i < 20; i++ {
		if _, err := n.kv("fill", fmt.Sprint(i)).Set(ctx, "v", filler); err != nil {
			t.Fatal(err)
		}
	}
	hot := n.kv("hot", "a")
	if _, err := hot.Set(ctx, "n", 1); err != nil {
		t.Fatal(err)
	}
	n.pipe.WaitApplied(context.Background())
	if _, err := hot.Get(ctx); err != nil { // the most recently used
		t.Fatal(err)
	}

	// The ticks are all at t0, each just after a GC cycle ended: none forces one.
	t0 := time.Now()
	heap.live.Store(n.pct(80))
	heap.cycles.Add(1)
	n.host.memTick(t0)
	if st := n.host.MemoryStats(); st.State != "refusing" {
		t.Fatalf("at 80%%: %+v, want refusing", st)
	}
	waitFor(t, "fillers to passivate", func() bool { return n.host.MemoryStats().Passivated > 0 })
	if !n.active("hot", "a") {
		t.Fatal("the most recently used object was passivated, though the fillers were enough")
	}
	_, err := hot.Set(ctx, "n", 2)
	wantOverBudget(t, "a write to an active object", err)
	_, err = n.kv("new", "b").Get(ctx)
	wantOverBudget(t, "a read that activates an object", err)
	_, err = NewLog(n.host, hot.ID()).Append(ctx, LogInput{Body: json.RawMessage(`1`)})
	wantOverBudget(t, "a log append", err)
	_, err = NewQueue(n.host, hot.ID()).Enqueue(ctx, QueueMessageIn{Payload: json.RawMessage(`1`)})
	wantOverBudget(t, "an enqueue", err)
	// Reads of active objects, and writes that only remove, are served.
	if st, err := hot.Get(ctx); err != nil || string(st.State["n"]) != "1" {
		t.Fatalf("read of an active object: %+v %v", st, err)
	}
	if _, err := hot.Delete(ctx, "gone"); err != nil {
		t.Fatalf("a delete: %v", err)
	}
	if st := n.host.MemoryStats(); st.Refused != 4 {
		t.Fatalf("refused %d, want 4", st.Refused)
	}

	// Hysteresis: still refusing at 70%, under 65% no longer.
	heap.live.Store(n.pct(70))
	heap.cycles.Add(1)
	n.host.memTick(t0)
	_, err = hot.Set(ctx, "n", 2)
	wantOverBudget(t, "a write at 70% after refusing", err)
	heap.live.Store(n.pct(62))
	heap.cycles.Add(1)
	n.host.memTick(t0)
	if st := n.host.MemoryStats(); st.State != "shedding" {
		t.Fatalf("at 62%%: %+v, want shedding", st)
	}
	if _, err := hot.Set(ctx, "n", 2); err != nil {
		t.Fatalf("a write after recovery: %v", err)
	}
	if _, err := n.kv("new", "b").Set(ctx, "n", 1); err != nil {
		t.Fatalf("a new activation after recovery: %v", err)
	}
	heap.live.Store(n.pct(50))
	heap.cycles.Add(1)
	n.host.memTick(t0)
	if st := n.host.MemoryStats(); st.State != "normal" {
		t.Fatalf("at 50%%: %+v, want normal", st)
	}
}

func TestHost_MemoryForcesAGCWhileRefusing(t *testing.T) {
	heap := &fakeHeap{}
	n := startMemNode(t, nodeOpts{cfg: Config{MemoryBudget: 64 << 20}}, func(h *Host) { heap.install(h) })
	// A GC that frees nothing: the next forced one waits twice as long.
	t0 := time.Now()
	heap.live.Store(n.pct(90))
	heap.cycles.Add(1)
	n.host.memTick(t0)
	for _, c := range []struct {
		at  time.Duration
		gcs int64
	}{{memForceGC / 2, 0}, {memForceGC, 1}, {2 * memForceGC, 1}, {3 * memForceGC, 2}, {6 * memForceGC, 2}, {7 * memForceGC, 3}} {
		n.host.memTick(t0.Add(c.at))
		if heap.gcs.Load() != c.gcs {
			t.Fatalf("at %v: %d forced GCs, want %d", c.at, heap.gcs.Load(), c.gcs)
		}
	}
	heap.live.Store(n.pct(30))
	heap.cycles.Add(1)
	n.host.memTick(t0.Add(8 * memForceGC))
	if n.host.MemoryStats().State != "normal" {
		t.Fatalf("%+v, want normal", n.host.MemoryStats())
	}

	// A GC that frees memory ends the refusal at once.
	heap.onGC = func() { heap.live.Store(n.pct(30)) }
	heap.gcs.Store(0)
	t0 = t0.Add(time.Minute)
	heap.live.Store(n.pct(90))
	heap.cycles.Add(1) // a GC cycle ended just before t0
	n.host.memTick(t0)
	n.host.memTick(t0.Add(memForceGC / 2))
	if heap.gcs.Load() != 0 || n.host.MemoryStats().State != "refusing" {
		t.Fatalf("%d GCs, %+v: want refusing, no GC forced yet", heap.gcs.Load(), n.host.MemoryStats())
	}
	n.host.memTick(t0.Add(memForceGC))
	if heap.gcs.Load() != 1 || n.host.MemoryStats().State != "normal" {
		t.Fatalf("%d GCs, %+v: want one forced GC and normal", heap.gcs.Load(), n.host.MemoryStats())
	}
	// In the normal state nothing forces a GC.
	n.host.memTick(t0.Add(10 * memForceGC))
	if heap.gcs.Load() != 1 {
		t.Fatalf("%d GCs in the normal state", heap.gcs.Load())
	}
}

// The case, scaled down, on the real heap: writers put 1 MiB slots on
// new objects. Without the governor every object stays in memory until the
// idle timeout (a minute): the heap would grow past the budget.
func TestHost_MemoryBudgetBoundsTheRealHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a few hundred MiB")
	}
	var budget, baseline int64
	n := startMemNode(t, nodeOpts{db: persistence.Config{MemTableSize: 32 << 20}}, func(h *Host) {
		runtime.GC()
		baseline = int64(h.mem.sample().live)
		// The budget counts the whole heap: leave the node's own (Badger's
		// memtable) under the shedding threshold, and room for 128 MiB more.
		budget = 2*baseline + 128<<20
		h.mem.budget = budget
	})
	old := debug.SetMemoryLimit(budget / 100 * 85) // as holdfast serve does
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	objects := int((budget-baseline)>>20) + 32 // more than the budget holds
	t.Logf("baseline %d MiB, budget %d MiB, %d objects of 1 MiB", baseline>>20, budget>>20, objects)

	value := strings.Repeat("v", 1<<20-2) // 1 MiB as JSON
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	// retry runs f until it is not refused over the budget.
	retry := func(f func() error) error {
		for {
			err := f()
			if !errors.Is(err, ErrOverBudget) || time.Now().After(deadline) {
				return err
			}
			time.Sleep(20 * time.Millisecond) // a client backing off, not synchronisation
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(objects); i = next.Add(1) - 1 {
				if err := retry(func() error { _, err := n.kv("big", fmt.Sprint(i)).Set(ctx, "v", value); return err }); err != nil {
					errs <- fmt.Errorf("object %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	runtime.GC()
	buf := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(buf)
	live := int64(buf[0].Value.Uint64())
	st := n.host.MemoryStats()
	t.Logf("live heap %d MiB at the end, peak sample %d MiB; %d active, %+v", live>>20, n.host.mem.peak.Load()>>20, n.host.Active(), st)
	if live >= budget || n.host.mem.peak.Load() >= budget {
		t.Fatalf("live heap %d MiB at the end, %d MiB at its peak: over the budget of %d MiB", live>>20, n.host.mem.peak.Load()>>20, budget>>20)
	}
	if st.Passivated == 0 {
		t.Fatal("nothing was passivated")
	}
	for i := 0; i < objects; i++ {
		var v json.RawMessage
		err := retry(func() (err error) { v, err = n.kv("big", fmt.Sprint(i)).GetSlot(ctx, "v"); return err })
		if err != nil || len(v) != len(value)+2 {
			t.Fatalf("object %d: %d bytes, %v", i, len(v), err)
		}
	}
}

func TestDefaultMemoryBudget_MachineOrCgroup(t *testing.T) {
	const meminfo = "MemTotal:       16384000 kB\nMemFree:         1000 kB\n"
	machine := int64(16384000) << 10
	for _, c := range []struct {
		name  string
		files map[string]string
		want  int64
	}{
		{"machine only", map[string]string{"/proc/meminfo": meminfo}, machine / 2},
		{"v2 no limit", map[string]string{"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory.max": "max\n"}, machine / 2},
		{"v2 container", map[string]string{"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory.max": "2147483648\n"}, 1 << 30},
		{"v2 own cgroup and a lower ancestor", map[string]string{"/proc/meminfo": meminfo,
			"/proc/self/cgroup": "0::/system.slice/holdfast.service\n",
			"/sys/fs/cgroup/system.slice/holdfast.service/memory.max": "max\n",
			"/sys/fs/cgroup/system.slice/memory.max":                  "4294967296\n"}, 2 << 30},
		{"v1 unlimited", map[string]string{"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, machine / 2},
		{"v1 limit", map[string]string{"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory/memory.limit_in_bytes": "1073741824\n"}, 512 << 20},
		{"tiny container", map[string]string{"/sys/fs/cgroup/memory.max": "16777216"}, MinMemoryBudget},
		{"nothing readable", nil, fallbackMemoryBudget},
	} {
		read := func(p string) ([]byte, error) {
			if v, ok := c.files[p]; ok {
				return []byte(v), nil
			}
			return nil, errors.New("no such file")
		}
		if got := defaultMemoryBudget(read); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
	if b := DefaultMemoryBudget(); b < MinMemoryBudget {
		t.Errorf("this machine's default budget %d is below the minimum", b)
	}
}

func TestConfig_ValidateMemoryBudget(t *testing.T) {
	for _, b := range []int64{0, MinMemoryBudget, 8 << 30} {
		if err := (&Config{MemoryBudget: b}).Validate(); err != nil {
			t.Errorf("budget %d: %v", b, err)
		}
	}
	for _, b := range []int64{-1, 512, MinMemoryBudget - 1} {
		if err := (&Config{MemoryBudget: b}).Validate(); err == nil {
			t.Errorf("budget %d accepted", b)
		}
	}
}
