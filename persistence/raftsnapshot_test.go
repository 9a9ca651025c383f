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

	"go.etcd.io/raft/v3/raftpb"
)

// pkey is key s of partition g.
func pkey(g uint32, s string) string { return string(PartitionPrefix(g)) + s }

// snapChunk encodes sets of partition g as one snapshot chunk.
func snapChunk(g uint32, kvs ...string) []byte {
	w := &Write{}
	for i := 0; i+1 < len(kvs); i += 2 {
		w.Sets = append(w.Sets, KV{Key: []byte(pkey(g, kvs[i])), Value: []byte(kvs[i+1])})
	}
	return AppendChanges(nil, w)
}

// stage writes chunks to a new staged snapshot of group g, replica 1.
func stage(t *testing.T, db *DB, g uint32, chunks ...[]byte) RaftSnapshotRef {
	t.Helper()
	s, err := db.StageRaftSnapshot(uint64(g), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chunks {
		if err := s.Append(c); err != nil {
			t.Fatal(err)
		}
	}
	ref, err := s.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// appendSnapshot logs a snapshot of group g (replica 1) at index (term 2)
// and waits until it is durable; installed gets the installation's outcome.
func appendSnapshot(t *testing.T, p *Pipeline, g uint32, index uint64, ref RaftSnapshotRef, installed chan error) {
	t.Helper()
	done := make(chan error, 1)
	p.AppendRaft(RaftAppend{Group: uint64(g), Replica: 1, Sync: true,
		HardState: &raftpb.HardState{Term: new(uint64(2)), Vote: new(uint64(0)), Commit: new(index)},
		Snapshot: &RaftSnapshot{Index: index, Term: 2, ConfState: []byte("conf"), Ref: ref,
			Installed: func(err error) { installed <- err }},
		Done: func(err error) { done <- err }})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func stagedFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, snapDir, "*.snap"))
	return names
}

func wantPartition(t *testing.T, db *DB, g uint32, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	err := db.Scan(context.Background(), PartitionPrefix(g), nil, nil, func(k, v []byte) (bool, error) {
		got[strings.TrimPrefix(string(k), string(PartitionPrefix(g)))] = string(v)
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("partition %d holds %v, want %v", g, got, want)
	}
}

// TestRaftSnapshot_InstallReplacesThePartitionAndResetsTheLog: a snapshot
// logged with op 8 resets the replica's log to start after it (with its
// configuration), and the applier makes the partition exactly the
// snapshot's (keys it lacks deleted, others set), leaving other partitions
// alone. Until a truncation says Badger flushed it, every Open installs it
// again from its staged file; the truncation removes the file.
func TestRaftSnapshot_InstallReplacesThePartitionAndResetsTheLog(t *testing.T) {
	dir := t.TempDir()
	db := openReplicated(t, dir, 0)
	p := NewPipeline(db, PipelineConfig{ValueLogGCEvery: -1})
	p.Start()
	old := &Write{Sets: []KV{{Key: []byte(pkey(3, "a")), Value: []byte("old")}, {Key: []byte(pkey(3, "b")), Value: []byte("old")},
		{Key: []byte(pkey(3, "c")), Value: []byte("same")}, {Key: []byte(pkey(4, "a")), Value: []byte("other")}}}
	applyRaft(t, p, 3, 5, old)
	appendEnts(t, p, 3, ents(1, 1, 1, 1, 1, 1, 1, 1, 1)...) // a log the snapshot replaces
	ref := stage(t, db, 3, snapChunk(3, "b", "new", "c", "same"), snapChunk(3, "d", "d1"), snapChunk(3, "e", "e1"))
	installed := make(chan error, 1)
	appendSnapshot(t, p, 3, 20, ref, installed)
	s := db.RaftStorage(3, 1, nil)
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	term, _ := s.Term(20)
	if first != 21 || last != 20 || term != 2 {
		t.Fatalf("log after the snapshot: first %d last %d term(20) %d; want 21, 20, 2", first, last, term)
	}
	if err := <-installed; err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"b": "new", "c": "same", "d": "d1", "e": "e1"}
	wantPartition(t, db, 3, want)
	wantPartition(t, db, 4, map[string]string{"a": "other"})
	if n := len(stagedFiles(t, dir)); n != 1 {
		t.Fatalf("%d staged files, want the snapshot's", n)
	}

	// A crash (the log kept) installs it again at Open, over whatever
	// Badger holds (here: a later entry the restart applies again).
	applyRaft(t, p, 3, 21, set(pkey(3, "e"), "later"))
	p.Close()
	closeDB(t, db)
	db = openReplicated(t, dir, 0)
	wantPartition(t, db, 3, want)
	p = startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})

	// Flushed, then truncated at the snapshot: the ref goes, and the file
	// once the truncation is durable; Open installs nothing any more.
	applyRaft(t, p, 3, 20, &Write{})
	flushAndRelease(t, p)
	if f, ok := p.RaftFlushed(3, 1); !ok || f.Index < 20 {
		t.Fatalf("flushed %+v %v", f, ok)
	}
	if err := truncateRaft(t, p, 3, 1, 21); err != nil {
		t.Fatal(err)
	}
	if n := len(stagedFiles(t, dir)); n != 0 {
		t.Fatalf("%d staged files after the truncation, want none", n)
	}
	p.Close()
	closeDB(t, db)
	db = openReplicated(t, dir, 0)
	t.Cleanup(func() { _ = db.Close() })
	if ps := db.raft.pendingSnapshots(); len(ps) != 0 {
		t.Fatalf("pending snapshots after the truncation: %v", ps)
	}
	wantPartition(t, db, 3, want)
}

func appendEnts(t *testing.T, p *Pipeline, g uint64, es ...raftEntry) {
	t.Helper()
	var pe []*raftpb.Entry
	for _, e := range es {
		pe = append(pe, &raftpb.Entry{Index: new(e.index), Term: new(e.term), Type: raftpb.EntryNormal.Enum(), Data: e.data})
	}
	done := make(chan error, 1)
	p.AppendRaft(RaftAppend{Group: g, Replica: 1, Entries: pe, Sync: true, Done: func(err error) { done <- err }})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestRaftSnapshot_ADurableEndIsInstalledAtOpenIfBadgerNeverGotIt: once op
// 8 is durable the snapshot is the replica's state, whether the applier
// installed it or not: here Badger refuses every batch until the node
// stops, and the next Open installs it from the staged file.
func TestRaftSnapshot_ADurableEndIsInstalledAtOpenIfBadgerNeverGotIt(t *testing.T) {
	dir := t.TempDir()
	db := openReplicated(t, dir, 0)
	p := NewPipeline(db, PipelineConfig{ValueLogGCEvery: -1})
	p.Start()
	applyRaft(t, p, 3, 5, set(pkey(3, "a"), "old"))
	fault := installApplyFault(t, syscall.ENOSPC)
	fault.failing.Store(true)
	ref := stage(t, db, 3, snapChunk(3, "b", "1"), snapChunk(3, "c", "2"))
	installed := make(chan error, 1)
	appendSnapshot(t, p, 3, 9, ref, installed)
	wantPartition(t, db, 3, map[string]string{"a": "old"})
	p.Close()
	if err := <-installed; !errors.Is(err, ErrClosed) {
		t.Fatalf("installation: %v, want ErrClosed", err)
	}
	closeDB(t, db)
	fault.failing.Store(false)
	db = openReplicated(t, dir, 0)
	t.Cleanup(func() { _ = db.Close() })
	wantPartition(t, db, 3, map[string]string{"b": "1", "c": "2"})
	if first, _ := db.RaftStorage(3, 1, nil).FirstIndex(); first != 10 {
		t.Fatalf("first index %d after the reopen, want 10", first)
	}
}

// TestRaftSnapshot_ACrashBeforeTheEndLeavesTheOldState: chunks staged
// without op 8 (a crash mid-stream, or a stream raft never took) change
// nothing, and Open removes them.
func TestRaftSnapshot_ACrashBeforeTheEndLeavesTheOldState(t *testing.T) {
	dir := t.TempDir()
	db := openReplicated(t, dir, 0)
	p := NewPipeline(db, PipelineConfig{ValueLogGCEvery: -1})
	p.Start()
	applyRaft(t, p, 3, 5, set(pkey(3, "a"), "old"))
	appendEnts(t, p, 3, ents(1, 1, 1)...)
	stage(t, db, 3, snapChunk(3, "b", "1")) // finished, never logged
	s, err := db.StageRaftSnapshot(3, 1)    // mid-stream
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Append(snapChunk(3, "x", "1")); err != nil {
		t.Fatal(err)
	}
	p.Close()
	closeDB(t, db)
	if n := len(stagedFiles(t, dir)); n != 2 {
		t.Fatalf("%d staged files before the reopen, want 2", n)
	}
	db = openReplicated(t, dir, 0)
	t.Cleanup(func() { _ = db.Close() })
	wantPartition(t, db, 3, map[string]string{"a": "old"})
	if last, _ := db.RaftStorage(3, 1, nil).LastIndex(); last != 2 {
		t.Fatalf("last index %d, want the old log's 2", last)
	}
	if n := len(stagedFiles(t, dir)); n != 0 {
		t.Fatalf("%d staged files after the reopen, want none", n)
	}
}

// TestRaftSnapshot_ADamagedStagedFileStopsOpen: a snapshot the log says is
// the replica's state, whose staged file fails a checksum or is cut short,
// stops Open with a CorruptionError naming the file and the chunk's offset.
func TestRaftSnapshot_ADamagedStagedFileStopsOpen(t *testing.T) {
	for _, damage := range []string{"flipped", "cut"} {
		t.Run(damage, func(t *testing.T) {
			dir := t.TempDir()
			db := openReplicated(t, dir, 0)
			p := NewPipeline(db, PipelineConfig{ValueLogGCEvery: -1})
			p.Start()
			c1, c2 := snapChunk(3, "a", "1"), snapChunk(3, "b", "2")
			ref := stage(t, db, 3, c1, c2)
			installed := make(chan error, 1)
			appendSnapshot(t, p, 3, 9, ref, installed)
			if err := <-installed; err != nil {
				t.Fatal(err)
			}
			p.Close()
			closeDB(t, db)
			path := stagedFiles(t, dir)[0]
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			at := int64(stagedChunkHeader + len(c1)) // the second chunk
			if damage == "flipped" {
				b[len(b)-1] ^= 1
			} else {
				b = b[:len(b)-1]
			}
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = Open(Config{Dir: dir, Replicated: true})
			var ce *CorruptionError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.File != path || ce.Offset != at || ce.Group != 3 || ce.Index != 9 {
				t.Fatalf("open: %v, want a CorruptionError at %s:%d", err, path, at)
			}
		})
	}
}

// TestRaftSnapshot_AnEndRecordThatDoesNotMakeSenseIsCorruption: op 8 is
// checked like the other raft changes: one that does not decode, or that
// takes the log back below its first index, stops Open at its record.
func TestRaftSnapshot_AnEndRecordThatDoesNotMakeSenseIsCorruption(t *testing.T) {
	good := raftSnapshot{key: raftKey{3, 1}, index: 9, term: 2, conf: logConf{set: true, cs: "c"}, ref: snapRef{id: 5, size: 0, chunks: 0}}
	noConf := good
	noConf.conf = logConf{}
	t.Run("undecodable", func(t *testing.T) {
		dir := t.TempDir()
		at := craftLog(t, dir, block(3, 1, nil, 1, 1), appendRaftSnapshot(nil, &noConf))
		_, err := Open(Config{Dir: dir})
		var ce *CorruptionError
		if !errors.As(err, &ce) || ce.File != at[1].path || ce.Offset != at[1].off {
			t.Fatalf("open: %v, want a corruption at %v", err, at[1])
		}
	})
	t.Run("backwards", func(t *testing.T) {
		dir := t.TempDir()
		back := good
		back.index = 3
		at := craftLog(t, dir, appendRaftTruncate(nil, raftTruncation{key: raftKey{3, 1}, first: 10, prevTerm: 1, conf: logConf{set: true, cs: "c"}}),
			appendRaftSnapshot(nil, &back))
		_, err := Open(Config{Dir: dir})
		wantRaftCorrupt(t, err, at[1], 3, 1, 3, "goes back below")
	})
}

// TestRaftSnapshot_TheStateRecordCarriesTheRef: a snapshot whose op 8 is in
// a segment released since is still known, from the state record a later
// segment starts with, and installed again.
func TestRaftSnapshot_TheStateRecordCarriesTheRef(t *testing.T) {
	st := []replicaState{{key: raftKey{3, 1}, first: 10, prevTerm: 2, last: 9, lastTerm: 2, conf: logConf{set: true, cs: "c"}, snap: snapRef{id: 7, size: 30, chunks: 2}}}
	d := raftDecoder{p: appendRaftState(nil, st), pos: 1}
	got, err := d.state(nil)
	if err != nil || len(got) != 1 || got[0] != st[0] {
		t.Fatalf("state round trip: %+v, %v", got, err)
	}
	// A log whose only raft record is a state record naming a snapshot (the
	// segment with its op 8 was released): Open installs it.
	dir := t.TempDir()
	db := openReplicated(t, dir, 0)
	ref := stage(t, db, 3, snapChunk(3, "a", "1"))
	st[0].snap = snapRef{id: ref.ID, size: ref.Size, chunks: ref.Chunks}
	seq := db.lastSeq + 1
	if err := db.wal.commit(seq, appendRaftState(nil, st)); err != nil {
		t.Fatal(err)
	}
	db.lastSeq = seq
	db.keepLog = true // as after a crash: the index never saw the record
	closeDB(t, db)
	db = openReplicated(t, dir, 0)
	t.Cleanup(func() { _ = db.Close() })
	wantPartition(t, db, 3, map[string]string{"a": "1"})
	if n := len(stagedFiles(t, dir)); n != 1 {
		t.Fatalf("%d staged files, want the one the state names", n)
	}
}

// TestRaftSnapshot_OnlyTheNewestReplicasSnapshotIsInstalledAtOpen: a node
// holds the log of a replica its group removed (replica 1, whose snapshot
// Badger never flushed, so its log still names it) beside the group's
// current replica here (replica 2), which applied later writes that Badger
// flushed. Open must not put the partition back to replica 1's snapshot (it
// did, in map order: the torture tool's five-node runs read logs that
// jumped back).
func TestRaftSnapshot_OnlyTheNewestReplicasSnapshotIsInstalledAtOpen(t *testing.T) {
	dir := t.TempDir()
	db := openReplicated(t, dir, 0)
	p := NewPipeline(db, PipelineConfig{ValueLogGCEvery: -1})
	p.Start()
	ref := stage(t, db, 3, snapChunk(3, "a", "old-snapshot"))
	installed := make(chan error, 1)
	appendSnapshot(t, p, 3, 9, ref, installed)
	if err := <-installed; err != nil {
		t.Fatal(err)
	}
	// Replica 2 of the same group, later: its own log, its writes applied
	// and flushed.
	truncateRaftConf(t, p, 3, 2, 1, &raftpb.ConfState{Voters: []uint64{2}})
	mustAppend(t, p, 3, 2, &raftpb.HardState{Term: new(uint64(5)), Vote: new(uint64(2)), Commit: new(uint64(1))},
		[]*raftpb.Entry{{Index: new(uint64(1)), Term: new(uint64(5)), Type: raftpb.EntryNormal.Enum()}})
	done := make(chan error, 1)
	p.ApplyRaft(RaftApply{Group: 3, Replica: 2, State: RaftAppliedState{Index: 1, Term: 5, ConfState: []byte("conf2")},
		Changes: [][]byte{AppendChanges(nil, &Write{Sets: []KV{{Key: []byte(pkey(3, "a")), Value: []byte("current")}, {Key: []byte(pkey(3, "b")), Value: []byte("current")}}})},
		Done:    func(err error) { done <- err }})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	flushAndRelease(t, p)
	want := map[string]string{"a": "current", "b": "current"}
	wantPartition(t, db, 3, want)
	p.Close()
	closeDB(t, db)
	db = openReplicated(t, dir, 0)
	t.Cleanup(func() { _ = db.Close() })
	if _, ok := db.raft.pendingSnapshots()[raftKey{3, 1}]; !ok {
		t.Fatal("replica 1's log no longer names its snapshot: the test does not test anything")
	}
	wantPartition(t, db, 3, want)
}

// TestRaftSnapshot_AnOlderReplicasSnapshotIsNotInstalled: a snapshot of a
// replica the group replaced on this node (replica 1, once replica 2 has a
// log here) is never installed by the applier either: here the empty
// snapshot that ends a removed replica's data (replication's ForgetAndDelete) comes
// after the group's next replica applied its writes, and would delete them.
func TestRaftSnapshot_AnOlderReplicasSnapshotIsNotInstalled(t *testing.T) {
	dir := t.TempDir()
	db := openReplicated(t, dir, 0)
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	truncateRaftConf(t, p, 3, 2, 1, &raftpb.ConfState{Voters: []uint64{2}})
	mustAppend(t, p, 3, 2, &raftpb.HardState{Term: new(uint64(5)), Vote: new(uint64(2)), Commit: new(uint64(1))},
		[]*raftpb.Entry{{Index: new(uint64(1)), Term: new(uint64(5)), Type: raftpb.EntryNormal.Enum()}})
	done := make(chan error, 1)
	p.ApplyRaft(RaftApply{Group: 3, Replica: 2, State: RaftAppliedState{Index: 1, Term: 5, ConfState: []byte("conf2")},
		Changes: [][]byte{AppendChanges(nil, &Write{Sets: []KV{{Key: []byte(pkey(3, "a")), Value: []byte("current")}}})},
		Done:    func(err error) { done <- err }})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	installed := make(chan error, 1)
	appendSnapshot(t, p, 3, 9, stage(t, db, 3), installed) // replica 1, no chunks
	if err := <-installed; err != nil {
		t.Fatal(err)
	}
	wantPartition(t, db, 3, map[string]string{"a": "current"})

	// The newest replica's empty snapshot deletes every key of the
	// partition, and only of it.
	applyRaft(t, p, 4, 2, set(pkey(4, "x"), "other"))
	s2, err := db.StageRaftSnapshot(3, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := s2.Finish()
	if err != nil {
		t.Fatal(err)
	}
	ddone := make(chan error, 1)
	p.AppendRaft(RaftAppend{Group: 3, Replica: 2, Sync: true,
		Snapshot: &RaftSnapshot{Index: 1, Term: 5, ConfState: []byte("conf2"), Ref: ref, Installed: func(err error) { installed <- err }},
		Done:     func(err error) { ddone <- err }})
	if err := <-ddone; err != nil {
		t.Fatal(err)
	}
	if err := <-installed; err != nil {
		t.Fatal(err)
	}
	wantPartition(t, db, 3, map[string]string{})
	wantPartition(t, db, 4, map[string]string{"x": "other"})
}
