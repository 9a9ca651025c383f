package persistence

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/pipehook"
)

func openTestDB(t *testing.T, dir string) *DB {
	t.Helper()
	db, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return db
}

func closeDB(t *testing.T, db *DB) {
	t.Helper()
	if err := db.Close(); err != nil {
		t.Errorf("close db: %v", err)
	}
}

func startPipeline(t testing.TB, db *DB, cfg PipelineConfig) *Pipeline {
	t.Helper()
	p := NewPipeline(db, cfg)
	p.Start()
	t.Cleanup(p.Close)
	return p
}

// reopen closes p and db, opens the directory again with cfg (no pipeline)
// and closes it when the test ends.
func reopen(t *testing.T, p *Pipeline, db *DB, cfg Config) *DB {
	t.Helper()
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// waitFor polls cond until it holds, and fails the test after 10 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// waitApplied waits until Badger shows tk's write.
func waitApplied(t testing.TB, tk *Ticket) {
	t.Helper()
	waitFor(t, "the write to be applied", tk.Applied)
}

func set(k, v string) *Write {
	return &Write{Sets: []KV{{Key: []byte(k), Value: []byte(v)}}}
}

func TestPipeline_WriteIsReadableAfterReopen(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir)
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	ctx := context.Background()
	if err := p.Submit(set("a", "1")).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	w := &Write{Sets: []KV{{Key: []byte("b"), Value: []byte("2")}}, Deletes: [][]byte{[]byte("a")}}
	if err := p.Submit(w).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTestDB(t, dir)
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	if _, found, _ := db.Get(ctx, []byte("a")); found {
		t.Fatal("deleted key a is still there")
	}
	v, found, err := db.Get(ctx, []byte("b"))
	if err != nil || !found || string(v) != "2" {
		t.Fatalf("b = %q %v %v, want 2", v, found, err)
	}
}

// TestPipeline_SharesSyncsAndNeverAcksEarly holds the first commit until every
// writer has submitted, then checks that no ticket completed before the commit
// that covers it, and that N writes took far fewer than N commits (syncs).
func TestPipeline_SharesSyncsAndNeverAcksEarly(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	const n = 500
	tickets := make([]*Ticket, n)
	var submitted sync.WaitGroup
	submitted.Add(n)
	release := make(chan struct{})
	var mu sync.Mutex
	var earlyAcks int
	committed := 0
	p := NewPipeline(db, PipelineConfig{})
	p.cfg.Hooks = &pipehook.Hooks{}
	p.cfg.Hooks.BeforeCommit = func(k int) {
		if committed == 0 {
			<-release // hold the first commit until every writer submitted
		}
		committed += k
		// Every ticket not yet covered by a commit must still be pending.
		mu.Lock()
		done := 0
		for _, tk := range tickets {
			if tk != nil && tk.Done() {
				done++
			}
		}
		if done > committed-k {
			earlyAcks += done - (committed - k)
		}
		mu.Unlock()
	}
	p.Start()
	defer p.Close()

	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			tk := p.Submit(set(fmt.Sprintf("k%04d", i), "v"))
			mu.Lock()
			tickets[i] = tk
			mu.Unlock()
			submitted.Done()
			if err := tk.Wait(context.Background()); err != nil {
				t.Errorf("write %d: %v", i, err)
			}
		}(i)
	}
	submitted.Wait()
	mu.Lock()
	for i, tk := range tickets {
		if tk.Done() {
			t.Errorf("write %d acknowledged while its commit is held", i)
		}
	}
	mu.Unlock()
	close(release)
	wg.Wait()
	st := p.Stats()
	if st.Writes != n {
		t.Fatalf("writes = %d, want %d", st.Writes, n)
	}
	if st.Commits > n/10 {
		t.Fatalf("%d writes took %d commits, want far fewer", n, st.Commits)
	}
	if earlyAcks != 0 {
		t.Fatalf("%d tickets completed before their commit", earlyAcks)
	}
	ctx := context.Background()
	for i := 0; i < n; i++ {
		waitApplied(t, tickets[i])
		if _, found, err := db.Get(ctx, []byte(fmt.Sprintf("k%04d", i))); !found || err != nil {
			t.Fatalf("acknowledged write %d not in the database (%v)", i, err)
		}
	}
}

func TestPipeline_CompletesInSubmissionOrder(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })                           // after the pipeline's Close
	p := startPipeline(t, db, PipelineConfig{MaxCommitBytes: 200}) // forces several commits
	var mu sync.Mutex
	var order []int
	var last *Ticket
	for i := 0; i < 200; i++ {
		i := i
		last = p.Submit(set(fmt.Sprintf("k%d", i), "0123456789"))
		last.OnDone(func(error) {
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		})
	}
	if err := last.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, v := range order {
		if v != i {
			t.Fatalf("completion %d was write %d", i, v)
		}
	}
	if p.Stats().Commits < 2 {
		t.Fatalf("commits = %d, want the byte budget to split the batch", p.Stats().Commits)
	}
}

func TestPipeline_TooLargeWriteFailsAlone(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	release := make(chan struct{})
	first := true
	p := NewPipeline(db, PipelineConfig{MaxWriteBytes: 1 << 20, Hooks: &pipehook.Hooks{BeforeCommit: func(int) {
		if first {
			first = false
			<-release
		}
	}}})
	p.Start()
	defer p.Close()
	warm := p.Submit(set("warm", "x")) // held in the first commit while the others queue
	small1 := p.Submit(set("s1", "x"))
	big := p.Submit(&Write{Sets: []KV{{Key: []byte("big"), Value: make([]byte, 2<<20)}}})
	small2 := p.Submit(set("s2", "x"))
	close(release)
	ctx := context.Background()
	for _, tk := range []*Ticket{warm, small1, small2} {
		if err := tk.Wait(ctx); err != nil {
			t.Fatalf("small write failed: %v", err)
		}
	}
	if err := big.Wait(ctx); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("big write: %v, want ErrTooLarge", err)
	}
	waitApplied(t, small2)
	if _, found, _ := db.Get(ctx, []byte("big")); found {
		t.Fatal("refused write is in the database")
	}
	// The pipeline keeps working.
	if err := p.Submit(set("after", "x")).Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPipeline_WriteLargerThanABadgerTransaction commits one write that Badger
// can only take in several transactions: it is acknowledged whole, readable whole,
// and whole after a restart.
func TestPipeline_WriteLargerThanABadgerTransaction(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Config{Dir: dir, MemTableSize: 8 << 20}) // Badger takes ~1.2 MiB per transaction
	if err != nil {
		t.Fatal(err)
	}
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	w := &Write{}
	for i := 0; i < 40; i++ {
		w.Sets = append(w.Sets, KV{Key: []byte(fmt.Sprintf("big-%02d", i)), Value: bytes.Repeat([]byte{byte(i)}, 100<<10)})
	}
	w.Deletes = [][]byte{[]byte("gone")}
	ctx := context.Background()
	tk := p.Submit(w)
	if err := tk.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, tk)
	check := func(db *DB) {
		for i := 0; i < 40; i++ {
			v, found, err := db.Get(ctx, []byte(fmt.Sprintf("big-%02d", i)))
			if err != nil || !found || len(v) != 100<<10 || v[0] != byte(i) {
				t.Fatalf("key %d: found=%v len=%d err=%v", i, found, len(v), err)
			}
		}
	}
	check(db)
	if p.Failed() != nil {
		t.Fatal(p.Failed())
	}
	check(reopen(t, p, db, Config{Dir: dir, MemTableSize: 8 << 20}))
}

func TestPipeline_FenceRefusesOneWrite(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	errStale := errors.New("stale epoch")
	p := startPipeline(t, db, PipelineConfig{Fence: func(part uint32, epoch uint64) error {
		if part == 7 && epoch < 3 {
			return errStale
		}
		return nil
	}})
	ctx := context.Background()
	w := set("fenced", "x")
	w.Partition, w.Epoch = 7, 2
	ok := set("current", "x")
	ok.Partition, ok.Epoch = 7, 3
	tf, to := p.Submit(w), p.Submit(ok)
	if err := tf.Wait(ctx); !errors.Is(err, errStale) {
		t.Fatalf("fenced write: %v", err)
	}
	if err := to.Wait(ctx); err != nil {
		t.Fatalf("current write: %v", err)
	}
	if _, found, _ := db.Get(ctx, []byte("fenced")); found {
		t.Fatal("fenced write reached the database")
	}
}

func TestPipeline_CloseCommitsQueuedAndRefusesLater(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	p := NewPipeline(db, PipelineConfig{})
	release := make(chan struct{})
	first := true
	p.cfg.Hooks = &pipehook.Hooks{}
	p.cfg.Hooks.BeforeCommit = func(int) {
		if first {
			first = false
			<-release
		}
	}
	p.Start()
	var tickets []*Ticket
	for i := 0; i < 50; i++ {
		tickets = append(tickets, p.Submit(set(fmt.Sprintf("q%d", i), "x")))
	}
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	deadline := time.Now().Add(5 * time.Second)
	for { // wait until Close marked the pipeline closing
		// A write queued before Close is committed; one after it is refused at once.
		if tk := p.Submit(set("late", "x")); tk.Done() && errors.Is(tk.Err(), ErrClosed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Close never started refusing writes")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	<-closed
	for i, tk := range tickets {
		if !tk.Done() || tk.Err() != nil {
			t.Fatalf("queued write %d: done=%v err=%v", i, tk.Done(), tk.Err())
		}
	}
}

func TestOpen_PartitionsFixedAtCreation(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Config{Dir: dir, Partitions: 64})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	db, err = Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if db.Partitions() != 64 {
		t.Fatalf("partitions = %d, want the stored 64", db.Partitions())
	}
	db.Close()
	if _, err := Open(Config{Dir: dir, Partitions: 128}); !errors.Is(err, ErrPartitionsMismatch) {
		t.Fatalf("open with 128: %v, want ErrPartitionsMismatch", err)
	}
}

func TestPipeline_ChainStopsWritesAfterAFailure(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	errStale := errors.New("stale epoch")
	p := startPipeline(t, db, PipelineConfig{Fence: func(_ uint32, epoch uint64) error {
		if epoch == 0 {
			return errStale
		}
		return nil
	}})
	chain := &Chain{}
	w1 := set("c1", "x") // refused by the fence
	w1.Chain = chain
	w2 := set("c2", "x") // fine on its own, but built on w1
	w2.Chain, w2.Epoch = chain, 1
	other := set("o1", "x")
	other.Epoch = 1
	t1, t2, t3 := p.Submit(w1), p.Submit(w2), p.Submit(other)
	ctx := context.Background()
	if err := t1.Wait(ctx); !errors.Is(err, errStale) {
		t.Fatalf("w1: %v", err)
	}
	if err := t2.Wait(ctx); !errors.Is(err, errStale) {
		t.Fatalf("w2 after a failed write of its chain: %v, want the chain's error", err)
	}
	if err := t3.Wait(ctx); err != nil {
		t.Fatalf("a write of another chain: %v", err)
	}
	if _, found, _ := db.Get(ctx, []byte("c2")); found {
		t.Fatal("a write built on a failed one reached the database")
	}
}

// A retired chain's writes that the committer has not taken fail with the
// retirement's error and never reach the database; a write of the chain
// taken before stays; the first retirement's error stays; other chains are
// not touched.
func TestPipeline_ARetiredChainRefusesItsLaterWrites(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	p := startPipeline(t, db, PipelineConfig{})
	ctx := context.Background()
	chain := &Chain{}
	before := set("r1", "x")
	before.Chain = chain
	waitApplied(t, p.Submit(before))
	errGone := errors.New("retired")
	chain.Retire(errGone)
	chain.Retire(errors.New("retired again"))
	after := set("r2", "x")
	after.Chain = chain
	other := set("o1", "x")
	other.Chain = &Chain{}
	ta, to := p.Submit(after), p.Submit(other)
	if err := ta.Wait(ctx); !errors.Is(err, errGone) {
		t.Fatalf("a write of a retired chain: %v, want the first retirement's error", err)
	}
	if err := to.Wait(ctx); err != nil {
		t.Fatalf("a write of another chain: %v", err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := db.Get(ctx, []byte("r2")); found {
		t.Fatal("a write of a retired chain reached the database")
	}
	if _, found, _ := db.Get(ctx, []byte("r1")); !found {
		t.Fatal("the chain's write from before its retirement is gone")
	}
}

// ScanMerged reads several ranges as one sequence ordered by the key after each
// prefix, honours each range's bounds, and stops when told.
func TestDB_ScanMergedOrdersAcrossRanges(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { closeDB(t, db) }) // after the pipeline's (cleanups run last first)
	p := startPipeline(t, db, PipelineConfig{})
	w := &Write{}
	for _, k := range []string{"a:1", "a:4", "a:7", "b:2", "b:4", "b:9", "c:3", "z:0"} {
		w.Sets = append(w.Sets, KV{Key: []byte(k), Value: []byte("v" + k)})
	}
	waitApplied(t, p.Submit(w))
	ranges := []Range{{Prefix: []byte("a:")}, {Prefix: []byte("b:"), Start: []byte("b:3"), End: []byte("b:9")}, {Prefix: []byte("c:")}, {Prefix: []byte("d:")}}
	var got []string
	err := db.ScanMerged(context.Background(), ranges, func(i int, k, v []byte) (bool, error) {
		if string(v) != "v"+string(k) || string(k[:2]) != string(ranges[i].Prefix) {
			t.Fatalf("range %d: %s=%s", i, k, v)
		}
		got = append(got, string(k))
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "[a:1 c:3 a:4 b:4 a:7]"; fmt.Sprint(got) != want {
		t.Fatalf("got %v, want %s", got, want)
	}
	got = got[:0]
	_ = db.ScanMerged(context.Background(), ranges, func(i int, k, v []byte) (bool, error) {
		got = append(got, string(k))
		return len(got) < 2, nil
	})
	if fmt.Sprint(got) != "[a:1 c:3]" {
		t.Fatalf("stopped scan read %v", got)
	}
}

// A scan with an end sees each key's newest version only, skips deleted keys,
// and stops at end (it walks deletions itself: see DB.Scan).
func TestDB_ScanWithEndSeesNewestLiveVersions(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { closeDB(t, db) }) // after the pipeline's (cleanups run last first)
	p := startPipeline(t, db, PipelineConfig{})
	set := func(kvs ...string) *Write {
		w := &Write{}
		for i := 0; i < len(kvs); i += 2 {
			w.Sets = append(w.Sets, KV{Key: []byte(kvs[i]), Value: []byte(kvs[i+1])})
		}
		return w
	}
	waitApplied(t, p.Submit(set("q:1", "a", "q:2", "b", "q:3", "c", "q:5", "e", "q:9", "z")))
	waitApplied(t, p.Submit(set("q:1", "a2", "q:4", "d")))
	waitApplied(t, p.Submit(&Write{Deletes: [][]byte{[]byte("q:2"), []byte("q:4")}}))
	waitApplied(t, p.Submit(set("q:4", "d2")))
	for _, c := range []struct {
		start, end string
		want       string
	}{
		{"", "q:9", "[q:1=a2 q:3=c q:4=d2 q:5=e]"},
		{"q:2", "q:5", "[q:3=c q:4=d2]"},
		{"q:2", "q:3", "[]"},
	} {
		var got []string
		var start []byte
		if c.start != "" {
			start = []byte(c.start)
		}
		err := db.Scan(context.Background(), []byte("q:"), start, []byte(c.end), func(k, v []byte) (bool, error) {
			got = append(got, string(k)+"="+string(v))
			return true, nil
		})
		if err != nil || fmt.Sprint(got) != c.want {
			t.Errorf("scan [%s, %s): %v %v, want %s", c.start, c.end, got, err, c.want)
		}
	}
}

// TestPipeline_AFailedLogWriteNeverReachesBadger: Badger gets a record only once
// the log made it durable. A commit whose log write fails fails its writes, and
// nothing of it is readable, then or after the pipeline stopped.
func TestPipeline_AFailedLogWriteNeverReachesBadger(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	p := startPipeline(t, db, PipelineConfig{})
	ctx := context.Background()
	before := p.Submit(set("before", "x"))
	if err := before.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	// The log's next write fails: its segment's handle is gone.
	p.Barrier(ctx)
	db.wal.cur.pw.f.Close()
	tk := p.Submit(set("lost", "x"))
	if err := tk.Wait(ctx); err == nil {
		t.Fatal("a write whose log write failed was acknowledged")
	}
	if !errors.Is(p.Failed(), ErrFailed) {
		t.Fatalf("pipeline after a failed log write: %v, want ErrFailed", p.Failed())
	}
	p.Close() // the applier has done everything it was given
	if _, found, err := db.Get(ctx, []byte("lost")); found || err != nil {
		t.Fatalf("the failed write is readable (found %v, err %v)", found, err)
	}
	if _, found, _ := db.Get(ctx, []byte("before")); !found {
		t.Fatal("the write before the failure is gone")
	}
}

// recordWaiter is a Waiter that notes its name and the outcome it got.
type recordWaiter struct {
	name string
	got  *[]string
}

func (w recordWaiter) WriteDone(err error) {
	*w.got = append(*w.got, fmt.Sprintf("%s:%v", w.name, err))
}

// TestTicket_WaitersRunInTheOrderTheyCame: OnDone and Notify waiters, the
// first kept inline and the rest in a slice, all get the outcome in the order
// they were added; one added after the outcome is known gets it at once.
func TestTicket_WaitersRunInTheOrderTheyCame(t *testing.T) {
	var got []string
	tk := &Ticket{}
	tk.Notify(recordWaiter{"a", &got})
	tk.OnDone(func(err error) { got = append(got, fmt.Sprintf("b:%v", err)) })
	tk.Notify(recordWaiter{"c", &got})
	if len(got) != 0 {
		t.Fatalf("waiters ran before the outcome: %v", got)
	}
	tk.complete(errors.New("lost"))
	tk.Notify(recordWaiter{"d", &got})
	want := []string{"a:lost", "b:lost", "c:lost", "d:lost"}
	if !slices.Equal(got, want) {
		t.Fatalf("waiters ran as %v, want %v", got, want)
	}
}
