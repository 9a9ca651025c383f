package persistence

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func openReplicated(t *testing.T, dir string, segSize int64) *DB {
	t.Helper()
	db, err := Open(Config{Dir: dir, SegmentSize: segSize, Replicated: true})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return db
}

// applyRaft applies one replica's entries up to index, with the changes of
// writes, and waits until Badger holds them.
func applyRaft(t *testing.T, p *Pipeline, group, index uint64, writes ...*Write) {
	t.Helper()
	if err := applyRaftErr(p, group, index, writes...); err != nil {
		t.Fatalf("apply group %d index %d: %v", group, index, err)
	}
}

func applyRaftErr(p *Pipeline, group, index uint64, writes ...*Write) error {
	var changes [][]byte
	for _, w := range writes {
		changes = append(changes, AppendChanges(nil, w))
	}
	done := make(chan error, 1)
	p.ApplyRaft(RaftApply{Group: group, Replica: 1, State: RaftAppliedState{Index: index, Term: 1, ConfState: []byte{byte(index)}}, Changes: changes, Done: func(err error) { done <- err }})
	return <-done
}

func getString(t *testing.T, db *DB, key string) string {
	t.Helper()
	v, found, err := db.Get(context.Background(), []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	if !found {
		return "<none>"
	}
	return string(v)
}

// TestReplicated_ModeIsFixedAtCreation: a replicated data directory is never
// opened as a single node's, nor a single node's as a replicated one.
func TestReplicated_ModeIsFixedAtCreation(t *testing.T) {
	rdir, sdir := t.TempDir(), t.TempDir()
	closeDB(t, openReplicated(t, rdir, 0))
	if _, err := Open(Config{Dir: rdir}); !errors.Is(err, ErrModeMismatch) {
		t.Fatalf("single-node open of a replicated directory: %v, want ErrModeMismatch", err)
	}
	closeDB(t, openTestDB(t, sdir))
	if _, err := Open(Config{Dir: sdir, Replicated: true}); !errors.Is(err, ErrModeMismatch) {
		t.Fatalf("replicated open of a single node's directory: %v, want ErrModeMismatch", err)
	}
	db := openReplicated(t, rdir, 0) // and the right mode still opens
	if !db.Replicated() {
		t.Fatal("Replicated() is false")
	}
	closeDB(t, db)
	if _, err := os.Stat(filepath.Join(rdir, replicatedMarker)); err != nil {
		t.Fatal(err)
	}
}

// TestReplicated_EveryApplyBatchTakesANewerVersion: committed raft entries of
// any group, and local records, go to Badger at versions of the applier's
// counter, each batch above the last, so the newest change of a key wins
// although no record sequence number orders raft applies. A single node's
// database refuses raft applies, and a change that does not decode is refused
// alone.
func TestReplicated_EveryApplyBatchTakesANewerVersion(t *testing.T) {
	db := openReplicated(t, t.TempDir(), 0)
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	ctx := context.Background()
	last := db.bdb.MaxVersion()
	newer := func(what string) {
		t.Helper()
		v := db.bdb.MaxVersion()
		if v <= last {
			t.Fatalf("%s: Badger's newest version %d, not above %d", what, v, last)
		}
		last = v
	}
	applyRaft(t, p, 1, 1, set("pa", "1"))
	newer("group 1 index 1")
	applyRaft(t, p, 2, 1, set("pb", "1"))
	newer("group 2 index 1")
	if err := p.Submit(set("m-local", "x")).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	newer("a local record")
	applyRaft(t, p, 1, 2, set("pa", "2"), &Write{Deletes: [][]byte{[]byte("pb")}})
	newer("group 1 index 2")
	applyRaft(t, p, 1, 3, set("pa", "3"))
	newer("group 1 index 3")
	for k, want := range map[string]string{"pa": "3", "pb": "<none>", "m-local": "x"} {
		if got := getString(t, db, k); got != want {
			t.Errorf("%s = %s, want %s", k, got, want)
		}
	}
	if err := applyRaftErr(p, 1, 4); err != nil {
		t.Errorf("an apply of entries without changes: %v", err)
	}
	done := make(chan error, 1)
	p.ApplyRaft(RaftApply{Group: 1, Replica: 1, State: RaftAppliedState{Index: 5}, Changes: [][]byte{{0xEE, 1, 2}}, Done: func(err error) { done <- err }})
	if err := <-done; err == nil {
		t.Error("a change that does not decode was applied")
	}
	if got := getString(t, db, "pa"); got != "3" {
		t.Errorf("after the refused apply pa = %s", got)
	}

	single := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = single.Close() })
	sp := startPipeline(t, single, PipelineConfig{})
	if err := applyRaftErr(sp, 1, 1, set("pa", "1")); err == nil {
		t.Error("a single node's pipeline applied raft entries")
	}
}

// TestReplicated_RaftFlushedWaitsForSyncedTables: a replica's applied state is
// reported flushed (the point it may truncate its log to) only once Badger
// holds its batch, and every one before, in synced tables.
func TestReplicated_RaftFlushedWaitsForSyncedTables(t *testing.T) {
	db := openReplicated(t, t.TempDir(), 0)
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	applyRaft(t, p, 7, 5, set("p7", "x"))
	select { // the releaser runs after commits; let it look now
	case p.releaseCh <- struct{}{}:
	default:
	}
	if s, found := p.RaftFlushed(7, 1); found {
		t.Fatalf("flushed before any table holds it: %+v", s)
	}
	flushAndRelease(t, p)
	s, found := p.RaftFlushed(7, 1)
	if !found || s.Index != 5 || string(s.ConfState) != string([]byte{5}) {
		t.Fatalf("RaftFlushed(7, 1) = %+v, %v; want index 5 with its conf state", s, found)
	}
	if _, found := p.RaftFlushed(8, 1); found {
		t.Fatal("a replica that applied nothing is flushed")
	}
}

// TestReplicated_LogFloorIsTheLastRecordBadgerTook: in replicated mode Badger's
// versions run ahead of record sequence numbers (raft applies take them too),
// so the check that the log starts no later than where Badger stopped uses the
// last record Badger took: a lost first segment whose records Badger never got
// is caught, as on a single node. A crash keeps the log, and its replay gives
// the records versions above every one Badger holds.
func TestReplicated_LogFloorIsTheLastRecordBadgerTook(t *testing.T) {
	dir := t.TempDir()
	fault := installApplyFault(t, syscall.ENOSPC) // transient: the applier waits, the log keeps
	db := openReplicated(t, dir, 4096)
	p := NewPipeline(db, PipelineConfig{ValueLogGCEvery: -1})
	p.Start()
	for i := uint64(1); i <= 300; i++ { // the counter runs far ahead of the records
		applyRaft(t, p, 1, i, set("p1", fmt.Sprint(i)))
	}
	fault.failing.Store(true) // Badger takes no more records
	ctx := context.Background()
	for i := range 60 { // several segments of local records
		if err := p.Submit(set(fmt.Sprintf("m%03d", i), strings.Repeat("v", 200))).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if v, seq := db.bdb.MaxVersion(), p.Committed(); v <= seq+100 {
		t.Fatalf("Badger's version %d is not far above the last record %d: the test shows nothing", v, seq)
	}
	p.Close()
	closeDB(t, db) // keeps the log: Badger lacks records
	fault.failing.Store(false)
	ids, err := (&wal{dir: filepath.Join(dir, "wal")}).segmentIDs()
	if err != nil || len(ids) < 3 {
		t.Fatalf("segments %v, %v: want several", ids, err)
	}
	saved, err := os.ReadFile(segmentName(filepath.Join(dir, "wal"), ids[0]))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(segmentName(filepath.Join(dir, "wal"), ids[0])); err != nil {
		t.Fatal(err)
	}
	_, err = Open(Config{Dir: dir, SegmentSize: 4096, Replicated: true})
	var ce *CorruptionError
	if !errors.As(err, &ce) || !ce.missingStart {
		t.Fatalf("open without the log's first segment: %v, want a CorruptionError for missing records", err)
	}
	if err := os.WriteFile(segmentName(filepath.Join(dir, "wal"), ids[0]), saved, 0o644); err != nil {
		t.Fatal(err)
	}
	db = openReplicated(t, dir, 4096) // the whole log replays
	t.Cleanup(func() { _ = db.Close() })
	if got := getString(t, db, "m059"); got != strings.Repeat("v", 200) {
		t.Fatalf("m059 after replay = %q", got)
	}
	if got := getString(t, db, "p1"); got != "300" {
		t.Fatalf("p1 after replay = %q", got)
	}
	p = startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	applyRaft(t, p, 1, 301, set("p1", "301")) // above every replayed version
	if got := getString(t, db, "p1"); got != "301" {
		t.Fatalf("p1 after an apply past the replay = %q", got)
	}
}

// TestReplicated_RaftAppliesEndWhenTheApplierStops: every raft apply gets its
// Done, also when the applier stops early: the batch it was trying and the
// jobs queued behind it get ErrClosed when the pipeline closes while Badger
// refuses (the log keeps them: the replica applies them again at its next
// start), and an apply queued after Close is refused at once.
func TestReplicated_RaftAppliesEndWhenTheApplierStops(t *testing.T) {
	f := installApplyFault(t, syscall.ENOSPC)
	db := openReplicated(t, t.TempDir(), 0)
	t.Cleanup(func() { _ = db.Close() })
	p := NewPipeline(db, PipelineConfig{ValueLogGCEvery: -1})
	p.Start()
	f.failing.Store(true)
	const n = 20
	done := make(chan error, n+1)
	apply := func(i int) {
		p.ApplyRaft(RaftApply{Group: uint64(i % 3), Replica: 1, State: RaftAppliedState{Index: uint64(i + 1), Term: 1},
			Changes: [][]byte{AppendChanges(nil, set(fmt.Sprintf("p%d", i), "v"))}, Done: func(err error) { done <- err }})
	}
	apply(0)
	// The applier holds the first one, retrying; the others queue behind it.
	waitFor(t, "the applier to try and fail", func() bool { return f.attempts.Load() >= 1 })
	for i := 1; i < n; i++ {
		apply(i)
	}
	p.Close()
	for i := range n {
		select {
		case err := <-done:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("apply %d: %v, want ErrClosed", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d applies got their Done after Close", i, n)
		}
	}
	p.ApplyRaft(RaftApply{Group: 1, Replica: 1, State: RaftAppliedState{Index: 99, Term: 1}, Done: func(err error) { done <- err }})
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("an apply after Close: %v, want ErrClosed", err)
	}
}

// TestReplicated_AWaitedApplyIsNotHeldForMore: the applier holds a small
// batch for applyWait in the hope of more; a RaftApply someone waits for (a
// leader's proposal returns only once applied) goes at once. With the wait
// set to an hour, the unwaited apply is still held when the waited one,
// queued after it, has taken both into Badger.
func TestReplicated_AWaitedApplyIsNotHeldForMore(t *testing.T) {
	withApplyWait(t, time.Hour)
	db := openReplicated(t, t.TempDir(), 0)
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	apply := func(group uint64, key string, waited bool) chan error {
		done := make(chan error, 1)
		p.ApplyRaft(RaftApply{Group: group, Replica: 1, State: RaftAppliedState{Index: 1, Term: 1},
			Changes: [][]byte{AppendChanges(nil, set(key, "1"))}, Waited: waited, Done: func(err error) { done <- err }})
		return done
	}
	first := apply(1, "a", false)
	select {
	case err := <-first:
		t.Fatalf("an unwaited apply went to Badger without the applier's wait (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	second := apply(2, "b", true)
	for i, ch := range []chan error{first, second} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("apply %d: %v", i+1, err)
			}
		case <-time.After(10 * time.Second):
			p.hurry <- struct{}{} // let Close end the applier's hour
			t.Fatalf("apply %d still held 10 s after a waited apply was queued", i+1)
		}
	}
	for _, k := range []string{"a", "b"} {
		if got := getString(t, db, k); got != "1" {
			t.Errorf("%s = %s, want 1", k, got)
		}
	}
}
