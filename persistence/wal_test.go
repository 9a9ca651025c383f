package persistence

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

type replayed struct {
	seqs     []uint64
	payloads [][]byte
}

func openTestWAL(t *testing.T, dir string, segSize int64) (*wal, *replayed, uint64) {
	t.Helper()
	return openTestWALAt(t, dir, segSize, 0)
}

// openTestWALAt opens the log as Open would over a database that holds every
// version up to floor.
func openTestWALAt(t *testing.T, dir string, segSize int64, floor uint64) (*wal, *replayed, uint64) {
	t.Helper()
	r := &replayed{}
	w, last, err := openWAL(dir, segSize, slog.Default(), floor, func(seq uint64, p []byte) error {
		r.seqs = append(r.seqs, seq)
		r.payloads = append(r.payloads, append([]byte(nil), p...))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return w, r, last
}

func payloadOf(seq uint64) []byte {
	return []byte(fmt.Sprintf("record %d %s", seq, bytes.Repeat([]byte{'x'}, int(seq%50))))
}

func TestWAL_ReplaysEveryRecordInOrderAcrossSegments(t *testing.T) {
	dir := t.TempDir()
	w, _, _ := openTestWAL(t, dir, 4096) // forces many rotations
	for seq := uint64(1); seq <= 300; seq++ {
		if err := w.commit(seq, payloadOf(seq)); err != nil {
			t.Fatal(err)
		}
	}
	if w.segments() < 3 {
		t.Fatalf("%d segments, want rotations", w.segments())
	}
	w.closeAll() // a crash: nothing released, nothing removed
	w, r, last := openTestWAL(t, dir, 4096)
	defer w.closeAll()
	if last != 300 || len(r.seqs) != 300 {
		t.Fatalf("replayed %d records up to %d, want 300", len(r.seqs), last)
	}
	for i, seq := range r.seqs {
		if seq != uint64(i+1) || !bytes.Equal(r.payloads[i], payloadOf(seq)) {
			t.Fatalf("record %d: seq %d payload %q", i, seq, r.payloads[i])
		}
	}
	// Writes after a reopen go on in a new segment and replay after the old ones.
	if err := w.commit(301, payloadOf(301)); err != nil {
		t.Fatal(err)
	}
	w.closeAll()
	w2, r2, last2 := openTestWAL(t, dir, 4096)
	defer w2.closeAll()
	if last2 != 301 || len(r2.seqs) != 301 {
		t.Fatalf("after a second reopen: %d records up to %d", len(r2.seqs), last2)
	}
}

func TestWAL_StopsAtATornRecord(t *testing.T) {
	dir := t.TempDir()
	w, _, _ := openTestWAL(t, dir, 1<<20)
	var offs []int64
	for seq := uint64(1); seq <= 3; seq++ {
		offs = append(offs, w.cur.off)
		if err := w.commit(seq, payloadOf(seq)); err != nil {
			t.Fatal(err)
		}
	}
	path := w.cur.path
	w.closeAll()
	// Tear the third record: its last byte never reached the disk.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	end := offs[2] + recordHeader + int64(len(payloadOf(3))) - 1
	if _, err := f.WriteAt([]byte{0}, end); err != nil {
		t.Fatal(err)
	}
	f.Close()
	w, r, last := openTestWAL(t, dir, 1<<20)
	defer w.closeAll()
	if last != 2 || len(r.seqs) != 2 {
		t.Fatalf("replayed %v, want records 1 and 2 only", r.seqs)
	}
}

func TestWAL_ReleasedSegmentsAreNeverReplayed(t *testing.T) {
	dir := t.TempDir()
	w, _, _ := openTestWAL(t, dir, 4096)
	seq := uint64(0)
	write := func(n int) {
		for i := 0; i < n; i++ {
			seq++
			if err := w.commit(seq, payloadOf(seq)); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(200)
	flushed := w.full[len(w.full)/2].lastSeq
	synced := false
	if err := w.release(flushed, func() error { synced = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if !synced {
		t.Fatal("segments released without syncing the database first")
	}
	free, _ := filepath.Glob(filepath.Join(dir, "*.free"))
	free = slices.DeleteFunc(free, func(p string) bool { return filepath.Base(p) == preparedFree })
	if len(free) != keepRecycled {
		t.Fatalf("%d released segments kept, want %d", len(free), keepRecycled)
	}
	// Reuses the released files; their old records must stay dead. The
	// recycled segments that fill up are older ones at the reopen, whose
	// stale records strict replay tells from damage by the end marker
	// rotation writes (recovery.go).
	write(200)
	w.closeAll()
	w, r, _ := openTestWALAt(t, dir, 4096, flushed)
	defer w.closeAll()
	if len(r.seqs) == 0 || r.seqs[0] <= flushed {
		t.Fatalf("replay starts at %v, want after the released %d", r.seqs[:1], flushed)
	}
	for i := 1; i < len(r.seqs); i++ {
		if r.seqs[i] != r.seqs[i-1]+1 {
			t.Fatalf("replay jumps from %d to %d", r.seqs[i-1], r.seqs[i])
		}
	}
	if r.seqs[len(r.seqs)-1] != seq {
		t.Fatalf("replay ends at %d, want %d", r.seqs[len(r.seqs)-1], seq)
	}
}

func TestWAL_RecordOfAnotherSegmentIsRejected(t *testing.T) {
	hdr := make([]byte, recordHeader)
	p := []byte("payload")
	binary.LittleEndian.PutUint32(hdr, uint32(len(p)))
	binary.LittleEndian.PutUint64(hdr[8:], 9)
	if recordCRC(1, hdr, p) == recordCRC(2, hdr, p) {
		t.Fatal("the CRC does not depend on the segment id")
	}
}

func TestDecodeChanges_RoundTripAndCorruption(t *testing.T) {
	w := &Write{Sets: []KV{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: nil}}, Deletes: [][]byte{[]byte("c")}}
	b := appendWrite(nil, w)
	var got []string
	err := decodeChanges(b, func(k, v []byte) error { got = append(got, "set "+string(k)+"="+string(v)); return nil },
		func(k []byte) error { got = append(got, "del "+string(k)); return nil })
	if err != nil || fmt.Sprint(got) != "[set a=1 set b= del c]" {
		t.Fatalf("%v %v", got, err)
	}
	for cut := 1; cut < len(b); cut++ {
		_ = decodeChanges(b[:cut], func(k, v []byte) error { return nil }, func(k []byte) error { return nil })
	}
	if err := decodeChanges([]byte{9, 1, 'a'}, nil, nil); err == nil {
		t.Fatal("unknown op accepted")
	}
}

// TestWAL_PageWritesKeepEveryRecord writes records of sizes that start and end
// inside pages, fill pages exactly, span several pages, and one that grows the
// page writer's buffer past its keep limit; every record replays, and the page
// writer's last partial page matches the file. It does so two ways: one RWF_DSYNC
// write through the O_DIRECT handle per commit (where the kernel takes it), and a
// write and an fdatasync, as on a kernel that refuses the flag.
func TestWAL_PageWritesKeepEveryRecord(t *testing.T) {
	for _, way := range []string{"commit", "commit without RWF_DSYNC"} {
		t.Run(way, func(t *testing.T) { testPageWrites(t, way) })
	}
}

func testPageWrites(t *testing.T, way string) {
	dir := t.TempDir()
	w, _, _ := openTestWAL(t, dir, 64<<20)
	if way == "commit without RWF_DSYNC" {
		w.cur.pw.dsync = false
	}
	t.Logf("direct I/O %v, RWF_DSYNC writes %v", w.cur.pw.direct, w.cur.pw.dsync)
	sizes := []int{1, 100, pageSize - recordHeader, 3000, 3*pageSize + 17, 2 << 20, 5, pageSize, 200}
	var want [][]byte
	for i, n := range sizes {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		want = append(want, p)
		if err := w.commit(uint64(i+1), p); err != nil {
			t.Fatal(err)
		}
		pw := w.cur.pw
		if pw.base+int64(pw.n) != w.cur.off || pw.base%pageSize != 0 || pw.n >= pageSize {
			t.Fatalf("after record %d: writer at %d+%d, segment at %d", i, pw.base, pw.n, w.cur.off)
		}
		onDisk := make([]byte, pw.n)
		if _, err := w.cur.f.ReadAt(onDisk, pw.base); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(onDisk, pw.buf[:pw.n]) {
			t.Fatalf("after record %d: the kept partial page differs from the file", i)
		}
	}
	if len(w.cur.pw.buf) > 1<<20 {
		t.Fatalf("page writer kept a %d-byte buffer after a large record", len(w.cur.pw.buf))
	}
	if way == "commit" && w.cur.pw.direct && !w.cur.pw.dsync {
		t.Fatal("the writer gave up RWF_DSYNC writes (a kernel older than 4.7 refuses them)")
	}
	w.closeAll() // a crash
	w, r, last := openTestWAL(t, dir, 64<<20)
	defer w.closeAll()
	if last != uint64(len(sizes)) || len(r.payloads) != len(sizes) {
		t.Fatalf("replayed %d records up to %d, want %d", len(r.payloads), last, len(sizes))
	}
	for i := range want {
		if !bytes.Equal(r.payloads[i], want[i]) {
			t.Fatalf("record %d: %d bytes replayed, want %d", i+1, len(r.payloads[i]), len(want[i]))
		}
	}
}

// TestDecodeChanges_PartsOfEarlierValues: a Set whose value is part of an
// earlier Set of the same Write is logged as a reference and replays as the
// same bytes; a reference that does not hold (wrong bytes, out of range, to a
// later Set, too short to pay) is logged whole; a corrupt reference is refused.
func TestDecodeChanges_PartsOfEarlierValues(t *testing.T) {
	hello, list := `"hello, world, hello"`, `[1,2,3,4,5,6,7,8,9,10]`
	entry := []byte(`[{"key":"a","value":` + hello + `},{"key":"b","value":` + list + `},{"key":"c","value":3}]`)
	at := func(v string) int { return bytes.Index(entry, []byte(v)) }
	w := &Write{Sets: []KV{
		{Key: []byte("log"), Value: entry},
		{Key: []byte("a"), Value: []byte(hello), Of: 1, At: at(hello)},
		{Key: []byte("b"), Value: []byte(list), Of: 1, At: at(list)},
		{Key: []byte("short"), Value: []byte(`3`), Of: 1, At: len(entry) - 3},
		{Key: []byte("wrong"), Value: []byte(`"hello, world, hellx"`), Of: 1, At: at(hello)},
		{Key: []byte("past"), Value: []byte(hello), Of: 1, At: len(entry) - 5},
		{Key: []byte("later"), Value: []byte(hello), Of: 9},
		{Key: []byte("self"), Value: []byte(hello), Of: 8},
		{Key: []byte("z"), Value: []byte(`z`)},
	}, Deletes: [][]byte{[]byte("d")}}
	// A second write in the same record: its references count from its own sets.
	w2 := &Write{Sets: []KV{{Key: []byte("e2"), Value: []byte(`[` + list + `]`)}, {Key: []byte("l"), Value: []byte(list), Of: 1, At: 1}}}
	b := appendWrite(appendWrite(nil, w), w2)
	var got []string
	err := decodeChanges(b, func(k, v []byte) error { got = append(got, string(k)+"="+string(v)); return nil },
		func(k []byte) error { got = append(got, "del "+string(k)); return nil })
	want := fmt.Sprint([]string{"log=" + string(entry), "a=" + hello, "b=" + list, "short=3", `wrong="hello, world, hellx"`,
		"past=" + hello, "later=" + hello, "self=" + hello, "z=z", "del d", "e2=[" + list + "]", "l=" + list})
	if err != nil || fmt.Sprint(got) != want {
		t.Fatalf("%v %v\nwant %s", got, err, want)
	}
	// The three references that hold take three bytes each instead of their values.
	plainOf := func(w *Write) *Write {
		c := &Write{Deletes: w.Deletes}
		for _, kv := range w.Sets {
			c.Sets = append(c.Sets, KV{Key: kv.Key, Value: kv.Value})
		}
		return c
	}
	plain := appendWrite(appendWrite(nil, plainOf(w)), plainOf(w2))
	// Each takes back, offset and length (a byte each here) for a length byte and the value.
	if saved, want := len(plain)-len(b), (len(hello)-2)+2*(len(list)-2); saved != want {
		t.Fatalf("the references saved %d bytes, want %d", saved, want)
	}
	for cut := 1; cut < len(b); cut++ {
		_ = decodeChanges(b[:cut], func(k, v []byte) error { return nil }, func(k []byte) error { return nil })
	}
	one := appendWrite(nil, &Write{Sets: []KV{{Key: []byte("s"), Value: []byte("vv")}}})
	for name, bad := range map[string][]byte{
		"no earlier set":  {opSetPart, 1, 'k', 1, 0, 0},
		"back zero":       append(slices.Clone(one), opSetPart, 1, 'k', 0, 0, 1),
		"beyond its set":  append(slices.Clone(one), opSetPart, 1, 'k', 1, 1, 2),
		"offset past end": append(slices.Clone(one), opSetPart, 1, 'k', 1, 3, 0),
		"truncated ref":   append(slices.Clone(one), opSetPart, 1, 'k', 1, 0),
	} {
		if err := decodeChanges(bad, func(k, v []byte) error { return nil }, func(k []byte) error { return nil }); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestWAL_PreparesTheNextSegmentAhead: once the current segment is half full
// and no released segment waits, a zeroed segment is prepared in the
// background, and the next rotation takes it (already zeroed to its end)
// instead of zeroing a new file on the commit's path.
func TestWAL_PreparesTheNextSegmentAhead(t *testing.T) {
	dir := t.TempDir()
	const segSize = 8 << 20
	w, _, _ := openTestWAL(t, dir, segSize)
	payload := bytes.Repeat([]byte{'p'}, 64<<10)
	seq := uint64(0)
	commit := func() {
		t.Helper()
		seq++
		if err := w.commit(seq, payload); err != nil {
			t.Fatal(err)
		}
	}
	for w.cur.off < segSize/2 {
		commit()
	}
	prepared := filepath.Join(dir, preparedFree)
	waitFor(t, "a segment prepared ahead", func() bool {
		_, err := os.Stat(prepared)
		return err == nil
	})
	first := w.cur.id
	for w.cur.id == first {
		commit()
	}
	if _, err := os.Stat(prepared); !os.IsNotExist(err) {
		t.Fatalf("the prepared segment is still free after the rotation (stat: %v)", err)
	}
	if w.cur.zeroed != segSize {
		t.Fatalf("the new segment is zeroed to %d, want the prepared %d", w.cur.zeroed, segSize)
	}
	w.closeAll()
	w, r, last := openTestWAL(t, dir, segSize)
	defer w.closeAll()
	if last != seq || len(r.seqs) != int(seq) {
		t.Fatalf("replayed %d records up to %d, want %d", len(r.seqs), last, seq)
	}
}

// TestWAL_CloseStopsPreparingASegment: closing the log stops a preparation
// under way and leaves neither its file nor a prepared segment behind.
func TestWAL_CloseStopsPreparingASegment(t *testing.T) {
	dir := t.TempDir()
	w, _, _ := openTestWAL(t, dir, 1<<30) // a gigabyte to zero: far from done at Close
	w.cur.off = w.segSize / 2
	w.maybePrepare()
	w.mu.Lock()
	preparing := w.preparing
	w.mu.Unlock()
	if !preparing {
		t.Fatal("no preparation started")
	}
	w.closeAll()
	for _, name := range []string{preparedName, preparedFree} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Fatalf("%s is left after Close (stat: %v)", name, err)
		}
	}
}

// TestWAL_OpenRemovesAHalfPreparedSegment: a preparation a crash cut short
// leaves its temporary file, which the next open removes.
func TestWAL_OpenRemovesAHalfPreparedSegment(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, preparedName), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	w, _, _ := openTestWAL(t, dir, 1<<20)
	defer w.closeAll()
	if _, err := os.Stat(filepath.Join(dir, preparedName)); !os.IsNotExist(err) {
		t.Fatalf("the half-prepared segment is still there (stat: %v)", err)
	}
}

// TestWAL_ZerosBypassThePageCache: a segment's zeros are written through an
// O_DIRECT handle, so none of them sit in the page cache, where the records'
// own O_DIRECT writes would only have to drop them again (docs/benchmarks.md,
// session 15). Checked with mincore on both ways a segment is zeroed: a new
// log's first segment, on the commit's path, and one prepared ahead.
func TestWAL_ZerosBypassThePageCache(t *testing.T) {
	dir := t.TempDir()
	if f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_CREATE|os.O_RDWR|syscall.O_DIRECT, 0o644); err != nil {
		t.Skipf("this filesystem refuses O_DIRECT: %v", err)
	} else {
		f.Close()
	}
	const segSize = 8 << 20
	w, _, _ := openTestWAL(t, dir, segSize)
	defer w.closeAll()
	if got := residentPages(t, w.cur.path); got != 0 {
		t.Fatalf("%d pages of the first segment's zeros are in the page cache, want none", got)
	}
	seg, err := w.zeroSegment()
	if err != nil {
		t.Fatal(err)
	}
	defer seg.f.Close()
	if seg.zeroed != segSize {
		t.Fatalf("the prepared segment is zeroed to %d, want %d", seg.zeroed, segSize)
	}
	if got := residentPages(t, seg.path); got != 0 {
		t.Fatalf("%d pages of the prepared segment's zeros are in the page cache, want none", got)
	}
}

// residentPages counts the pages of the file at path that are in the page cache.
func residentPages(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() == 0 {
		t.Fatalf("%s is empty", path)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}
