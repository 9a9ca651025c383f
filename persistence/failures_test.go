package persistence

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/pipehook"
)

// faultyApplier makes the applier's attempts fail with err while failing is
// set, and counts them. It is installed before the pipeline starts and removed
// after it closed.
type faultyApplier struct {
	failing  atomic.Bool
	attempts atomic.Int64
	err      error
}

func installApplyFault(t *testing.T, err error) *faultyApplier {
	t.Helper()
	f := &faultyApplier{err: err}
	testApplyFault = func() error {
		if f.failing.Load() {
			f.attempts.Add(1)
			return f.err
		}
		return nil
	}
	t.Cleanup(func() { testApplyFault = nil })
	return f
}

// TestPipeline_AFailedApplyIsNotAnAppliedOne: while Badger refuses a batch
// for a missing resource (ENOSPC), the writes are acknowledged (they are
// durable in the log) but not marked applied, the applied mark stays, reads
// of Badger are not trusted (WaitApplied waits), the storage says it is
// unavailable; once the resource is back the applier gets them in, and nothing
// failed for good. Before, the applier marked the tickets applied and moved
// the mark on regardless, and overlays were evicted over a Badger that lacked
// the writes.
func TestPipeline_AFailedApplyIsNotAnAppliedOne(t *testing.T) {
	dir := t.TempDir()
	f := installApplyFault(t, fmt.Errorf("badger: %w", syscall.ENOSPC))
	db := openTestDB(t, dir)
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{})
	ctx := context.Background()
	before := p.AppliedSeq()
	f.failing.Store(true)
	tk := p.Submit(set("k", "v1"))
	if err := tk.Wait(ctx); err != nil {
		t.Fatalf("the write is durable in the log; its ack failed: %v", err)
	}
	waitFor(t, "the applier to try and fail twice", func() bool { return f.attempts.Load() >= 2 })
	if tk.Applied() || p.AppliedSeq() != before {
		t.Fatalf("applied=%v mark %d->%d while Badger refused the batch", tk.Applied(), before, p.AppliedSeq())
	}
	if !errors.Is(p.Unavailable(), ErrUnavailable) {
		t.Fatalf("Unavailable() = %v while Badger refuses writes", p.Unavailable())
	}
	if p.Failed() != nil {
		t.Fatalf("a missing resource failed the pipeline: %v", p.Failed())
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := p.WaitApplied(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitApplied = %v while the write is not in Badger, want the context's end", err)
	}
	f.failing.Store(false)
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	if !tk.Applied() {
		t.Fatal("not marked applied once Badger took it")
	}
	if v, found, err := db.Get(ctx, []byte("k")); err != nil || !found || string(v) != "v1" {
		t.Fatalf("Badger: %q found=%v err=%v", v, found, err)
	}
}

// TestPipeline_AnApplyThatKeepsFailingStopsThePipeline: an error that is not
// a missing resource is tried applyAttempts times; then the pipeline fails,
// WaitApplied says so instead of returning as if Badger had the writes, and
// Close keeps the log, so that the next Open replays what Badger lacks.
func TestPipeline_AnApplyThatKeepsFailingStopsThePipeline(t *testing.T) {
	dir := t.TempDir()
	f := installApplyFault(t, errors.New("badger: something broke"))
	db := openTestDB(t, dir)
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	ctx := context.Background()
	f.failing.Store(true)
	tk := p.Submit(set("k", "v1"))
	if err := tk.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pipeline to fail", func() bool { return p.Failed() != nil })
	if got := f.attempts.Load(); got != applyAttempts {
		t.Fatalf("%d attempts, want %d", got, applyAttempts)
	}
	if tk.Applied() {
		t.Fatal("a write Badger never took is marked applied")
	}
	if err := p.WaitApplied(ctx); !errors.Is(err, ErrFailed) {
		t.Fatalf("WaitApplied = %v, want the pipeline's failure", err)
	}
	if err := p.Submit(set("k", "v2")).Wait(ctx); !errors.Is(err, ErrFailed) {
		t.Fatalf("a write after the failure: %v", err)
	}
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	f.failing.Store(false)
	db2 := openTestDB(t, dir)
	defer db2.Close()
	if v, found, err := db2.Get(ctx, []byte("k")); err != nil || !found || string(v) != "v1" {
		t.Fatalf("after a restart: %q found=%v err=%v, want the acknowledged v1", v, found, err)
	}
}

// TestPipeline_ASegmentThatCannotStartRefusesWritesUntilItCan: when the log
// cannot start its next segment (here a directory squats the file's name; in
// life no descriptor or no space), the writes of that commit fail with
// ErrUnavailable and nothing else happens: the pipeline has not failed, reads
// go on, and once the cause is gone the next write goes through. A restart
// then replays every acknowledged write. Before, any error of a rotation
// stopped the node's storage for good.
func TestPipeline_ASegmentThatCannotStartRefusesWritesUntilItCan(t *testing.T) {
	dir := t.TempDir()
	const segSize = 64 << 10
	db, err := Open(Config{Dir: dir, SegmentSize: segSize})
	if err != nil {
		t.Fatal(err)
	}
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	ctx := context.Background()
	next := segmentName(db.wal.dir, db.wal.cur.id+1)
	if err := os.Mkdir(next, 0o755); err != nil {
		t.Fatal(err)
	}
	value := string(make([]byte, 1000))
	acked := 0
	var refused error
	for i := 0; i < 200 && refused == nil; i++ {
		if err := p.Submit(set(fmt.Sprintf("k%03d", i), value)).Wait(ctx); err != nil {
			refused = err
			break
		}
		acked++
	}
	if !errors.Is(refused, ErrUnavailable) {
		t.Fatalf("after %d writes: %v, want ErrUnavailable at the rotation", acked, refused)
	}
	if p.Failed() != nil || p.Unavailable() == nil {
		t.Fatalf("Failed()=%v Unavailable()=%v, want only unavailable", p.Failed(), p.Unavailable())
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	if _, found, err := db.Get(ctx, []byte("k000")); err != nil || !found {
		t.Fatalf("reads stopped: found=%v err=%v", found, err)
	}
	if err := p.Submit(set("again", "x")).Wait(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a write while the cause is still there: %v", err)
	}
	if err := os.Remove(next); err != nil {
		t.Fatal(err)
	}
	if err := p.Submit(set("after", "x")).Wait(ctx); err != nil {
		t.Fatalf("a write once the cause is gone: %v", err)
	}
	if p.Unavailable() != nil {
		t.Fatalf("still unavailable: %v", p.Unavailable())
	}
	// A crash, then a restart replays every acknowledged write.
	p.Close()
	db.wal.closeAll()
	_ = db.bdb.Close()
	db2, err := Open(Config{Dir: dir, SegmentSize: segSize})
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	for i := 0; i < acked; i++ {
		if _, found, err := db2.Get(ctx, []byte(fmt.Sprintf("k%03d", i))); err != nil || !found {
			t.Fatalf("k%03d after a restart: found=%v err=%v", i, found, err)
		}
	}
	if _, found, _ := db2.Get(ctx, []byte("after")); !found {
		t.Fatal("the write after the recovery is lost")
	}
}

// TestPipeline_ABacklogBeyondItsBoundRefusesWrites: while Badger is behind
// the log by more than MaxApplyBacklog bytes, new writes are refused with
// ErrUnavailable instead of piling up in memory; they go through again once
// it caught up.
func TestPipeline_ABacklogBeyondItsBoundRefusesWrites(t *testing.T) {
	f := installApplyFault(t, fmt.Errorf("badger: %w", syscall.ENOMEM))
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{MaxApplyBacklog: 64 << 10})
	ctx := context.Background()
	f.failing.Store(true)
	value := string(make([]byte, 16<<10))
	var refused error
	for i := 0; i < 100 && refused == nil; i++ {
		refused = p.Submit(set(fmt.Sprintf("k%d", i), value)).Wait(ctx)
	}
	if !errors.Is(refused, ErrUnavailable) {
		t.Fatalf("100 writes of 16 KiB over a stuck applier: %v, want ErrUnavailable", refused)
	}
	f.failing.Store(false)
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Submit(set("after", value)).Wait(ctx); err != nil {
		t.Fatalf("a write once Badger caught up: %v", err)
	}
}

// TestPipeline_AFullQueueRefusesWritesAndTheirChain: while the committer is
// held, writes queue up to MaxQueuedBytes; the next one is refused with
// ErrUnavailable, and so is every later write of its chain, even one that
// would fit: nothing built on a refused write may reach disk. Writes of other
// chains go on once the queue drains.
func TestPipeline_AFullQueueRefusesWritesAndTheirChain(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	p := startPipeline(t, db, PipelineConfig{MaxQueuedBytes: 64 << 10, Hooks: &pipehook.Hooks{BeforeCommit: func(int) {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
	}}})
	ctx := context.Background()
	held := p.Submit(set("held", "x"))
	<-entered
	value := string(make([]byte, 20<<10))
	var queued []*Ticket
	for i := 0; i < 3; i++ { // 60 KiB and a bit: under the bound
		queued = append(queued, p.Submit(set(fmt.Sprintf("q%d", i), value)))
	}
	chain := &Chain{}
	refused := p.Submit(&Write{Sets: []KV{{Key: []byte("big"), Value: []byte(value)}}, Chain: chain})
	after := p.Submit(&Write{Sets: []KV{{Key: []byte("small"), Value: []byte("s")}}, Chain: chain})
	close(release)
	for _, tk := range append([]*Ticket{held}, queued...) {
		if err := tk.Wait(ctx); err != nil {
			t.Fatalf("a write under the bound: %v", err)
		}
	}
	if err := refused.Wait(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("the write over the bound: %v, want ErrUnavailable", err)
	}
	if err := after.Wait(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a later write of the refused write's chain: %v, want its refusal", err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"big", "small"} {
		if _, found, _ := db.Get(ctx, []byte(k)); found {
			t.Fatalf("%s reached Badger", k)
		}
	}
	if err := p.Submit(set("later", "x")).Wait(ctx); err != nil {
		t.Fatalf("a write once the queue drained: %v", err)
	}
}
