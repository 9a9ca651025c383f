package persistence

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// pbEnts returns entries from index from on with the given terms, each with
// data naming its index and term.
func pbEnts(from uint64, terms ...uint64) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i, t := range terms {
		idx := from + uint64(i)
		out = append(out, &raftpb.Entry{Index: new(idx), Term: new(t), Type: raftpb.EntryNormal.Enum(), Data: fmt.Appendf(nil, "entry %d term %d", idx, t)})
	}
	return out
}

func pbHS(term, vote, commit uint64) *raftpb.HardState {
	return &raftpb.HardState{Term: new(term), Vote: new(vote), Commit: new(commit)}
}

// waitDone waits for a raft job's Done and returns its error.
func waitDone(t testing.TB, what string, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return nil
	}
}

// appendRaft appends to group g replica r through p, synced, and waits.
func appendRaft(t testing.TB, p *Pipeline, g, r uint64, hs *raftpb.HardState, ents []*raftpb.Entry) error {
	t.Helper()
	ch := make(chan error, 1)
	p.AppendRaft(RaftAppend{Group: g, Replica: r, Entries: ents, HardState: hs, Sync: true, Done: func(err error) { ch <- err }})
	return waitDone(t, "a raft append", ch)
}

// termOf returns the term of entry i of group g replica r (0 for index 0, or
// an index the log does not hold: a truncation test may want it refused).
func termOf(t testing.TB, p *Pipeline, g, r, i uint64) uint64 {
	t.Helper()
	term, err := p.db.RaftStorage(g, r, nil).Term(i)
	if err != nil {
		return 0
	}
	return term
}

// truncateRaft truncates group g replica r's log to first through p and
// waits (it rides along: a barrier makes the committer commit).
func truncateRaft(t testing.TB, p *Pipeline, g, r, first uint64) error {
	t.Helper()
	ch := make(chan error, 1)
	p.TruncateRaft(g, r, first, termOf(t, p, g, r, first-1), nil, func(err error) { ch <- err })
	if err := p.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	return waitDone(t, "a raft truncation", ch)
}

func mustAppend(t testing.TB, p *Pipeline, g, r uint64, hs *raftpb.HardState, ents []*raftpb.Entry) {
	t.Helper()
	if err := appendRaft(t, p, g, r, hs, ents); err != nil {
		t.Fatal(err)
	}
}

// storageFixture is a DB whose replica 1 of group 1 holds, like raft's
// storage tests' index(3).terms(3, 4, 5, ...), a log that starts after entry
// 3 of term 3 and holds entries 4.. of the given terms.
func storageFixture(t *testing.T, terms ...uint64) (*DB, *Pipeline, *RaftStorage) {
	t.Helper()
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{})
	mustAppend(t, p, 1, 1, nil, pbEnts(1, append([]uint64{1, 2, 3}, terms...)...))
	if err := truncateRaft(t, p, 1, 1, 4); err != nil {
		t.Fatal(err)
	}
	return db, p, db.RaftStorage(1, 1, nil)
}

func wantEnts(t *testing.T, got []*raftpb.Entry, from uint64, terms ...uint64) {
	t.Helper()
	want := pbEnts(from, terms...)
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d", len(got), len(want))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("entry %d: %v, want %v", i, got[i], want[i])
		}
	}
}

func TestRaftStorage_Term(t *testing.T) {
	_, _, s := storageFixture(t, 4, 5)
	for _, tt := range []struct {
		i     uint64
		werr  error
		wterm uint64
	}{
		{2, raft.ErrCompacted, 0},
		{3, nil, 3},
		{4, nil, 4},
		{5, nil, 5},
		{6, raft.ErrUnavailable, 0},
	} {
		term, err := s.Term(tt.i)
		if !errors.Is(err, tt.werr) || (tt.werr == nil && err != nil) || term != tt.wterm {
			t.Errorf("Term(%d) = %d, %v; want %d, %v", tt.i, term, err, tt.wterm, tt.werr)
		}
	}
}

func TestRaftStorage_Entries(t *testing.T) {
	_, _, s := storageFixture(t, 4, 5, 6)
	all := pbEnts(4, 4, 5, 6)
	sz := func(i int) uint64 { return uint64(proto.Size(all[i])) }
	for _, tt := range []struct {
		lo, hi, maxsize uint64
		werr            error
		wfrom           uint64
		wterms          []uint64
	}{
		{2, 6, math.MaxUint64, raft.ErrCompacted, 0, nil},
		{3, 4, math.MaxUint64, raft.ErrCompacted, 0, nil},
		{4, 5, math.MaxUint64, nil, 4, []uint64{4}},
		{4, 6, math.MaxUint64, nil, 4, []uint64{4, 5}},
		{4, 7, math.MaxUint64, nil, 4, []uint64{4, 5, 6}},
		// even if maxsize is zero, the first entry is returned
		{4, 7, 0, nil, 4, []uint64{4}},
		{4, 7, sz(0) + sz(1), nil, 4, []uint64{4, 5}},
		{4, 7, sz(0) + sz(1) + sz(2)/2, nil, 4, []uint64{4, 5}},
		{4, 7, sz(0) + sz(1) + sz(2) - 1, nil, 4, []uint64{4, 5}},
		{4, 7, sz(0) + sz(1) + sz(2), nil, 4, []uint64{4, 5, 6}},
		{4, 8, math.MaxUint64, raft.ErrUnavailable, 0, nil}, // past the last index
	} {
		got, err := s.Entries(tt.lo, tt.hi, tt.maxsize)
		if tt.werr != nil {
			if !errors.Is(err, tt.werr) {
				t.Errorf("Entries(%d, %d, %d): %v, want %v", tt.lo, tt.hi, tt.maxsize, err, tt.werr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Entries(%d, %d, %d): %v", tt.lo, tt.hi, tt.maxsize, err)
		}
		wantEnts(t, got, tt.wfrom, tt.wterms...)
	}
}

func TestRaftStorage_FirstAndLastIndex(t *testing.T) {
	_, p, s := storageFixture(t, 4, 5)
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first != 4 || last != 5 {
		t.Fatalf("first %d last %d, want 4 and 5", first, last)
	}
	mustAppend(t, p, 1, 1, nil, pbEnts(6, 5))
	if last, _ := s.LastIndex(); last != 6 {
		t.Fatalf("last %d after an append, want 6", last)
	}
	if err := truncateRaft(t, p, 1, 1, 5); err != nil {
		t.Fatal(err)
	}
	if first, _ := s.FirstIndex(); first != 5 {
		t.Fatalf("first %d after a truncation, want 5", first)
	}
	if term, _ := s.Term(4); term != 4 {
		t.Fatalf("Term(4) = %d after truncating to 5, want 4 (kept for matching)", term)
	}
	// A replica without a log has the empty one.
	e := (&DB{raft: newRaftIndex()}).RaftStorage(9, 1, nil)
	if first, _ := e.FirstIndex(); first != 1 {
		t.Fatalf("empty log's first index %d, want 1", first)
	}
	if last, _ := e.LastIndex(); last != 0 {
		t.Fatalf("empty log's last index %d, want 0", last)
	}
	if term, err := e.Term(0); term != 0 || err != nil {
		t.Fatalf("empty log's Term(0) = %d, %v", term, err)
	}
}

// TestRaftStorage_Truncate mirrors raft's TestStorageCompact: truncations to
// the same or a lower first index fail, a truncation past the last index fails.
func TestRaftStorage_Truncate(t *testing.T) {
	for _, tt := range []struct {
		first  uint64
		wok    bool
		wfirst uint64
		wterm  uint64 // Term(first-1)
	}{
		{2, false, 4, 3}, // below the first index
		{4, true, 4, 3},  // the same: nothing changes
		{5, true, 5, 4},
		{7, true, 7, 6}, // last+1: an empty log
		{8, false, 4, 3},
	} {
		t.Run(fmt.Sprint(tt.first), func(t *testing.T) {
			_, p, s := storageFixture(t, 4, 5, 6)
			err := truncateRaft(t, p, 1, 1, tt.first)
			if (err == nil) != tt.wok {
				t.Fatalf("truncate to %d: %v, want ok=%v", tt.first, err, tt.wok)
			}
			first, _ := s.FirstIndex()
			term, _ := s.Term(first - 1)
			if first != tt.wfirst || term != tt.wterm {
				t.Fatalf("first %d (term before it %d), want %d (%d)", first, term, tt.wfirst, tt.wterm)
			}
			if last, _ := s.LastIndex(); last != 6 {
				t.Fatalf("last %d, want 6", last)
			}
		})
	}
}

// TestRaftStorage_Append mirrors raft's TestStorageAppend: an append that
// starts at or below the last index overwrites the suffix from there (a new
// leader's); one that leaves a gap, or starts below the first index, fails and
// changes nothing.
func TestRaftStorage_Append(t *testing.T) {
	for _, tt := range []struct {
		name   string
		from   uint64
		terms  []uint64
		wok    bool
		wterms []uint64 // of entries 4..
	}{
		{"the same entries", 4, []uint64{4, 5}, true, []uint64{4, 5}},
		{"a conflict at the first entry", 4, []uint64{6, 6}, true, []uint64{6, 6}},
		{"a conflict in the middle", 5, []uint64{6, 6}, true, []uint64{4, 6, 6}},
		{"more entries", 4, []uint64{4, 5, 5}, true, []uint64{4, 5, 5}},
		{"a direct append", 6, []uint64{5}, true, []uint64{4, 5, 5}},
		{"a gap", 7, []uint64{5}, false, []uint64{4, 5}},
		{"below the first index", 3, []uint64{3, 4, 5}, false, []uint64{4, 5}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, p, s := storageFixture(t, 4, 5)
			err := appendRaft(t, p, 1, 1, nil, pbEnts(tt.from, tt.terms...))
			if (err == nil) != tt.wok {
				t.Fatalf("append: %v, want ok=%v", err, tt.wok)
			}
			last, _ := s.LastIndex()
			got, err := s.Entries(4, last+1, math.MaxUint64)
			if err != nil {
				t.Fatal(err)
			}
			var terms []uint64
			for _, e := range got {
				terms = append(terms, e.GetTerm())
			}
			if fmt.Sprint(terms) != fmt.Sprint(tt.wterms) {
				t.Fatalf("terms %v, want %v", terms, tt.wterms)
			}
		})
	}
}

func TestRaftStorage_InitialStateAndSnapshot(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{})
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	s := db.RaftStorage(5, 2, func() *raftpb.ConfState { return cs })
	hs, gotCS, err := s.InitialState()
	if err != nil || !raft.IsEmptyHardState(hs) || !proto.Equal(gotCS, cs) {
		t.Fatalf("InitialState of a new replica: %v %v %v", hs, gotCS, err)
	}
	snap, err := s.Snapshot()
	if err != nil || snap.GetMetadata().GetIndex() != 0 || !proto.Equal(snap.GetMetadata().GetConfState(), cs) {
		t.Fatalf("Snapshot of a new replica: %v %v", snap, err)
	}
	mustAppend(t, p, 5, 2, pbHS(2, 3, 1), pbEnts(1, 1, 2))
	hs, _, _ = s.InitialState()
	if !proto.Equal(hs, pbHS(2, 3, 1)) {
		t.Fatalf("HardState %v, want term 2 vote 3 commit 1", hs)
	}
	// A HardState alone, not synced (a commit-only change), rides in the next record.
	ch := make(chan error, 1)
	p.AppendRaft(RaftAppend{Group: 5, Replica: 2, HardState: pbHS(2, 3, 2), Done: func(err error) { ch <- err }})
	if err := p.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := waitDone(t, "the commit-only append", ch); err != nil {
		t.Fatal(err)
	}
	if hs, _, _ = s.InitialState(); hs.GetCommit() != 2 {
		t.Fatalf("commit %d, want 2", hs.GetCommit())
	}
	if err := truncateRaft(t, p, 5, 2, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Snapshot(); !errors.Is(err, raft.ErrSnapshotTemporarilyUnavailable) {
		t.Fatalf("Snapshot of a truncated log: %v, want ErrSnapshotTemporarilyUnavailable (snapshots: step 6)", err)
	}
	// A commit past the last index is refused before it is logged.
	if err := appendRaft(t, p, 5, 2, pbHS(2, 3, 9), nil); err == nil {
		t.Fatal("a HardState committing past the last index was logged")
	}
}

// TestRaftStorage_ReadsEntriesBeyondTheCacheFromTheLog: with a cache too small
// for them, entries are read back from their segments, also after a reopen
// (replay) and across segment rotations.
func TestRaftStorage_ReadsEntriesBeyondTheCacheFromTheLog(t *testing.T) {
	old := raftCacheBytes
	raftCacheBytes = 64
	t.Cleanup(func() { raftCacheBytes = old })
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 4096}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	var terms []uint64
	for i := uint64(1); i <= 200; i++ {
		term := 1 + i/50
		terms = append(terms, term)
		mustAppend(t, p, 1, 1, pbHS(term, 1, i-1), pbEnts(i, term))
		if i%20 == 0 {
			mustAppend(t, p, 2, 7, nil, pbEnts(i/20, 1)) // another group, in the same segments
		}
	}
	check := func(db *DB) {
		t.Helper()
		s := db.RaftStorage(1, 1, nil)
		got, err := s.Entries(1, 201, math.MaxUint64)
		if err != nil {
			t.Fatal(err)
		}
		wantEnts(t, got, 1, terms...)
		if hs, _, _ := s.InitialState(); !proto.Equal(hs, pbHS(5, 1, 199)) {
			t.Fatalf("HardState %v", hs)
		}
		got, err = db.RaftStorage(2, 7, nil).Entries(1, 11, math.MaxUint64)
		if err != nil {
			t.Fatal(err)
		}
		wantEnts(t, got, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
	}
	check(db)
	if db.wal.segments() < 3 {
		t.Fatalf("%d segments: the test wants rotations", db.wal.segments())
	}
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	check(db)
}

// truncateRaftConf is truncateRaft with the configuration as of first-1.
func truncateRaftConf(t testing.TB, p *Pipeline, g, r, first uint64, cs *raftpb.ConfState) {
	t.Helper()
	b, err := proto.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 1)
	p.TruncateRaft(g, r, first, termOf(t, p, g, r, first-1), b, func(err error) { ch <- err })
	if err := p.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := waitDone(t, "a raft truncation", ch); err != nil {
		t.Fatal(err)
	}
}

// TestRaftStorage_TheTruncationPointKeepsItsConfiguration: a truncation
// records the replica's configuration as of its new first index - 1, which
// InitialState and the snapshot metadata give from then on (a replica
// restarts from there), and which survives a reopen whose replay starts
// after the truncation's own record (the state record every segment starts
// with carries it). A truncation without one keeps the one before; a
// bootstrap is a truncation of an empty log to index 1.
func TestRaftStorage_TheTruncationPointKeepsItsConfiguration(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 4096}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	fallback := &raftpb.ConfState{Voters: []uint64{9}}
	storage := func(db *DB) *RaftStorage {
		return db.RaftStorage(1, 1, func() *raftpb.ConfState { return fallback })
	}
	wantConf := func(db *DB, want *raftpb.ConfState) {
		t.Helper()
		_, cs, err := storage(db).InitialState()
		if err != nil || !proto.Equal(cs, want) {
			t.Fatalf("InitialState's ConfState %v (%v), want %v", cs, err, want)
		}
	}
	wantConf(db, fallback) // nothing logged yet
	boot := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	truncateRaftConf(t, p, 1, 1, 1, boot)
	wantConf(db, boot)
	if snap, err := storage(db).Snapshot(); err != nil || !proto.Equal(snap.GetMetadata().GetConfState(), boot) {
		t.Fatalf("Snapshot of the bootstrapped log: %v %v", snap, err)
	}
	for i := uint64(1); i <= 40; i++ {
		mustAppend(t, p, 1, 1, pbHS(1, 1, i-1), paddedEnt(i, 1))
	}
	moved := &raftpb.ConfState{Voters: []uint64{1, 2, 4}, Learners: []uint64{5}}
	truncateRaftConf(t, p, 1, 1, 21, moved)
	wantConf(db, moved)
	for i := uint64(41); i <= 80; i++ {
		mustAppend(t, p, 1, 1, pbHS(1, 1, i-1), paddedEnt(i, 1))
	}
	if err := truncateRaft(t, p, 1, 1, 61); err != nil { // keeps moved
		t.Fatal(err)
	}
	wantConf(db, moved)
	segs := db.wal.segments()
	flushAndRelease(t, p)
	if got := db.wal.segments(); got >= segs-2 {
		t.Fatalf("%d segments of %d after the truncation: the record of the truncation to 21 was not released", got, segs)
	}
	db = reopen(t, p, db, cfg)
	wantConf(db, moved)
	if first, _ := storage(db).FirstIndex(); first != 61 {
		t.Fatalf("first index %d after reopen, want 61", first)
	}
}

// TestRaftRecord_AConfigurationPastThePayloadDoesNotDecode: a truncation whose
// configuration claims more bytes than the record holds is corruption.
func TestRaftRecord_AConfigurationPastThePayloadDoesNotDecode(t *testing.T) {
	p := appendRaftTruncate(nil, raftTruncation{key: raftKey{1, 1}, first: 3, prevTerm: 1, conf: logConf{set: true, cs: "abc"}})
	if _, _, _, _, err := decodeAll(p); err != nil {
		t.Fatalf("a good truncation: %v", err)
	}
	bad := append([]byte(nil), p[:len(p)-4]...) // the length says 3 bytes, none follow
	bad = append(bad, 4)
	if _, _, _, _, err := decodeAll(bad); !errors.Is(err, errCorrupt) {
		t.Fatalf("a configuration past the payload: %v, want errCorrupt", err)
	}
}

// TestRaftStorage_ASnapshotPointBeyondTheLogEmptiesIt: a truncation that
// carries a configuration may start the log beyond its last index (a new
// group's bootstrap point, or a snapshot's): the log is then empty, its
// first index - 1 has the given term, appends continue from there, and a
// reopen replays it so. One without a configuration is refused as before.
func TestRaftStorage_ASnapshotPointBeyondTheLogEmptiesIt(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startPipeline(t, db, PipelineConfig{})
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	b, err := proto.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	truncate := func(g, first, prevTerm uint64, conf []byte) error {
		ch := make(chan error, 1)
		p.TruncateRaft(g, 1, first, prevTerm, conf, func(err error) { ch <- err })
		if err := p.Barrier(context.Background()); err != nil {
			t.Fatal(err)
		}
		return waitDone(t, "a raft truncation", ch)
	}
	if err := truncate(1, 2, 1, b); err != nil { // a bootstrap at index 1 of term 1
		t.Fatal(err)
	}
	mustAppend(t, p, 1, 1, pbHS(1, 1, 1), pbEnts(2, 1, 1))
	// Group 2 holds entries 1..3, then a snapshot at 10 of term 4 replaces them.
	mustAppend(t, p, 2, 1, nil, pbEnts(1, 1, 1, 2))
	if err := truncate(2, 11, 4, b); err != nil {
		t.Fatal(err)
	}
	if err := truncate(3, 5, 1, nil); err == nil {
		t.Fatal("a truncation past an empty log without a configuration was logged")
	}
	check := func(db *DB) {
		t.Helper()
		for _, tc := range []struct{ g, first, last, prev, prevTerm uint64 }{{1, 2, 3, 1, 1}, {2, 11, 10, 10, 4}} {
			s := db.RaftStorage(tc.g, 1, nil)
			first, _ := s.FirstIndex()
			last, _ := s.LastIndex()
			term, err := s.Term(tc.prev)
			_, gotCS, _ := s.InitialState()
			if first != tc.first || last != tc.last || err != nil || term != tc.prevTerm || !proto.Equal(gotCS, cs) {
				t.Fatalf("group %d: log %d..%d, Term(%d) = %d (%v), conf %v; want %d..%d, term %d, %v", tc.g, first, last, tc.prev, term, err, gotCS, tc.first, tc.last, tc.prevTerm, cs)
			}
		}
	}
	check(db)
	db = reopen(t, p, db, cfg)
	check(db)
}
