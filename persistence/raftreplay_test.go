package persistence

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// craftedRecord is where craftLog put one record.
type craftedRecord struct {
	path string
	off  int64
}

// craftLog writes payloads as records of a new log in dir, through the log
// alone (no checks of the committer), and leaves the directory as a crash
// does: Badger closed, the log kept.
func craftLog(t *testing.T, dir string, payloads ...[]byte) []craftedRecord {
	t.Helper()
	db := openTestDB(t, dir)
	var at []craftedRecord
	for _, p := range payloads {
		seq := db.lastSeq + 1
		if err := db.wal.commit(seq, p); err != nil {
			t.Fatal(err)
		}
		db.lastSeq = seq
		at = append(at, craftedRecord{path: db.wal.cur.path, off: db.wal.lastPayloadAt - recordHeader})
	}
	db.keepLog = true
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return at
}

func block(g, r uint64, hs *hardState, from uint64, terms ...uint64) []byte {
	b := raftBlock{key: raftKey{g, r}, ents: ents(from, terms...)}
	if hs != nil {
		b.hs, b.hasHS = *hs, true
	}
	return appendRaftBlock(nil, &b)
}

// wantRaftCorrupt checks that err is a *CorruptionError at at naming group,
// replica and index, whose reason mentions what.
func wantRaftCorrupt(t *testing.T, err error, at craftedRecord, g, r, index uint64, what string) {
	t.Helper()
	var ce *CorruptionError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open: %v, want a corruption error", err)
	}
	if ce.File != at.path || ce.Offset != at.off || ce.Group != g || ce.Replica != r || ce.Index != index || !strings.Contains(ce.Reason, what) {
		t.Fatalf("corruption at %s:%d group %d replica %d index %d (%s), want %s:%d group %d replica %d index %d mentioning %q",
			ce.File, ce.Offset, ce.Group, ce.Replica, ce.Index, ce.Reason, at.path, at.off, g, r, index, what)
	}
	if msg := err.Error(); !strings.Contains(msg, "group") || !strings.Contains(msg, at.path) {
		t.Fatalf("the error does not name the group and file: %s", msg)
	}
}

func TestRaftReplay_RefusesALogThatDoesNotContinue(t *testing.T) {
	hs := func(term, vote, commit uint64) *hardState { return &hardState{term, vote, commit} }
	for _, tt := range []struct {
		name     string
		payloads [][]byte
		bad      int // the record that fails
		g, r     uint64
		index    uint64
		what     string
	}{
		{"a gap", [][]byte{block(3, 1, nil, 1, 1, 1), block(3, 1, nil, 4, 1)}, 1, 3, 1, 4, "a gap: entry 4 follows the last index 2"},
		{"a gap at the start", [][]byte{block(3, 1, nil, 2, 1)}, 0, 3, 1, 2, "a gap"},
		{"a term going down", [][]byte{block(3, 1, nil, 1, 1, 2), block(3, 1, nil, 3, 1)}, 1, 3, 1, 3, "the term goes down"},
		{"an overwrite with a lower term", [][]byte{block(3, 1, nil, 1, 1, 2, 2), block(3, 1, nil, 3, 1)}, 1, 3, 1, 3, "the term goes down"},
		{"a HardState term going down", [][]byte{block(3, 1, hs(5, 1, 0), 1, 1), block(3, 1, hs(4, 1, 0), 2, 4)}, 1, 3, 1, 2, "HardState's term goes down"},
		{"a commit past the last index", [][]byte{block(3, 1, nil, 1, 1), block(3, 1, hs(1, 1, 3), 2, 1)}, 1, 3, 1, 3, "commit index 3 passes the last index 2"},
		{"a truncation past the last index", [][]byte{block(3, 1, nil, 1, 1), appendRaftTruncate(nil, raftTruncation{key: raftKey{3, 1}, first: 3, prevTerm: 1})}, 1, 3, 1, 3, "passes the last index"},
		{"an entry below the first index", [][]byte{block(3, 1, nil, 1, 1, 1), appendRaftTruncate(nil, raftTruncation{key: raftKey{3, 1}, first: 3, prevTerm: 1}), block(3, 1, nil, 2, 2)}, 2, 3, 1, 2, "below the log's first index 3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			// Another group's good log around the damage: it is not what fails.
			var payloads [][]byte
			for i, p := range tt.payloads {
				payloads = append(payloads, append(block(9, 2, nil, uint64(i+1), 1), p...))
			}
			at := craftLog(t, dir, payloads...)
			_, err := Open(Config{Dir: dir})
			wantRaftCorrupt(t, err, at[tt.bad], tt.g, tt.r, tt.index, tt.what)
		})
	}
}

// TestRaftReplay_AnUnknownOpIsCorruption: a record whose changes hold an op
// this version does not know stops Open like any record that does not decode.
func TestRaftReplay_AnUnknownOpIsCorruption(t *testing.T) {
	dir := t.TempDir()
	at := craftLog(t, dir, block(1, 1, nil, 1, 1), []byte{7, 1, 1, 0})
	_, err := Open(Config{Dir: dir})
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.File != at[1].path || ce.Offset != at[1].off || !strings.Contains(ce.Reason, "do not decode") {
		t.Fatalf("open: %v, want the corruption of a record that does not decode at %v", err, at[1])
	}
}

// TestRaftReplay_DropsATornLastRecordWithRaftBlocks: the newest segment's last
// record, cut short by a crash, is dropped as it is without raft (it was never
// synced, so never acknowledged): the logs end before it, and appends go on
// from there.
func TestRaftReplay_DropsATornLastRecordWithRaftBlocks(t *testing.T) {
	dir := t.TempDir()
	at := craftLog(t, dir,
		append(block(1, 1, &hardState{1, 1, 0}, 1, 1, 1), block(2, 1, nil, 1, 1)...),
		append(block(1, 1, &hardState{2, 1, 2}, 3, 2), block(2, 1, nil, 2, 1)...))
	flipByte(t, at[1].path, at[1].off+recordHeader+3) // a payload byte: its CRC fails
	db := openTestDB(t, dir)
	t.Cleanup(func() { _ = db.Close() })
	s := db.RaftStorage(1, 1, nil)
	if last, _ := s.LastIndex(); last != 2 {
		t.Fatalf("last index %d, want 2 (the torn record's entry 3 dropped)", last)
	}
	if hs, _, _ := s.InitialState(); hs.GetTerm() != 1 || hs.GetCommit() != 0 {
		t.Fatalf("HardState %v, want the one before the torn record", hs)
	}
	if last, _ := db.RaftStorage(2, 1, nil).LastIndex(); last != 1 {
		t.Fatalf("group 2 last index %d, want 1", last)
	}
	p := startPipeline(t, db, PipelineConfig{})
	mustAppend(t, p, 1, 1, pbHS(2, 1, 3), pbEnts(3, 2))
	got, err := s.Entries(1, 4, math.MaxUint64)
	if err != nil || len(got) != 3 || got[2].GetTerm() != 2 {
		t.Fatalf("entries after the append: %v %v", got, err)
	}
}

// TestRaftReplay_ACleanCloseKeepsTheRaftLog: a node holding raft logs keeps
// the write-ahead log on a clean close (a voter's tail and HardState live
// only there); the next Open replays it. A node without raft still removes it.
func TestRaftReplay_ACleanCloseKeepsTheRaftLog(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir)
	p := startPipeline(t, db, PipelineConfig{})
	mustAppend(t, p, 4, 2, pbHS(3, 2, 1), pbEnts(1, 2, 3))
	if err := p.Submit(set("k", "v")).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	db = reopen(t, p, db, Config{Dir: dir})
	s := db.RaftStorage(4, 2, nil)
	got, err := s.Entries(1, 3, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	wantEnts(t, got, 1, 2, 3)
	if hs, _, _ := s.InitialState(); !proto.Equal(hs, pbHS(3, 2, 1)) {
		t.Fatalf("HardState %v after a clean close", hs)
	}
	if v, found, _ := db.Get(context.Background(), []byte("k")); !found || string(v) != "v" {
		t.Fatal("the local write is gone")
	}

	single := t.TempDir()
	db2 := openTestDB(t, single)
	p2 := startPipeline(t, db2, PipelineConfig{})
	if err := p2.Submit(set("k", "v")).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	p2.Close()
	if err := db2.Close(); err != nil {
		t.Fatal(err)
	}
	if segs, _ := (&wal{dir: single + "/wal"}).segmentIDs(); len(segs) != 0 {
		t.Fatalf("a node without raft kept %d log segments on a clean close", len(segs))
	}
}

// flushAndRelease commits a local write, has the applier flush Badger's
// memtables to tables, then
// pokes the releaser until it has run with every record before the last
// applied batch flushed (it forgets the applied batches at or below what it
// could release).
func flushAndRelease(t *testing.T, p *Pipeline) {
	t.Helper()
	ctx := context.Background()
	// A local write last: records of raft changes alone put no version in
	// Badger, so only a later local record flushed shows them flushed.
	if err := p.Submit(set("flush", "x")).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	reply := make(chan error)
	p.flushes <- reply
	if err := <-reply; err != nil {
		t.Fatal(err)
	}
	p.batchMu.Lock()
	var target uint64 // the last applied batch's version
	if len(p.batches) > 0 {
		target = p.batches[len(p.batches)-1].version
	}
	p.batchMu.Unlock()
	waitFor(t, "the releaser to run", func() bool {
		p.batchMu.Lock()
		// The last batch stays (DB.releasable: it may span two memtables).
		forgotten := len(p.batches) == 0 || p.batches[0].version >= target
		p.batchMu.Unlock()
		if !forgotten {
			select {
			case p.releaseCh <- struct{}{}:
			default:
			}
		}
		return forgotten
	})
}

// TestRaftRelease_ASegmentStaysUntilEveryGroupTruncatedPastIt: segments whose
// local records Badger holds in synced tables are released only once every
// replica's entries in them are below its first index; after a truncation,
// exactly the segments below it go, and a reopen (replaying from the state
// record the first kept segment starts with) reads the log that is left.
func TestRaftRelease_ASegmentStaysUntilEveryGroupTruncatedPastIt(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 4096}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	ctx := context.Background()
	const n = 120
	for i := uint64(1); i <= n; i++ {
		mustAppend(t, p, 1, 1, pbHS(1, 1, i-1), paddedEnt(i, 1))
		if i <= 10 {
			mustAppend(t, p, 2, 1, nil, pbEnts(i, 1)) // group 2 only in the first segment
		}
		if err := p.Submit(set("k", string(rune('a'+i%26)))).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	segs := db.wal.segments()
	if segs < 5 {
		t.Fatalf("%d segments: the test wants more", segs)
	}
	flushAndRelease(t, p)
	if got := db.wal.segments(); got != segs {
		// Nothing released: every segment holds entries of group 1 at or
		// above its first index (1).
		t.Fatalf("%d segments after a release, want %d: a segment group 1 needs was released", got, segs)
	}
	// Group 1 gives up its entries below 61; group 2 still pins the first segment.
	if err := truncateRaft(t, p, 1, 1, 61); err != nil {
		t.Fatal(err)
	}
	flushAndRelease(t, p)
	if got := db.wal.segments(); got < segs {
		t.Fatalf("%d segments: released while group 2 still needs the first one", got)
	}
	if err := truncateRaft(t, p, 2, 1, 11); err != nil {
		t.Fatal(err)
	}
	flushAndRelease(t, p)
	after := db.wal.segments()
	if after >= segs-1 {
		t.Fatalf("%d segments of %d after both groups truncated: nothing released", after, segs)
	}
	// Every kept entry is readable, now and after a reopen that replays from
	// the first kept segment's state record.
	check := func(db *DB) {
		t.Helper()
		s := db.RaftStorage(1, 1, nil)
		if first, _ := s.FirstIndex(); first != 61 {
			t.Fatalf("first index %d, want 61", first)
		}
		got, err := s.Entries(61, n+1, math.MaxUint64)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != n-60 || got[0].GetIndex() != 61 {
			t.Fatalf("%d entries from %d", len(got), got[0].GetIndex())
		}
		if first, _ := db.RaftStorage(2, 1, nil).FirstIndex(); first != 11 {
			t.Fatalf("group 2 first index %d, want 11", first)
		}
	}
	check(db)
	db = reopen(t, p, db, cfg)
	check(db)
}

// TestRaftReplay_AMissingSegmentAReplicaNeedsIsCorruption: a log whose oldest
// segment, which a replica still needed, is gone stops Open naming the group
// and the first entry it lacks (the state record the next segment starts with
// says the log held it).
func TestRaftReplay_AMissingSegmentAReplicaNeedsIsCorruption(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 4096}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	for i := uint64(1); i <= 80; i++ {
		mustAppend(t, p, 6, 3, nil, paddedEnt(i, 1))
		// Local writes up to the end: Badger holds every seq, so the log
		// may start anywhere (only the raft log misses the segment).
		if err := p.Submit(set("k", "v")).Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	ids, _ := (&wal{dir: dir + "/wal"}).segmentIDs()
	if len(ids) < 3 {
		t.Fatalf("%d segments, want rotations", len(ids))
	}
	if err := os.Remove(segmentName(dir+"/wal", ids[0])); err != nil {
		t.Fatal(err)
	}
	_, err = Open(cfg)
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.Group != 6 || ce.Replica != 3 || ce.Index != 1 || !strings.Contains(ce.Reason, "no retained segment") {
		t.Fatalf("open: %v, want a corruption error naming group 6 replica 3 entry 1", err)
	}
}

// paddedEnt is entry index of term with 200 bytes of data: segments fill.
func paddedEnt(index, term uint64) []*raftpb.Entry {
	e := pbEnts(index, term)
	e[0].Data = append(e[0].Data, make([]byte, 200)...)
	return e
}

// TestRaftReplay_ATruncationKnowsTheTermBeforeIt: replay that starts at a
// segment whose state record names entries it has no record of (their
// segment was released) meets a truncation inside them: the truncation's own
// record gives the term of the entry before the new first index, which replay
// cannot know otherwise. (Replay used to take 0, then refused the next
// segment's state record as disagreeing with the log: the replicated
// power-cut test found it, 2 restarts in 16.)
func TestRaftReplay_ATruncationKnowsTheTermBeforeIt(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentSize: 4096}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	ctx := context.Background()
	next := uint64(1)
	appendUntilSegments := func(segs int) {
		t.Helper()
		for db.wal.segments() < segs {
			mustAppend(t, p, 1, 1, pbHS(2, 1, next-1), paddedEnt(next, 2))
			if err := p.Submit(set("k", fmt.Sprint(next))).Wait(ctx); err != nil {
				t.Fatal(err)
			}
			next++
		}
	}
	appendUntilSegments(3)
	started := next - 1 // the current segment's state record names 1..started
	// Entry 4's record is in the first segment; the truncation's record is
	// in the current one.
	if err := truncateRaft(t, p, 1, 1, 5); err != nil {
		t.Fatal(err)
	}
	appendUntilSegments(7)
	if err := truncateRaft(t, p, 1, 1, started+3); err != nil { // frees the segments before the current one
		t.Fatal(err)
	}
	segs := db.wal.segments()
	flushAndRelease(t, p)
	if got := db.wal.segments(); got > segs-2 {
		t.Fatalf("%d segments of %d after the release: the test needs the oldest ones gone", got, segs)
	}
	db = reopen(t, p, db, cfg)
	s := db.RaftStorage(1, 1, nil)
	if first, _ := s.FirstIndex(); first != started+3 {
		t.Fatalf("first index %d, want %d", first, started+3)
	}
	if term, err := s.Term(started + 2); err != nil || term != 2 {
		t.Fatalf("Term(%d) = %d, %v; want 2", started+2, term, err)
	}
}
