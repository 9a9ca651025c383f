package persistence

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/holdfast/holdfast/internal/durable"
)

// The write-ahead log is the pipeline's durability point: one record per commit,
// written into a pre-zeroed segment and made durable with one fdatasync. Badger then
// holds the same changes, unsynced, at the record's sequence number as version, and
// the log keeps every record until Badger has flushed it to a synced table.
//
// A segment is a file named <id>.wal. A record is
//
//	length  uint32  payload bytes; 0 marks the end of the written part
//	crc     uint32  CRC-32C of segment id, length, seq and payload
//	seq     uint64  the commit's sequence number; strictly increasing across the log
//	payload         the changes (see encodeChange)
//
// Mixing the segment id into the CRC makes the records left in a recycled segment
// invalid, so replay stops at the first byte this segment did not write.
//
// Segments are zeroed before records reach them (an overwrite syncs faster than
// an append). The next segment is a released one when Badger keeps up; when none
// is free by the time the current segment is half full, a goroutine zeroes a new
// one in the background (prepare.tmp, then 0000000000000000.free), so that only
// a new log's first segment is zeroed on the commits' path, 4 MiB at a time.
const (
	recordHeader = 16
	zeroChunk    = 4 << 20 // segments are zero-filled ahead of writes, this much at a time
	keepRecycled = 2       // released segments kept for reuse
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errCorrupt ends the replay of a segment at a record that does not check out.
var errCorrupt = errors.New("persistence: corrupt log record")

type segment struct {
	id      uint64
	f       *os.File
	path    string      // where the file is now
	off     int64       // next write offset
	zeroed  int64       // bytes known to be written (zeros or records) from 0
	lastSeq uint64      // seq of its last record, 0 if none
	pw      *pageWriter // record writer of the current segment; nil once full
}

type wal struct {
	dir     string
	segSize int64
	log     *slog.Logger
	cur     *segment // nil between retire and the next startSegment
	nextID  uint64   // the id of the segment after cur
	buf     []byte

	// mu guards full, free and preparing: the committer adds full segments and
	// takes free ones, the releaser takes full ones and gives free ones, the
	// preparer goroutine adds the one it prepared.
	mu        sync.Mutex
	full      []*segment // segments written up, oldest first, not yet released
	free      []*segment // released or prepared segments kept for reuse (*.free)
	preparing bool
	prepFail  time.Time // when preparing last failed; retried after prepRetry
	prepStop  atomic.Bool
	prepDone  sync.WaitGroup
	// files are the open segments by id (full ones and cur), for reads of
	// raft entries; guarded by mu.
	files map[uint64]*os.File

	// raft is the node's raft index (set by Open, nil in the log's own
	// tests): a new segment's first record starts with its state, and a
	// segment it pins is not released.
	raft walRaft
	// lastSeg and lastPayloadAt say where the last commit's payload went:
	// its segment and the file offset of its first byte. Committer-owned.
	lastSeg       uint64
	lastPayloadAt int64
}

// walRaft is what the log asks of the raft index (raftlog.go).
type walRaft interface {
	head() []byte           // the op 6 change a new segment starts with; nil if none
	pinned(seg uint64) bool // a replica still needs entries in seg
	released(seg uint64)    // seg is out of the log
}

const (
	// preparedName is the file a segment is zeroed in before it joins the free
	// ones as preparedFree (id 0: released segments keep their own ids, from 1).
	preparedName = "prepare.tmp"
	preparedFree = "0000000000000000.free"
	prepRetry    = 10 * time.Second
)

// zeros is a read-only run of zero bytes to write from, page aligned for
// O_DIRECT writes.
var zeros = alignedBuf(1 << 20)

func segmentName(dir string, id uint64) string {
	return filepath.Join(dir, fmt.Sprintf("%016d.wal", id))
}

// openWAL replays every segment of dir in order, calling apply for each
// record, and starts a new segment for the writes to come. floor is the newest
// version Badger holds: the log's first record may be at most one above it.
// It returns the last replayed sequence number (0 if the log was empty). Any
// damage stops it with a *CorruptionError (see recovery.go).
func openWAL(dir string, segSize int64, log *slog.Logger, floor uint64, apply func(seq uint64, payload []byte) error) (*wal, uint64, error) {
	return openWALAt(dir, segSize, log, floor, func(seq uint64, _ recordPlace, payload []byte) error { return apply(seq, payload) })
}

// recordPlace is where a replayed record is: its segment and the file offset of
// its payload's first byte.
type recordPlace struct {
	seg       uint64
	payloadAt int64
}

// openWALAt is openWAL whose apply also learns where each record is.
func openWALAt(dir string, segSize int64, log *slog.Logger, floor uint64, apply func(seq uint64, at recordPlace, payload []byte) error) (*wal, uint64, error) {
	if err := durable.MkdirAll(dir, 0o755); err != nil {
		return nil, 0, fmt.Errorf("create log directory: %w", err)
	}
	w := &wal{dir: dir, segSize: segSize, log: log, files: map[uint64]*os.File{}}
	ids, err := w.segmentIDs()
	if err != nil {
		return nil, 0, err
	}
	var last uint64
	for i, id := range ids {
		path := segmentName(dir, id)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			w.closeAll()
			return nil, 0, fmt.Errorf("open log segment %d: %w", id, err)
		}
		seg := &segment{id: id, f: f, path: path}
		w.full = append(w.full, seg)
		w.files[id] = f
		if err := w.replay(seg, i == len(ids)-1, &last, floor, apply); err != nil {
			w.closeAll()
			return nil, 0, err
		}
	}
	if err := w.openFree(); err != nil {
		w.closeAll()
		return nil, 0, err
	}
	next := uint64(1)
	if len(ids) > 0 {
		next = ids[len(ids)-1] + 1
	}
	for _, f := range w.free {
		next = max(next, f.id+1)
	}
	if err := w.startSegment(next); err != nil {
		w.closeAll()
		return nil, 0, err
	}
	return w, last, nil
}

// openFree reopens the released segments kept for reuse and removes the rest,
// and a segment whose preparation a crash cut short.
func (w *wal) openFree() error {
	if err := os.Remove(filepath.Join(w.dir, preparedName)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove a half-prepared log segment: %w", err)
	}
	paths, err := filepath.Glob(filepath.Join(w.dir, "*.free"))
	if err != nil {
		return err
	}
	sort.Strings(paths)
	for _, p := range paths {
		id, _ := strconv.ParseUint(strings.TrimSuffix(filepath.Base(p), ".free"), 10, 64)
		if filepath.Base(p) != preparedFree && w.recycled() >= keepRecycled {
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("remove released log segment: %w", err)
			}
			continue
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("open released log segment: %w", err)
		}
		w.free = append(w.free, &segment{id: id, f: f, path: p})
	}
	return nil
}

func (w *wal) segmentIDs() ([]uint64, error) {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, fmt.Errorf("list log directory: %w", err)
	}
	var ids []uint64
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".wal") {
			continue
		}
		id, err := strconv.ParseUint(strings.TrimSuffix(name, ".wal"), 10, 64)
		if err != nil {
			continue
		}
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

// replay checks and applies the records of seg (see recovery.go). A torn last
// record of the newest segment is dropped for good: its header is zeroed and
// synced, because the segment is an older one from now on, and an older
// segment must end at a zero length.
func (w *wal) replay(seg *segment, newest bool, last *uint64, floor uint64, apply func(uint64, recordPlace, []byte) error) error {
	data, err := readSegment(seg)
	if err != nil {
		return err
	}
	sc, err := scanSegment(seg.path, seg.id, data, *last, floor, newest, func(seq uint64, off int64, payload []byte) error {
		return apply(seq, recordPlace{seg: seg.id, payloadAt: off + recordHeader}, payload)
	})
	if err != nil {
		return fmt.Errorf("replay log segment %s: %w", seg.path, err)
	}
	if sc.damage != nil {
		return sc.damage
	}
	if sc.torn {
		w.log.Warn("dropped the torn last record of the write-ahead log (a write the crash cut short; it was never acknowledged)",
			"file", seg.path, "offset", sc.end, "after_seq", max(sc.lastSeq, *last))
		if _, err := seg.f.WriteAt(make([]byte, recordHeader), sc.end); err != nil {
			return fmt.Errorf("end log segment %s at its torn record: %w", seg.path, err)
		}
		if err := fdatasync(seg.f); err != nil {
			return fmt.Errorf("end log segment %s at its torn record: %w", seg.path, err)
		}
	}
	if sc.records > 0 {
		*last = sc.lastSeq
		seg.lastSeq = sc.lastSeq
	} else {
		seg.lastSeq = *last // an empty segment holds nothing newer than the ones before it
	}
	seg.off = sc.end
	seg.zeroed = int64(len(data))
	return nil
}

func recordCRC(segID uint64, hdr, payload []byte) uint32 {
	var id [8]byte
	binary.LittleEndian.PutUint64(id[:], segID)
	c := crc32.Update(0, crcTable, id[:])
	c = crc32.Update(c, crcTable, hdr[0:4])
	c = crc32.Update(c, crcTable, hdr[8:16])
	return crc32.Update(c, crcTable, payload)
}

// startSegment makes segment id the current one: a recycled file if one is free,
// else a new one. The directory is synced so that the file survives a crash before
// any record in it is acknowledged. On an error nothing changed but that a
// recycled file may be gone: it can be called again.
func (w *wal) startSegment(id uint64) (err error) {
	path := segmentName(w.dir, id)
	seg := &segment{id: id, path: path}
	w.mu.Lock()
	var old *segment
	if n := len(w.free); n > 0 {
		old = w.free[n-1]
		w.free = w.free[:n-1]
	}
	w.mu.Unlock()
	defer func() {
		if err != nil && seg.f != nil {
			seg.f.Close()
			_ = os.Remove(path) // holds no record; the next try starts over
		}
	}()
	if old != nil {
		if err := os.Rename(old.path, path); err != nil {
			w.mu.Lock()
			w.free = append(w.free, old) // still where it was
			w.mu.Unlock()
			return fmt.Errorf("recycle log segment: %w", err)
		}
		seg.f = old.f
		st, err := seg.f.Stat()
		if err != nil {
			return err
		}
		seg.zeroed = st.Size()
	} else {
		// Not O_EXCL: a file of this id is what an earlier failed try left.
		f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o644)
		if err != nil {
			return fmt.Errorf("create log segment: %w", err)
		}
		seg.f = f
		if err := w.zeroAhead(seg, zeroChunk); err != nil {
			return err
		}
	}
	if err := syncPath(w.dir); err != nil {
		return err
	}
	pw, err := openPageWriter(seg)
	if err != nil {
		return err
	}
	seg.pw = pw
	w.cur = seg
	w.mu.Lock()
	w.files[id] = seg.f
	w.mu.Unlock()
	return nil
}

// zeroAhead writes zeros from seg.zeroed up to at least upTo, and syncs them, so
// that records overwrite allocated blocks: an overwrite syncs faster than an
// append, which must also commit the file's new size and blocks. The zeros are
// synced here, not with the next record: a record's RWF_DSYNC write syncs only
// its own range, and zeros still in the page cache would make every record's
// write allocate blocks and commit the journal.
func (w *wal) zeroAhead(seg *segment, upTo int64) error {
	if upTo <= seg.zeroed {
		return nil
	}
	chunk := min(int64(zeroChunk), w.segSize)
	end := ((upTo + chunk - 1) / chunk) * chunk
	f, closeF, err := zeroHandle(seg, end)
	if err != nil {
		return err
	}
	defer closeF()
	for seg.zeroed < end {
		n := int64(len(zeros))
		if end-seg.zeroed < n {
			n = end - seg.zeroed
		}
		if _, err := f.WriteAt(zeros[:n], seg.zeroed); err != nil {
			return fmt.Errorf("zero log segment %d: %w", seg.id, err)
		}
		seg.zeroed += n
	}
	if err := fdatasync(f); err != nil {
		return fmt.Errorf("sync zeros of log segment %d: %w", seg.id, err)
	}
	return nil
}

// zeroHandle is the handle zeroAhead writes seg's zeros from seg.zeroed to end
// through: an O_DIRECT one when the range is whole pages and the filesystem
// allows it, else the segment's own. The records go through an O_DIRECT handle
// (pageWriter), so zeros left in the page cache would only be dropped again
// by the first record's write: through the page cache, zeroing a 4 MiB chunk
// took 2.0 ms of CPU here, against 1.1-1.3 ms direct (docs/benchmarks.md,
// session 15).
func zeroHandle(seg *segment, end int64) (*os.File, func(), error) {
	if seg.zeroed%pageSize != 0 || end%pageSize != 0 {
		return seg.f, func() {}, nil
	}
	f, err := openDirect(seg)
	if err != nil || f == nil {
		return seg.f, func() {}, err
	}
	return f, func() { f.Close() }, nil
}

// commit writes one record holding payload, rotating to a new segment first if it
// does not fit, and makes it durable with every record before it (one
// write-and-sync where the kernel allows it).
//
// An error that wraps ErrUnavailable left the log as it was: the record was not
// written, because a new segment could not be started or zeroed (no
// descriptors, no space); the same commit may be tried again. Any other error
// is the log's end: what the device holds is unknown.
func (w *wal) commit(seq uint64, payload []byte) error {
	origLen := int64(len(payload))
	need := int64(recordHeader + len(payload))
	if w.cur != nil && w.cur.off > 0 && w.cur.off+need > w.segSize {
		if err := w.retire(); err != nil {
			return err
		}
	}
	if w.cur == nil {
		if err := w.startSegment(w.nextID); err != nil {
			return unavailableErr(fmt.Errorf("start log segment %d: %w", w.nextID, err))
		}
	}
	seg := w.cur
	if seg.off == 0 && w.raft != nil {
		// A new segment starts with the raft state, so that replay from it
		// needs none of the segments before (raftrecord.go, op 6).
		if head := w.raft.head(); len(head) > 0 {
			payload = append(head, payload...)
			need = int64(recordHeader + len(payload))
		}
	}
	// Blocks past the record stay allocated, so that later records overwrite.
	if err := w.zeroAhead(seg, seg.off+need+recordHeader); err != nil {
		return unavailableErr(err)
	}
	if cap(w.buf) < int(need) {
		w.buf = make([]byte, need)
	}
	rec := w.buf[:need]
	binary.LittleEndian.PutUint32(rec[0:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(rec[8:], seq)
	copy(rec[recordHeader:], payload)
	binary.LittleEndian.PutUint32(rec[4:], recordCRC(seg.id, rec[:recordHeader], payload))
	if err := seg.pw.writeSync(rec); err != nil {
		return fmt.Errorf("write and sync log segment %d: %w", seg.id, err)
	}
	w.lastSeg, w.lastPayloadAt = seg.id, seg.off+recordHeader+(int64(len(payload))-origLen)
	seg.off += need
	seg.lastSeq = seq
	w.maybePrepare()
	return nil
}

// maybePrepare starts preparing a free segment in the background once the
// current one is half full and no free segment waits for the next rotation. A
// new segment must otherwise be zeroed as the records reach it, 4 MiB at a time
// and synced, on the commit's path (batches of 100 records on a new data
// directory: 1.08x with the segments zeroed beforehand). Released segments,
// when Badger keeps up, are recycled and need none of it.
func (w *wal) maybePrepare() {
	if w.cur == nil || w.cur.off < w.segSize/2 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.preparing || len(w.free) > 0 || w.prepStop.Load() || time.Since(w.prepFail) < prepRetry {
		return
	}
	w.preparing = true
	w.prepDone.Add(1)
	go w.prepare()
}

// prepare zeroes a new segment, 4 MiB at a time, each synced, under a
// temporary name, then makes it a free segment for the next rotation.
func (w *wal) prepare() {
	defer w.prepDone.Done()
	seg, err := w.zeroSegment()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.preparing = false
	switch {
	case err != nil:
		w.prepFail = time.Now()
		w.log.Warn("could not prepare a log segment ahead; the next one is zeroed as it fills", "err", err)
	case seg != nil:
		w.free = append(w.free, seg)
	}
}

// zeroSegment writes a zeroed, synced segment file and renames it into the free
// ones; it returns nil and no error when the log is closing.
func (w *wal) zeroSegment() (*segment, error) {
	tmp := filepath.Join(w.dir, preparedName)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	seg := &segment{f: f, path: tmp}
	for seg.zeroed < w.segSize {
		if w.prepStop.Load() {
			f.Close()
			return nil, os.Remove(tmp)
		}
		if err := w.zeroAhead(seg, seg.zeroed+1); err != nil {
			f.Close()
			_ = os.Remove(tmp)
			return nil, err
		}
	}
	path := filepath.Join(w.dir, preparedFree)
	if err := os.Rename(tmp, path); err != nil {
		f.Close()
		_ = os.Remove(tmp)
		return nil, err
	}
	seg.path = path
	if err := syncPath(w.dir); err != nil {
		f.Close()
		return nil, err
	}
	return seg, nil
}

// stopPreparing stops the preparer and waits for it.
func (w *wal) stopPreparing() {
	w.prepStop.Store(true)
	w.prepDone.Wait()
}

// sync makes every appended record durable.
func (w *wal) sync() error {
	if w.cur == nil {
		return nil // retired, and synced then
	}
	if err := w.cur.pw.sync(); err != nil {
		return fmt.Errorf("sync log segment %d: %w", w.cur.id, err)
	}
	return nil
}

// retire ends the current segment: an end marker (a zero length) after its
// last record, synced with it, so that replay can tell the segment's end from
// damage (a recycled segment holds an earlier life's records past it); then
// the segment joins the full ones and the next commit starts segment nextID.
func (w *wal) retire() error {
	seg := w.cur
	if seg.off+recordHeader <= seg.zeroed {
		// The marker's bytes exist already (zeros or stale records): overwrite.
		if err := seg.pw.writeSync(make([]byte, recordHeader)); err != nil {
			return fmt.Errorf("end log segment %d: %w", seg.id, err)
		}
	} else if err := w.sync(); err != nil { // the file ends here: its end is the end
		return err
	}
	seg.pw.close()
	seg.pw = nil
	w.mu.Lock()
	w.full = append(w.full, seg)
	w.mu.Unlock()
	w.cur = nil
	w.nextID = seg.id + 1
	return nil
}

// release gives up the full segments whose every record Badger holds in synced
// tables (seq <= flushed); syncDB is called first so that the value log those
// tables point into is durable too. Released segments are kept for reuse. It
// runs on the releaser goroutine, beside the committer: it takes the segments
// it releases out of full under mu, and does its file work without mu.
func (w *wal) release(flushed uint64, syncDB func() error) error {
	w.mu.Lock()
	n := 0
	for n < len(w.full) && w.full[n].lastSeq <= flushed {
		n++
	}
	var ids []uint64
	if w.raft != nil {
		ids = make([]uint64, n)
		for i := range ids {
			ids[i] = w.full[i].id
		}
	}
	w.mu.Unlock()
	if w.raft != nil {
		// Outside mu: the index takes a replica's lock, under which an entry
		// read takes mu. Only this goroutine takes segments out of full, so
		// full[:n] stays as it was.
		for i, id := range ids {
			if w.raft.pinned(id) {
				n = i
				break
			}
		}
	}
	if n == 0 {
		return nil
	}
	if err := syncDB(); err != nil {
		return fmt.Errorf("sync database before releasing the log: %w", err)
	}
	// A released segment must never be replayed again: its old records would be
	// applied over history that Badger may have compacted since (a deleted key could
	// come back). So it is renamed out of the log, durably, or removed.
	w.mu.Lock()
	segs := slices.Clone(w.full[:n])
	w.full = append(w.full[:0], w.full[n:]...)
	for _, seg := range segs {
		delete(w.files, seg.id)
	}
	keep := keepRecycled - w.recycled()
	w.mu.Unlock()
	var freed []*segment
	var err error
	done := 0 // segs[:done] are out of the log
	for _, seg := range segs {
		if keep > 0 {
			free := filepath.Join(w.dir, fmt.Sprintf("%016d.free", seg.id))
			if rerr := os.Rename(seg.path, free); rerr != nil {
				err = fmt.Errorf("release log segment %d: %w", seg.id, rerr)
				break
			}
			keep--
			seg.path = free
			freed = append(freed, seg)
		} else {
			if rerr := os.Remove(seg.path); rerr != nil && !os.IsNotExist(rerr) {
				err = fmt.Errorf("remove log segment %d: %w", seg.id, rerr)
				break
			}
			seg.f.Close()
		}
		done++
	}
	if w.raft != nil {
		for _, seg := range segs[:done] {
			w.raft.released(seg.id)
		}
	}
	segs = segs[done:]
	if err == nil {
		err = syncPath(w.dir)
	}
	w.mu.Lock()
	w.free = append(w.free, freed...)
	// What could not be released stays first in line, for the next try.
	w.full = append(segs, w.full...)
	for _, seg := range segs {
		w.files[seg.id] = seg.f
	}
	w.mu.Unlock()
	return err
}

// readAt reads len(b) bytes at off of segment id (a raft entry's data).
func (w *wal) readAt(id uint64, b []byte, off int64) error {
	w.mu.Lock()
	f := w.files[id]
	w.mu.Unlock()
	if f == nil {
		return fmt.Errorf("persistence: log segment %d is not open", id)
	}
	if _, err := f.ReadAt(b, off); err != nil {
		return fmt.Errorf("read log segment %d at %d: %w", id, off, err)
	}
	return nil
}

// recycled counts the released segments kept for reuse (not the prepared one).
func (w *wal) recycled() int {
	n := 0
	for _, seg := range w.free {
		if filepath.Base(seg.path) != preparedFree {
			n++
		}
	}
	return n
}

// segments returns how many segments hold unreleased records.
func (w *wal) segments() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.full) + 1
}

func (w *wal) closeAll() {
	w.stopPreparing()
	for _, s := range w.full {
		s.f.Close()
	}
	for _, f := range w.free {
		f.f.Close()
	}
	if w.cur != nil {
		if w.cur.pw != nil {
			w.cur.pw.close()
		}
		w.cur.f.Close()
	}
}

func (w *wal) close() error {
	err := w.sync()
	w.closeAll()
	return err
}

func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// syncPath fsyncs the file or directory at path.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

// Change encoding in a record payload: op (1 set, 2 delete), uvarint key length,
// key, and for a set uvarint value length and value.
const (
	opSet    byte = 1
	opDelete byte = 2
	// opSetPart: key, then uvarint back, off, n: the value is bytes [off,
	// off+n) of the value of the set back sets before it in the same record.
	opSetPart byte = 3
)

func appendWrite(b []byte, w *Write) []byte {
	for i, kv := range w.Sets {
		// A reference takes up to three varints: worth it from a few bytes on.
		if j := kv.Of - 1; j >= 0 && j < i && len(kv.Value) >= 16 && kv.At >= 0 && kv.At+len(kv.Value) <= len(w.Sets[j].Value) &&
			bytes.Equal(w.Sets[j].Value[kv.At:kv.At+len(kv.Value)], kv.Value) {
			b = append(b, opSetPart)
			b = binary.AppendUvarint(b, uint64(len(kv.Key)))
			b = append(b, kv.Key...)
			b = binary.AppendUvarint(b, uint64(i-j))
			b = binary.AppendUvarint(b, uint64(kv.At))
			b = binary.AppendUvarint(b, uint64(len(kv.Value)))
			continue
		}
		b = append(b, opSet)
		b = binary.AppendUvarint(b, uint64(len(kv.Key)))
		b = append(b, kv.Key...)
		b = binary.AppendUvarint(b, uint64(len(kv.Value)))
		b = append(b, kv.Value...)
	}
	for _, k := range w.Deletes {
		b = append(b, opDelete)
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
	}
	return b
}

// decodeChanges calls set or del for each change in payload, in order.
func decodeChanges(payload []byte, set func(k, v []byte) error, del func(k []byte) error) error {
	return decodeRecord(payload, set, del, nil)
}

// decodeRecord is decodeChanges for a payload that may hold raft changes
// (ops 4-6, raftrecord.go): raft is called at each, with a decoder at the
// op's body, and must consume the change. A nil raft makes them corrupt.
func decodeRecord(payload []byte, set func(k, v []byte) error, del func(k []byte) error, raft func(d *raftDecoder, op byte) error) error {
	full := payload
	uvarint := func() (uint64, error) {
		n, used := binary.Uvarint(payload)
		if used <= 0 {
			return 0, errCorrupt
		}
		payload = payload[used:]
		return n, nil
	}
	next := func() ([]byte, error) {
		n, err := uvarint()
		if err != nil || uint64(len(payload)) < n {
			return nil, errCorrupt
		}
		b := payload[:n]
		payload = payload[n:]
		return b, nil
	}
	var values [][]byte // the values set so far in this record, for opSetPart
	for len(payload) > 0 {
		op := payload[0]
		payload = payload[1:]
		if (op >= opRaftBlock && op <= opRaftState) || op == opRaftSnapshot {
			if raft == nil {
				return errCorrupt
			}
			d := raftDecoder{p: full, pos: len(full) - len(payload)}
			if err := raft(&d, op); err != nil {
				return err
			}
			payload = full[d.pos:]
			continue
		}
		k, err := next()
		if err != nil {
			return err
		}
		switch op {
		case opSet, opSetPart:
			var v []byte
			if op == opSet {
				if v, err = next(); err != nil {
					return err
				}
			} else {
				var ref [3]uint64 // back, off, n
				for i := range ref {
					if ref[i], err = uvarint(); err != nil {
						return err
					}
				}
				back, off, n := ref[0], ref[1], ref[2]
				if back == 0 || back > uint64(len(values)) {
					return errCorrupt
				}
				src := values[uint64(len(values))-back]
				if off > uint64(len(src)) || n > uint64(len(src))-off {
					return errCorrupt
				}
				v = src[off : off+n]
			}
			values = append(values, v)
			if err := set(k, v); err != nil {
				return err
			}
		case opDelete:
			if err := del(k); err != nil {
				return err
			}
		default:
			return errCorrupt
		}
	}
	return nil
}

// removeAll closes and removes every segment: after a clean close of Badger the
// log holds nothing Badger lacks.
func (w *wal) removeAll() error {
	w.closeAll()
	ids, err := w.segmentIDs()
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := os.Remove(segmentName(w.dir, id)); err != nil {
			return fmt.Errorf("remove log segment %d: %w", id, err)
		}
	}
	free, _ := filepath.Glob(filepath.Join(w.dir, "*.free"))
	for _, p := range free {
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("remove released log segment: %w", err)
		}
	}
	return syncPath(w.dir)
}
