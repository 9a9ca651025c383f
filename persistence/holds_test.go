package persistence

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPipeline_TheDiscardVersionNeverPassesALiveHold: Badger's discard version
// (below which compactions drop old versions and deletions) is set by the
// applier as it applies and by HoldVersions as a handoff takes and releases
// holds. Each set is checked against the holds that are live at that moment
// (taken and not yet released): none may be passed, while writes are applied
// all the time and holds come and go. An applier that sets the version
// without regard to the holds fails it (832 of 4,529 sets past a live hold,
// planted). The race the issue found (the applier set the version outside the
// holds' lock, from a hold it had read earlier, so a hold taken in between
// could be overridden) is too narrow to show here, 0 of 3 runs with the old
// order planted: the fix is structural, one owner under holdMu
// (updateDiscardLocked).
func TestPipeline_TheDiscardVersionNeverPassesALiveHold(t *testing.T) {
	var mu sync.Mutex
	live := map[int]uint64{}
	var sets, violations atomic.Int64
	var first string
	testOnSetDiscard = func(v uint64) {
		mu.Lock()
		defer mu.Unlock()
		sets.Add(1)
		for id, h := range live {
			if v > h {
				if violations.Add(1) == 1 {
					first = fmt.Sprintf("discard version %d set while hold %d at %d was live", v, id, h)
				}
			}
		}
	}
	t.Cleanup(func() { testOnSetDiscard = nil })
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{})
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := p.Submit(set(fmt.Sprintf("k%d-%d", g, i%50), "v")).Wait(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	holds := 0
	for id := 0; time.Now().Before(deadline); id++ {
		seq := p.AppliedSeq() // below what the applier sets next
		release := p.HoldVersions(seq)
		mu.Lock()
		live[id] = seq
		mu.Unlock()
		time.Sleep(time.Duration(id%3) * time.Millisecond)
		mu.Lock()
		delete(live, id)
		mu.Unlock()
		release()
		holds++
	}
	close(stop)
	wg.Wait()
	if n := violations.Load(); n > 0 {
		t.Fatalf("%d of %d discard versions passed a live hold; the first: %s", n, sets.Load(), first)
	}
	if sets.Load() < int64(holds) {
		t.Fatalf("only %d discard versions set over %d holds: the check saw nothing", sets.Load(), holds)
	}
	t.Logf("%d holds, %d discard versions set, none past a live hold", holds, sets.Load())
}
