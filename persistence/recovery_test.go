package persistence

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
)

// recordAt is where one record of a test log is: its segment's file and offset.
type recordAt struct {
	path string
	off  int64
}

// writeLog writes records 1..n into a new log in dir with segments of segSize
// bytes and returns where each one is (index seq-1). The log is left as a
// crash leaves it: nothing released, nothing removed.
func writeLog(t *testing.T, dir string, segSize int64, n int) []recordAt {
	t.Helper()
	w, _, _ := openTestWAL(t, dir, segSize)
	var at []recordAt
	for seq := uint64(1); seq <= uint64(n); seq++ {
		p := payloadOf(seq)
		if err := w.commit(seq, p); err != nil {
			t.Fatal(err)
		}
		at = append(at, recordAt{path: w.cur.path, off: w.cur.off - int64(recordHeader+len(p))})
	}
	w.closeAll()
	return at
}

// openLog opens the log in dir as Open would, over a database that holds
// nothing, and returns the records it replayed or its error.
func openLog(dir string, segSize int64) (*replayed, error) {
	r := &replayed{}
	w, _, err := openWAL(dir, segSize, slog.Default(), 0, func(seq uint64, p []byte) error {
		r.seqs = append(r.seqs, seq)
		return nil
	})
	if err != nil {
		return nil, err
	}
	w.closeAll()
	return r, nil
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xFF
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// wantCorrupt checks that err is a *CorruptionError at path and off whose
// reason mentions what.
func wantCorrupt(t *testing.T, err error, path string, off int64, after uint64, what string) {
	t.Helper()
	var ce *CorruptionError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open: %v, want a corruption error", err)
	}
	if ce.File != path || ce.Offset != off || ce.After != after || !strings.Contains(ce.Reason, what) {
		t.Fatalf("corruption at %s:%d after seq %d (%s), want %s:%d after seq %d mentioning %q",
			ce.File, ce.Offset, ce.After, ce.Reason, path, off, after, what)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "repair wal") {
		t.Fatalf("the message does not name the file or the way out: %v", err)
	}
}

// TestRecovery_ABadRecordInAnOlderSegmentStopsOpen is the case: with
// record 5 of a rotated segment damaged, Open used to replay records 1-4, skip
// the rest of that segment, and go on with the next one.
func TestRecovery_ABadRecordInAnOlderSegmentStopsOpen(t *testing.T) {
	dir := t.TempDir()
	at := writeLog(t, dir, 4096, 200)
	if at[4].path == at[199].path {
		t.Fatal("record 5 is in the newest segment; want an older one")
	}
	flipByte(t, at[4].path, at[4].off+recordHeader+2) // a payload byte
	_, err := openLog(dir, 4096)
	wantCorrupt(t, err, at[4].path, at[4].off, 4, "checksum")
}

// TestRecovery_ATornLastRecordIsDroppedForGood: the newest segment's last
// record, cut short by a crash, is dropped; the segment then ends there, so a
// second restart (where that segment is no longer the newest) opens too.
func TestRecovery_ATornLastRecordIsDroppedForGood(t *testing.T) {
	dir := t.TempDir()
	at := writeLog(t, dir, 1<<20, 10)
	last := at[9]
	flipByte(t, last.path, last.off+recordHeader+int64(len(payloadOf(10)))-1)
	for i := 0; i < 2; i++ {
		r, err := openLog(dir, 1<<20)
		if err != nil {
			t.Fatalf("open %d: %v", i+1, err)
		}
		if len(r.seqs) != 9 || r.seqs[8] != 9 {
			t.Fatalf("open %d replayed %v, want 1..9", i+1, r.seqs)
		}
	}
}

// TestRecovery_ABadRecordWithAGoodOneAfterItIsDamage: in the newest segment
// too, a record that fails its checksum is a torn write only if nothing the
// segment wrote follows it.
func TestRecovery_ABadRecordWithAGoodOneAfterItIsDamage(t *testing.T) {
	dir := t.TempDir()
	at := writeLog(t, dir, 1<<20, 10)
	flipByte(t, at[6].path, at[6].off+recordHeader) // record 7 of 10, all in one segment
	_, err := openLog(dir, 1<<20)
	wantCorrupt(t, err, at[6].path, at[6].off, 6, "good record (seq 8)")
}

// TestRecovery_AZeroedHeaderBeforeGoodRecordsIsDamage: a segment that seems to
// end (a zero length) but holds good records after that point lost them.
func TestRecovery_AZeroedHeaderBeforeGoodRecordsIsDamage(t *testing.T) {
	dir := t.TempDir()
	at := writeLog(t, dir, 4096, 200)
	f, err := os.OpenFile(at[4].path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, recordHeader), at[4].off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = openLog(dir, 4096)
	wantCorrupt(t, err, at[4].path, at[4].off, 4, "ends here")
}

// TestRecovery_AMissingSegmentIsAGap: a segment deleted from the middle of
// the log leaves a gap in the sequence.
func TestRecovery_AMissingSegmentIsAGap(t *testing.T) {
	dir := t.TempDir()
	at := writeLog(t, dir, 4096, 200)
	var mid string
	for i := 60; i < 200; i++ {
		if at[i].path != at[0].path && at[i].path != at[199].path {
			mid = at[i].path
			break
		}
	}
	first := -1
	for i := range at {
		if at[i].path == mid && first < 0 {
			first = i
		}
	}
	if err := os.Remove(mid); err != nil {
		t.Fatal(err)
	}
	next := first
	for at[next].path == mid {
		next++
	}
	_, err := openLog(dir, 4096)
	wantCorrupt(t, err, at[next].path, at[next].off, uint64(first), "gap")
}

// TestRecovery_ASequenceThatStepsBackIsDamage: seqs strictly increase.
func TestRecovery_ASequenceThatStepsBackIsDamage(t *testing.T) {
	dir := t.TempDir()
	w, _, _ := openTestWAL(t, dir, 1<<20)
	for _, seq := range []uint64{1, 2, 3, 2} {
		if err := w.commit(seq, payloadOf(seq)); err != nil {
			t.Fatal(err)
		}
	}
	path, off := w.cur.path, w.cur.off-int64(recordHeader+len(payloadOf(2)))
	w.closeAll()
	_, err := openLog(dir, 1<<20)
	wantCorrupt(t, err, path, off, 3, "steps back")
}

// TestRecovery_ALogThatStartsBeyondTheDatabaseIsDamage: the records between
// what Badger holds and the log's first record are nowhere.
func TestRecovery_ALogThatStartsBeyondTheDatabaseIsDamage(t *testing.T) {
	dir := t.TempDir()
	w, _, _ := openTestWAL(t, dir, 1<<20)
	for seq := uint64(10); seq <= 12; seq++ {
		if err := w.commit(seq, payloadOf(seq)); err != nil {
			t.Fatal(err)
		}
	}
	path := w.cur.path
	w.closeAll()
	_, _, err := openWAL(dir, 1<<20, slog.Default(), 8, func(uint64, []byte) error { return nil })
	wantCorrupt(t, err, path, 0, 0, "records 9..9 are missing")
	if _, _, err := openWAL(dir, 1<<20, slog.Default(), 9, func(uint64, []byte) error { return nil }); err != nil {
		t.Fatalf("a log that starts right after the database: %v", err)
	}
}

// TestRecovery_ARecordThatDoesNotDecodeStopsOpen: a record whose checksum
// holds but whose changes make no sense is a bug's trace, not a torn write.
func TestRecovery_ARecordThatDoesNotDecodeStopsOpen(t *testing.T) {
	dir := t.TempDir()
	w, _, _ := openTestWAL(t, dir, 1<<20)
	if err := w.commit(1, appendWrite(nil, &Write{Sets: []KV{{Key: []byte("k"), Value: []byte("v")}}})); err != nil {
		t.Fatal(err)
	}
	bad := []byte{9, 1, 'k'} // op 9 does not exist
	if err := w.commit(2, bad); err != nil {
		t.Fatal(err)
	}
	path, off := w.cur.path, w.cur.off-int64(recordHeader+len(bad))
	w.closeAll()
	_, _, err := openWAL(dir, 1<<20, slog.Default(), 0, func(seq uint64, p []byte) error {
		return decodeChanges(p, func(k, v []byte) error { return nil }, func(k []byte) error { return nil })
	})
	wantCorrupt(t, err, path, off, 1, "do not decode")
}

// TestRecovery_OpenStopsAtDamageWithTheDatabase: through DB's Open, damage
// stops start-up with the *CorruptionError itself.
func TestRecovery_OpenStopsAtDamageWithTheDatabase(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Config{Dir: dir, SegmentSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	for i := 0; i < 100; i++ {
		if err := p.Submit(set("k", strings.Repeat(string(rune('a'+i%26)), 200))).Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	// A crash: Badger keeps what it flushed (nothing), the log everything.
	db.wal.closeAll()
	_ = db.bdb.Close()
	ids, _ := (&wal{dir: dir + "/wal"}).segmentIDs()
	if len(ids) < 3 {
		t.Fatalf("%d segments", len(ids))
	}
	path := segmentName(dir+"/wal", ids[1])
	hdr := make([]byte, recordHeader)
	f, _ := os.OpenFile(path, os.O_RDWR, 0)
	f.ReadAt(hdr, 0)
	seq := binary.LittleEndian.Uint64(hdr[8:])
	f.Close()
	flipByte(t, path, recordHeader) // the first record's payload
	_, err = Open(Config{Dir: dir, SegmentSize: 4096})
	wantCorrupt(t, err, path, 0, seq-1, "checksum")
}

// TestRecovery_RotationEndsARecycledSegment: a recycled segment holds its
// earlier life's records after the new ones. When the new records end on a
// page boundary, the bytes after them are the old life's (the page writer
// zeroes only the rest of a page it writes), so without the end marker that
// rotation writes, replay would take them for damage in an older segment.
func TestRecovery_RotationEndsARecycledSegment(t *testing.T) {
	dir := t.TempDir()
	const segSize = 8192
	w, _, _ := openTestWAL(t, dir, segSize)
	w.stopPreparing() // every new segment is a recycled one
	seq := uint64(0)
	commit := func(payload []byte) {
		t.Helper()
		seq++
		if err := w.commit(seq, payload); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 600; i++ { // the first life: small records fill the files
		commit(payloadOf(seq + 1))
	}
	if err := w.retire(); err != nil {
		t.Fatal(err)
	}
	flushed := seq
	if err := w.release(flushed, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	commit(bytes.Repeat([]byte{'a'}, pageSize-recordHeader)) // ends at the page boundary
	recycled := w.cur.path
	if w.cur.off != pageSize {
		t.Fatalf("the record ends at %d, want %d", w.cur.off, pageSize)
	}
	stale := make([]byte, recordHeader)
	if _, err := w.cur.f.ReadAt(stale, pageSize); err != nil || bytes.Equal(stale, make([]byte, recordHeader)) {
		t.Fatalf("no earlier life's bytes after the record (%v): the test shows nothing", err)
	}
	commit(bytes.Repeat([]byte{'b'}, segSize-pageSize)) // does not fit: rotation
	if w.cur.path == recycled {
		t.Fatal("no rotation")
	}
	w.closeAll()
	r, _, err := openWAL(dir, segSize, slog.Default(), flushed, func(uint64, []byte) error { return nil })
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	r.closeAll()
}
