package persistence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/pipehook"
)

// heldPipeline starts a pipeline whose first commit blocks until release is
// closed; entered is closed once it blocks. It counts commits (records).
func heldPipeline(t *testing.T, db *DB, cfg PipelineConfig) (p *Pipeline, entered, release chan struct{}, commits *atomic.Int64) {
	t.Helper()
	entered, release = make(chan struct{}), make(chan struct{})
	commits = new(atomic.Int64)
	cfg.Hooks = &pipehook.Hooks{BeforeCommit: func(int) {
		if commits.Add(1) == 1 {
			close(entered)
			<-release
		}
	}}
	return startPipeline(t, db, cfg), entered, release, commits
}

// TestRaftAppend_QueuedJobsShareOneRecordAndAreDoneInOrder: raft appends of
// several groups and writes queued while the committer is busy go into one
// record (one sync); each append's Done runs in queue order, once its entries
// are readable through the replica's storage.
func TestRaftAppend_QueuedJobsShareOneRecordAndAreDoneInOrder(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	p, entered, release, commits := heldPipeline(t, db, PipelineConfig{})
	ctx := context.Background()
	held := p.Submit(set("held", "x"))
	<-entered

	var mu sync.Mutex
	var order []string
	var problems []string
	all := make(chan struct{})
	const groups, perGroup = 5, 4
	var left atomic.Int64
	left.Store(groups * perGroup)
	var tickets []*Ticket
	for i := uint64(1); i <= perGroup; i++ {
		for g := uint64(1); g <= groups; g++ {
			p.AppendRaft(RaftAppend{Group: g, Replica: 1, Entries: pbEnts(i, 1), HardState: pbHS(1, 1, i-1), Sync: true, Done: func(err error) {
				mu.Lock()
				defer mu.Unlock()
				order = append(order, fmt.Sprintf("%d/%d", g, i))
				if err != nil {
					problems = append(problems, fmt.Sprintf("group %d entry %d: %v", g, i, err))
				}
				// Visible before Done.
				if last, _ := db.RaftStorage(g, 1, nil).LastIndex(); last < i {
					problems = append(problems, fmt.Sprintf("group %d entry %d done with last index %d", g, i, last))
				}
				if left.Add(-1) == 0 {
					close(all)
				}
			}})
		}
		tickets = append(tickets, p.Submit(set(fmt.Sprint("w", i), "v")))
	}
	close(release)
	if err := held.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tk := range tickets {
		if err := tk.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for the raft appends")
	}
	if n := commits.Load(); n != 2 {
		t.Fatalf("%d commits, want 2: the held one, then everything queued behind it in one record", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	var want []string
	for i := 1; i <= perGroup; i++ {
		for g := 1; g <= groups; g++ {
			want = append(want, fmt.Sprintf("%d/%d", g, i))
		}
	}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("done in order %v, want %v", order, want)
	}
}

// TestRaftAppend_AnUnsyncedAppendRidesInTheNextRecord: an append without
// Sync does not make the committer commit; the next commit takes it along.
func TestRaftAppend_AnUnsyncedAppendRidesInTheNextRecord(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	var commits atomic.Int64
	p := startPipeline(t, db, PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: func(int) { commits.Add(1) }}})
	mustAppend(t, p, 1, 1, pbHS(1, 1, 0), pbEnts(1, 1))
	waitParked(t, p)
	before := commits.Load()
	done := make(chan error, 1)
	p.AppendRaft(RaftAppend{Group: 1, Replica: 1, HardState: pbHS(1, 1, 1), Done: func(err error) { done <- err }})
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the unsynced append was done (%v) before any commit", err)
	default:
	}
	if n := commits.Load(); n != before {
		t.Fatalf("the unsynced append made %d commits", n-before)
	}
	if err := p.Submit(set("k", "v")).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := waitDone(t, "the unsynced append", done); err != nil {
		t.Fatal(err)
	}
	if n := commits.Load(); n != before+1 {
		t.Fatalf("%d commits for a write and the append riding with it, want 1", n-before)
	}
	if hs, _, _ := db.RaftStorage(1, 1, nil).InitialState(); hs.GetCommit() != 1 {
		t.Fatalf("commit %d, want 1", hs.GetCommit())
	}
}

// TestRaftAppend_QueuedBytesCountRaftAppends: MaxQueuedBytes counts the raft
// appends waiting for the committer: past it, a write is refused, and so is
// a raft append.
func TestRaftAppend_QueuedBytesCountRaftAppends(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	p, entered, release, _ := heldPipeline(t, db, PipelineConfig{MaxQueuedBytes: 64 << 10})
	held := p.Submit(set("held", "x"))
	<-entered
	big := pbEnts(1, 1)
	big[0].Data = make([]byte, 60<<10)
	first := make(chan error, 1)
	p.AppendRaft(RaftAppend{Group: 1, Replica: 1, Entries: big, Sync: true, Done: func(err error) { first <- err }})
	refused := p.Submit(set("w", string(make([]byte, 8<<10))))
	second := make(chan error, 1)
	more := pbEnts(2, 1)
	more[0].Data = make([]byte, 8<<10)
	p.AppendRaft(RaftAppend{Group: 2, Replica: 1, Entries: more, Sync: true, Done: func(err error) { second <- err }})
	close(release)
	ctx := context.Background()
	if err := held.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitDone(t, "the append under the bound", first); err != nil {
		t.Fatal(err)
	}
	if err := refused.Wait(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a write past the bound the raft append filled: %v, want ErrUnavailable", err)
	}
	if err := waitDone(t, "the append past the bound", second); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a raft append past the bound: %v, want ErrUnavailable", err)
	}
	if last, _ := db.RaftStorage(2, 1, nil).LastIndex(); last != 0 {
		t.Fatalf("the refused append reached the log (last index %d)", last)
	}
}

// TestRaftAppend_AfterCloseFails: an append after Close is done with ErrClosed.
func TestRaftAppend_AfterCloseFails(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{})
	p.Close()
	if err := appendRaft(t, p, 1, 1, nil, pbEnts(1, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after Close: %v, want ErrClosed", err)
	}
}

// TestRaftAppend_AnEmptyAppendWritesNoRecord: an append with neither entries
// nor a HardState (raft's MsgStorageAppend that only carries responses) is
// done in order, after what was queued before it, without a record of its
// own: an empty record is the log's end marker, and replay would stop there.
func TestRaftAppend_AnEmptyAppendWritesNoRecord(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir)
	p := startPipeline(t, db, PipelineConfig{})
	mustAppend(t, p, 1, 1, pbHS(1, 1, 0), pbEnts(1, 1))
	if err := appendRaft(t, p, 1, 1, nil, nil); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, p, 1, 1, nil, pbEnts(2, 1))
	db = reopen(t, p, db, Config{Dir: dir})
	if last, _ := db.RaftStorage(1, 1, nil).LastIndex(); last != 2 {
		t.Fatalf("last index %d after a reopen, want 2", last)
	}
}
