package persistence

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/goroutine"
	"github.com/holdfast/holdfast/internal/pipehook"
)

// waitParked waits until p's committer is parked with nothing to do.
func waitParked(t *testing.T, p *Pipeline) {
	t.Helper()
	waitFor(t, "the committer to park", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.idle && len(p.queue) == 0
	})
}

// commitGoroutines records the goroutine of every commit.
type commitGoroutines struct {
	mu  sync.Mutex
	ids []int64
}

func (c *commitGoroutines) hook(int) {
	c.mu.Lock()
	c.ids = append(c.ids, goroutine.ID())
	c.mu.Unlock()
}

func (c *commitGoroutines) get() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.ids...)
}

func TestPipeline_AQueuedWriteWaitsForAKick(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	var commits commitGoroutines
	p := startPipeline(t, db, PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: commits.hook}})
	waitParked(t, p)
	tk := p.Queue(set("k", "v"))
	time.Sleep(50 * time.Millisecond)
	if tk.Done() || len(commits.get()) != 0 {
		t.Fatal("a queued write was committed before anyone kicked the committer")
	}
	me := goroutine.ID()
	p.Kick()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tk.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := commits.get(); len(ids) != 1 || ids[0] == me {
		t.Fatalf("commits on goroutines %v; want one, on the committer's (not %d)", ids, me)
	}
}

func TestPipeline_HelpCommitsOnTheCallersGoroutineWhenTheCommitterIsParked(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir)
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	var commits commitGoroutines
	p := startPipeline(t, db, PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: commits.hook}})
	me := goroutine.ID()
	for i := 0; i < 20; i++ {
		waitParked(t, p)
		tk := p.Queue(set(fmt.Sprint("k", i), "v"))
		p.Help()
		// Help returned: the write is durable, without waiting for anyone.
		if !tk.Done() || tk.Err() != nil {
			t.Fatalf("write %d: done %v, err %v right after Help", i, tk.Done(), tk.Err())
		}
		waitApplied(t, tk)
	}
	ids := commits.get()
	if len(ids) != 20 {
		t.Fatalf("%d commits, want 20", len(ids))
	}
	for i, id := range ids {
		if id != me {
			t.Fatalf("commit %d ran on goroutine %d, not the helper's %d", i, id, me)
		}
	}
	for i := 0; i < 20; i++ {
		if v, ok, err := db.Get(context.Background(), []byte(fmt.Sprint("k", i))); err != nil || !ok || string(v) != "v" {
			t.Fatalf("k%d = %q %v %v", i, v, ok, err)
		}
	}
	db = reopen(t, p, db, Config{Dir: dir})
	if v, ok, err := db.Get(context.Background(), []byte("k19")); err != nil || !ok || string(v) != "v" {
		t.Fatalf("after reopen k19 = %q %v %v", v, ok, err)
	}
}

func TestPipeline_HelpLeavesABusyCommitterItsWork(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseCommitter := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseCommitter() // before the pipeline's Close, on every path
	var first atomic.Bool
	p := startPipeline(t, db, PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: func(int) {
		if first.CompareAndSwap(false, true) {
			entered <- struct{}{}
			<-release
		}
	}}})
	// Completions in the order their callbacks ran. Wait can return before a
	// ticket's callbacks have run, so the order is read from here.
	completed := make(chan string, 2)
	track := func(name string, tk *Ticket) *Ticket {
		tk.OnDone(func(error) { completed <- name })
		return tk
	}
	t1 := track("first", p.Submit(set("a", "1")))
	<-entered // the committer holds the first write
	t2 := track("second", p.Queue(set("b", "2")))
	helped := make(chan struct{})
	go func() {
		p.Help() // must not wait for the busy committer, nor commit around it
		close(helped)
	}()
	select {
	case <-helped:
	case <-time.After(5 * time.Second):
		releaseCommitter()
		t.Fatal("Help waited for a busy committer")
	}
	if t2.Done() {
		t.Fatal("the second write completed while the first was still being committed")
	}
	releaseCommitter()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tk := range []*Ticket{t1, t2} {
		if err := tk.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var order []string
	for range 2 {
		select {
		case name := <-completed:
			order = append(order, name)
		case <-ctx.Done():
			t.Fatalf("completion callbacks so far: %v", order)
		}
	}
	if fmt.Sprint(order) != "[first second]" {
		t.Fatalf("completion order %v", order)
	}
}

// Writers queue and help, or submit, at random while the committer runs: each
// writer's writes must complete in the order it queued them, and all be there.
func TestPipeline_HelpersAndTheCommitterKeepTheQueuesOrder(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	p := startPipeline(t, db, PipelineConfig{})
	const writers, each = 8, 400
	var mu sync.Mutex
	done := make([][]int, writers)
	var wg sync.WaitGroup
	var last [writers]*Ticket
	for g := 0; g < writers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := 0; i < each; i++ {
				w := set(fmt.Sprintf("g%d-%d", g, i), strconv.Itoa(i))
				var tk *Ticket
				switch rng.IntN(3) {
				case 0:
					tk = p.Submit(w)
				case 1:
					tk = p.Queue(w)
					p.Help()
				default:
					tk = p.Queue(w)
					p.Kick()
				}
				tk.OnDone(func(err error) {
					if err != nil {
						t.Errorf("g%d-%d: %v", g, i, err)
					}
					mu.Lock()
					done[g] = append(done[g], i)
					mu.Unlock()
				})
				last[g] = tk
				if rng.IntN(16) == 0 {
					waitApplied(t, tk)
				}
			}
		}(g)
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for g := range last {
		if err := last[g].Wait(ctx); err != nil {
			t.Fatal(err)
		}
		waitApplied(t, last[g])
	}
	// Wait can return before a ticket's callbacks have run.
	waitFor(t, "every completion callback", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, seq := range done {
			n += len(seq)
		}
		return n == writers*each
	})
	mu.Lock()
	defer mu.Unlock()
	for g, seq := range done {
		if len(seq) != each {
			t.Fatalf("writer %d: %d of %d writes completed", g, len(seq), each)
		}
		for i, v := range seq {
			if v != i {
				t.Fatalf("writer %d: completion %d was write %d", g, i, v)
			}
		}
	}
	for g := 0; g < writers; g++ {
		for i := 0; i < each; i++ {
			v, ok, err := db.Get(context.Background(), []byte(fmt.Sprintf("g%d-%d", g, i)))
			if err != nil || !ok || string(v) != strconv.Itoa(i) {
				t.Fatalf("g%d-%d = %q %v %v", g, i, v, ok, err)
			}
		}
	}
}

func TestPipeline_KickStaleWakesTheCommitterOnlyForOldWrites(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	p := startPipeline(t, db, PipelineConfig{})
	if p.KickStale(0) {
		t.Fatal("KickStale found work in an empty queue")
	}
	waitParked(t, p)
	tk := p.Queue(set("k", "v"))
	if p.KickStale(time.Hour) || tk.Done() {
		t.Fatal("KickStale woke the committer for a fresh write")
	}
	time.Sleep(20 * time.Millisecond)
	if !p.KickStale(10 * time.Millisecond) {
		t.Fatal("KickStale left a write that waited 20 ms")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tk.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}
