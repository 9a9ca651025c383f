package persistence

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"

	"github.com/holdfast/holdfast/internal/durable"
)

// Raft snapshots in the write-ahead log (docs/replication-design.md, section
// 6). A replica that receives a snapshot gets its data as chunks, which are
// written to a staged file in the data directory (Dir/snap), each chunk
// synced before the next is asked for; nothing reaches Badger yet. When every
// chunk is durable, raft hands the snapshot to the append job, and the
// committer logs
//
//	op 8  snapshot  group | replica | index | term | conf | ref
//	                ref: staged file id | size in bytes | chunks
//
// (with the append's HardState and entries after it, in the same record and
// the same sync). Once it is durable the replica's log is reset: empty,
// starting at index+1 after term, with conf as its configuration (the restart
// point); the log keeps the ref as "the restart point is a snapshot Badger may
// not hold yet". Then the applier installs it, alone in its batch, at one
// version: every key of the partition the snapshot lacks is deleted, every key
// whose value differs is written (a merge of Badger's keys and the staged
// file's, both in key order).
//
// All or nothing across crashes: before op 8 is durable, the staged file is
// garbage (Open deletes every staged file no log refers to) and the replica's
// log and Badger are untouched. Once it is durable, every Open installs the
// snapshot again (Badger may have lost the install: it syncs nothing of its
// own) until a truncation of the replica's log says Badger flushed it: the
// WALPipeline truncates to a point at or above the snapshot's index only once
// Badger holds that index in synced tables (RaftFlushed), and a truncation
// record clears the ref (and deletes the file once durable). Installing again
// over a Badger that holds later entries is safe: the log still holds every
// entry after the snapshot (it starts at index+1), and the restart applies
// them again, as it does for any replica.
//
// The op 6 state record carries the ref too, so that the segment holding op 8
// may be released while the ref is live. Op 7 (the design's chunk record) is
// not used: the chunks are in the staged file, not in the log (design section
// 6 says why).
//
// The staged file is a sequence of chunks, each
//
//	length (4 bytes LE) | crc32c of length and chunk (4 bytes LE) | chunk
//
// where a chunk is the changes of ops 1 (set) in the log's encoding, keys
// under the group's partition prefix in strictly increasing order over the
// whole file. A file that does not match its ref (size, chunk count, a
// checksum, the key order) stops Open with a *CorruptionError naming it and
// the offset.
const opRaftSnapshot byte = 8

// snapDir is the directory of the staged snapshot files, under the data
// directory.
const snapDir = "snap"

// snapRef names a replica's staged snapshot file and what it holds; id 0:
// none.
type snapRef struct{ id, size, chunks uint64 }

// RaftSnapshotRef names a staged snapshot (StagedSnapshot.Finish), for
// RaftAppend.Snapshot.
type RaftSnapshotRef struct {
	ID, Size, Chunks uint64
}

func appendSnapRef(p []byte, r snapRef) []byte {
	p = binary.AppendUvarint(p, r.id)
	if r.id == 0 {
		return p
	}
	p = binary.AppendUvarint(p, r.size)
	return binary.AppendUvarint(p, r.chunks)
}

func (d *raftDecoder) snapRef() (snapRef, error) {
	var r snapRef
	var err error
	if r.id, err = d.uvarint(); err != nil || r.id == 0 {
		return r, err
	}
	if r.size, err = d.uvarint(); err != nil {
		return r, err
	}
	if r.chunks, err = d.uvarint(); err != nil {
		return r, err
	}
	if r.chunks*stagedChunkHeader > r.size {
		return r, errCorrupt
	}
	return r, nil
}

// raftSnapshot is one op 8 change.
type raftSnapshot struct {
	key         raftKey
	index, term uint64
	conf        logConf
	ref         snapRef
}

func appendRaftSnapshot(p []byte, s *raftSnapshot) []byte {
	p = append(p, opRaftSnapshot)
	p = binary.AppendUvarint(p, s.key.group)
	p = binary.AppendUvarint(p, s.key.replica)
	p = binary.AppendUvarint(p, s.index)
	p = binary.AppendUvarint(p, s.term)
	p = appendConf(p, s.conf)
	return appendSnapRef(p, s.ref)
}

// snapshot decodes the body of an op 8 change: index and term at least 1, a
// configuration, a ref.
func (d *raftDecoder) snapshot() (raftSnapshot, error) {
	var s raftSnapshot
	var err error
	if s.key, err = d.key(); err != nil {
		return s, err
	}
	if s.index, err = d.uvarint(); err != nil || s.index == 0 {
		return s, errCorrupt
	}
	if s.term, err = d.uvarint(); err != nil || s.term == 0 {
		return s, errCorrupt
	}
	if s.conf, err = d.conf(); err != nil || !s.conf.set {
		return s, errCorrupt
	}
	if s.ref, err = d.snapRef(); err != nil || s.ref.id == 0 {
		return s, errCorrupt
	}
	return s, nil
}

// checkSnapshot says why s cannot reset l (nil if it can): raft installs a
// snapshot only beyond its commit index, so it never goes back below the
// log's start.
func (l *replicaLog) checkSnapshot(s *raftSnapshot) *raftReplayError {
	if s.index+1 < l.first {
		return &raftReplayError{s.key, s.index, fmt.Sprintf("a snapshot at index %d goes back below the log's first index %d", s.index, l.first)}
	}
	return nil
}

// reset makes l the log after snapshot s: empty, starting at s.index+1.
func (l *replicaLog) reset(s *raftSnapshot) {
	l.ents, l.cached = nil, 0
	l.first, l.prevTerm, l.cacheFrom = s.index+1, s.term, s.index+1
	l.conf, l.snap = s.conf, s.ref
}

// replaySnapshot checks and applies an op 8 change.
func (x *raftIndex) replaySnapshot(s *raftSnapshot) *raftReplayError {
	l := x.replica(s.key, true)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.checkSnapshot(s); err != nil {
		return err
	}
	l.reset(s)
	return nil
}

// pendingSnapshots returns the replicas whose restart point is a snapshot
// Badger may not hold (their ref is live), with the snapshot's index.
func (x *raftIndex) pendingSnapshots() map[raftKey]pendingSnap {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[raftKey]pendingSnap{}
	for k, l := range x.logs {
		l.mu.Lock()
		if l.snap.id != 0 {
			out[k] = pendingSnap{ref: l.snap, index: l.first - 1, term: l.prevTerm, conf: l.conf}
		}
		l.mu.Unlock()
	}
	return out
}

// newestReplicas returns, for every group with a log here, the highest
// replica id among its logs.
func (x *raftIndex) newestReplicas() map[uint64]uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[uint64]uint64{}
	for k := range x.logs {
		out[k.group] = max(out[k.group], k.replica)
	}
	return out
}

// hasNewer reports whether the node holds a log of a replica of group newer
// than replica (replica ids only grow within a group): replica then left the
// group, and its snapshot is never the partition's state.
func (x *raftIndex) hasNewer(group, replica uint64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for k := range x.logs {
		if k.group == group && k.replica > replica {
			return true
		}
	}
	return false
}

type pendingSnap struct {
	ref         snapRef
	index, term uint64
	conf        logConf
}

// stagedName is the file name of replica k's staged snapshot id.
func stagedName(k raftKey, id uint64) string {
	return fmt.Sprintf("%d-%d-%016x.snap", k.group, k.replica, id)
}

func (db *DB) stagedPath(k raftKey, id uint64) string {
	return filepath.Join(db.dir, snapDir, stagedName(k, id))
}

// stagedChunkHeader is a staged chunk's length and checksum.
const stagedChunkHeader = 8

// maxStagedChunk bounds one chunk (a corrupt length must not allocate GiBs).
const maxStagedChunk = 256 << 20

// stageIDs makes staged file ids unique across restarts: above the clock's
// nanoseconds at first use, then increasing.
var stageIDs struct {
	sync.Mutex
	last uint64
}

func nextStageID() uint64 {
	stageIDs.Lock()
	defer stageIDs.Unlock()
	stageIDs.last = max(stageIDs.last+1, uint64(time.Now().UnixNano()))
	return stageIDs.last
}

// StagedSnapshot is an incoming snapshot being written to its staged file
// (see raftsnapshot.go's top). One goroutine uses it.
type StagedSnapshot struct {
	key     raftKey
	id      uint64
	path    string
	f       *os.File
	size    uint64
	chunks  uint64
	lastKey []byte
	prefix  []byte
	done    bool
}

// StageRaftSnapshot starts the staged file of a snapshot for replica of
// group (a partition: its keys are under PartitionPrefix(group)). The file
// is garbage until an op 8 record names it: Abort removes it, and Open
// removes every staged file no replica's log names.
func (db *DB) StageRaftSnapshot(group, replica uint64) (*StagedSnapshot, error) {
	if !db.replicated {
		return nil, errors.New("persistence: snapshots are staged only by a replicated database")
	}
	if replica == 0 || group >= MaxPartitions {
		return nil, fmt.Errorf("persistence: snapshot of group %d replica %d: no such partition or replica", group, replica)
	}
	dir := filepath.Join(db.dir, snapDir)
	if err := durable.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("persistence: create the snapshot directory: %w", err)
	}
	k := raftKey{group, replica}
	id := nextStageID()
	path := db.stagedPath(k, id)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("persistence: stage a snapshot: %w", err)
	}
	if err := durable.SyncDir(dir); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return nil, fmt.Errorf("persistence: stage a snapshot: %w", err)
	}
	return &StagedSnapshot{key: k, id: id, path: path, f: f, prefix: PartitionPrefix(uint32(group))}, nil
}

// Append checks chunk (sets only, keys under the partition's prefix, in
// increasing order after the previous chunk's) and writes it to the staged
// file, synced: it is durable when Append returns nil. After an error the
// stage is unusable: Abort it.
func (s *StagedSnapshot) Append(chunk []byte) error {
	if s.done {
		return errors.New("persistence: staged snapshot already finished")
	}
	if len(chunk) == 0 || len(chunk) > maxStagedChunk {
		return fmt.Errorf("persistence: snapshot chunk of %d bytes (1 to %d)", len(chunk), maxStagedChunk)
	}
	err := decodeRecord(chunk,
		func(k, _ []byte) error {
			if !bytes.HasPrefix(k, s.prefix) {
				return fmt.Errorf("key %q is outside partition %d", k, s.key.group)
			}
			if s.lastKey != nil && bytes.Compare(k, s.lastKey) <= 0 {
				return fmt.Errorf("key %q does not follow %q", k, s.lastKey)
			}
			s.lastKey = append(s.lastKey[:0], k...)
			return nil
		},
		func([]byte) error { return errors.New("a delete in a snapshot") },
		nil)
	if err != nil {
		return fmt.Errorf("persistence: snapshot chunk %d of group %d: %w", s.chunks, s.key.group, err)
	}
	var hdr [stagedChunkHeader]byte
	binary.LittleEndian.PutUint32(hdr[:4], uint32(len(chunk)))
	binary.LittleEndian.PutUint32(hdr[4:], stagedCRC(hdr[:4], chunk))
	if _, err := s.f.Write(hdr[:]); err != nil {
		return fmt.Errorf("persistence: write a snapshot chunk: %w", err)
	}
	if _, err := s.f.Write(chunk); err != nil {
		return fmt.Errorf("persistence: write a snapshot chunk: %w", err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("persistence: sync a snapshot chunk: %w", err)
	}
	s.size += uint64(stagedChunkHeader + len(chunk))
	s.chunks++
	return nil
}

// Finish closes the staged file (every chunk is synced) and returns its ref
// for RaftAppend.Snapshot.
func (s *StagedSnapshot) Finish() (RaftSnapshotRef, error) {
	if s.done {
		return RaftSnapshotRef{}, errors.New("persistence: staged snapshot already finished")
	}
	s.done = true
	if err := s.f.Close(); err != nil {
		_ = os.Remove(s.path)
		return RaftSnapshotRef{}, fmt.Errorf("persistence: close a staged snapshot: %w", err)
	}
	return RaftSnapshotRef{ID: s.id, Size: s.size, Chunks: s.chunks}, nil
}

// Abort removes the staged file.
func (s *StagedSnapshot) Abort() {
	if !s.done {
		s.done = true
		_ = s.f.Close()
	}
	_ = os.Remove(s.path)
}

// RemoveStagedSnapshot removes a finished staged file that no append took
// (raft did not want the snapshot). Never call it for a ref handed to
// AppendRaft.
func (db *DB) RemoveStagedSnapshot(group, replica uint64, ref RaftSnapshotRef) {
	_ = os.Remove(db.stagedPath(raftKey{group, replica}, ref.ID))
}

func stagedCRC(lenBytes, chunk []byte) uint32 {
	return crc32.Update(crc32.Update(0, crcTable, lenBytes), crcTable, chunk)
}

// stagedReader reads a staged file's chunks back, checking each against its
// checksum and the whole file against its ref.
type stagedReader struct {
	path  string
	f     *os.File
	r     *bufio.Reader
	ref   snapRef
	key   raftKey
	index uint64
	off   int64
	n     uint64
}

func (db *DB) openStaged(k raftKey, ref snapRef, index uint64) (*stagedReader, error) {
	path := db.stagedPath(k, ref.id)
	f, err := os.Open(path)
	if err != nil {
		return nil, &CorruptionError{File: path, Reason: fmt.Sprintf("the staged snapshot of group %d replica %d at index %d cannot be opened: %v", k.group, k.replica, index, err),
			Group: k.group, Replica: k.replica, Index: index}
	}
	return &stagedReader{path: path, f: f, r: bufio.NewReaderSize(f, 256<<10), ref: ref, key: k, index: index}, nil
}

func (r *stagedReader) close() { _ = r.f.Close() }

func (r *stagedReader) corrupt(reason string) error {
	return &CorruptionError{File: r.path, Offset: r.off, Reason: fmt.Sprintf("the staged snapshot of group %d replica %d at index %d: %s", r.key.group, r.key.replica, r.index, reason),
		Group: r.key.group, Replica: r.key.replica, Index: r.index}
}

// next returns the next chunk (a new slice), or io.EOF after the last one
// the ref counts, once the file is found to end there.
func (r *stagedReader) next() ([]byte, error) {
	var hdr [stagedChunkHeader]byte
	if r.n == r.ref.chunks {
		if uint64(r.off) != r.ref.size {
			return nil, r.corrupt(fmt.Sprintf("%d chunks end at offset %d, the snapshot record says %d bytes", r.n, r.off, r.ref.size))
		}
		if _, err := r.r.ReadByte(); err != io.EOF {
			return nil, r.corrupt("bytes after the last chunk")
		}
		return nil, io.EOF
	}
	if _, err := io.ReadFull(r.r, hdr[:]); err != nil {
		return nil, r.corrupt(fmt.Sprintf("chunk %d of %d: %v", r.n+1, r.ref.chunks, err))
	}
	n := binary.LittleEndian.Uint32(hdr[:4])
	if n == 0 || n > maxStagedChunk || uint64(r.off)+stagedChunkHeader+uint64(n) > r.ref.size {
		return nil, r.corrupt(fmt.Sprintf("chunk %d has a bad length %d", r.n+1, n))
	}
	chunk := make([]byte, n)
	if _, err := io.ReadFull(r.r, chunk); err != nil {
		return nil, r.corrupt(fmt.Sprintf("chunk %d of %d: %v", r.n+1, r.ref.chunks, err))
	}
	if stagedCRC(hdr[:4], chunk) != binary.LittleEndian.Uint32(hdr[4:]) {
		return nil, r.corrupt(fmt.Sprintf("chunk %d fails its checksum", r.n+1))
	}
	r.off += stagedChunkHeader + int64(n)
	r.n++
	return chunk, nil
}

// installStaged installs replica k's staged snapshot (at index) into Badger
// at version, reading Badger as of version-1: every key under the partition's
// prefix that the snapshot lacks is deleted, every key whose value differs is
// set, all at version, through a KVLoader (a snapshot may be far larger than
// a transaction). Only the applier (or Open, before it runs) calls it. A
// staged file that does not check out is a *CorruptionError.
func (db *DB) installStaged(k raftKey, ref snapRef, index, version uint64) error {
	sr, err := db.openStaged(k, ref, index)
	if err != nil {
		return err
	}
	defer sr.close()
	prefix := PartitionPrefix(uint32(k.group))
	txn := db.bdb.NewTransactionAt(version-1, false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
	defer it.Close()
	it.Seek(prefix)
	loader := db.bdb.NewKVLoader(4)
	finished := false
	defer func() {
		if !finished {
			_ = loader.Finish()
		}
	}()
	set := func(key, value []byte, del bool) error {
		kv := &pb.KV{Key: key, Value: value, Version: version}
		if del {
			kv.Meta = badgerDeleteMeta
		}
		return loader.Set(kv)
	}
	// deleteBelow deletes Badger's keys below key (nil: all that are left).
	deleteBelow := func(key []byte) error {
		for ; it.ValidForPrefix(prefix); it.Next() {
			bk := it.Item().Key()
			if key != nil && bytes.Compare(bk, key) >= 0 {
				return nil
			}
			if err := set(it.Item().KeyCopy(nil), nil, true); err != nil {
				return err
			}
		}
		return nil
	}
	var last []byte
	for {
		chunk, err := sr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		err = decodeRecord(chunk,
			func(key, value []byte) error {
				if !bytes.HasPrefix(key, prefix) || (last != nil && bytes.Compare(key, last) <= 0) {
					return sr.corrupt(fmt.Sprintf("key %q out of order or outside the partition", key))
				}
				last = key
				if err := deleteBelow(key); err != nil {
					return err
				}
				if it.ValidForPrefix(prefix) && bytes.Equal(it.Item().Key(), key) {
					same := false
					if err := it.Item().Value(func(v []byte) error { same = bytes.Equal(v, value); return nil }); err != nil {
						return err
					}
					it.Next()
					if same {
						return nil // Badger holds it already
					}
				}
				return set(key, value, false)
			},
			func([]byte) error { return sr.corrupt("a delete in a snapshot chunk") },
			nil)
		if err != nil {
			var ce *CorruptionError
			if errors.As(err, &ce) {
				return err
			}
			if errors.Is(err, errCorrupt) {
				return sr.corrupt("a chunk that does not decode")
			}
			return fmt.Errorf("install the snapshot of group %d at index %d: %w", k.group, index, err)
		}
	}
	if err := deleteBelow(nil); err != nil {
		return fmt.Errorf("install the snapshot of group %d at index %d: %w", k.group, index, err)
	}
	finished = true
	if err := loader.Finish(); err != nil {
		return fmt.Errorf("install the snapshot of group %d at index %d: %w", k.group, index, err)
	}
	return nil
}

// reinstallSnapshots installs, at Open, every snapshot that is a replica's
// restart point and that Badger may have lost (its ref is live), each at the
// next version; then removes every staged file no log names.
//
// Only the snapshot of a group's newest replica on this node is installed.
// A node may hold the log of a replica that left the group (removed by a
// move, or replaced by a recovery) beside the group's current replica, each
// naming a snapshot: the old one, installed after the current one (map
// order), put the partition back to its old state under a replica that had
// applied far more (found by the torture tool's five-node runs: a log read
// from offset 0 started at 5787). Replica ids only grow within a group, so
// the newest replica is the one with the highest id; an older replica's
// snapshot is never its state.
func (db *DB) reinstallSnapshots() error {
	pending := db.raft.pendingSnapshots()
	newest := db.raft.newestReplicas()
	for k, ps := range pending {
		if k.replica != newest[k.group] {
			db.log.Info("not installing the snapshot of a replica the group replaced on this node", "group", k.group, "replica", k.replica, "newest", newest[k.group], "index", ps.index)
			continue
		}
		db.version++
		if err := db.installStaged(k, ps.ref, ps.index, db.version); err != nil {
			return err
		}
		db.log.Info("installed a raft snapshot again from its staged file", "group", k.group, "replica", k.replica, "index", ps.index)
	}
	dir := filepath.Join(db.dir, snapDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the snapshot directory: %w", err)
	}
	keep := map[string]bool{}
	for k, ps := range pending {
		keep[stagedName(k, ps.ref.id)] = true
	}
	removed := 0
	for _, e := range ents {
		if keep[e.Name()] || !strings.HasSuffix(e.Name(), ".snap") {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("remove a staged snapshot no log names: %w", err)
		}
		removed++
	}
	if removed > 0 {
		db.log.Info("removed staged snapshots no replica installed", "files", removed)
		return durable.SyncDir(dir)
	}
	return nil
}

// removeStaged removes replica k's staged file id once no log needs it.
func (db *DB) removeStaged(k raftKey, id uint64) {
	if err := os.Remove(db.stagedPath(k, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		db.log.Warn("could not remove a staged snapshot", "file", db.stagedPath(k, id), "err", err)
	}
}

// RaftSnapshot is a snapshot a replica installs (RaftAppend.Snapshot).
type RaftSnapshot struct {
	// Index and Term are the snapshot's last entry; ConfState the
	// configuration there (a marshalled raftpb.ConfState).
	Index, Term uint64
	ConfState   []byte
	// Ref is the staged file that holds its data (StagedSnapshot.Finish).
	// From AppendRaft on it belongs to the database.
	Ref RaftSnapshotRef
	// Installed, if not nil, is called once Badger holds the snapshot (nil),
	// or with why it never will in this process, on the applier's goroutine;
	// it must not block.
	Installed func(error)
}

// snapInstallJob is an installation for the applier.
type snapInstallJob struct {
	key   raftKey
	state RaftAppliedState
	ref   snapRef
	done  func(error)
}

// RaftCapture is a replica's applied state and the Badger version that holds
// it, under a hold (see CaptureRaftSnapshot).
type RaftCapture struct {
	State   RaftAppliedState
	Version uint64
	// Release gives the hold back; call it once.
	Release func()
}

// captureJob is a CaptureRaftSnapshot for the applier.
type captureJob struct {
	key  raftKey
	done func(RaftCapture, error)
}

// CaptureRaftSnapshot has the applier, between two batches, take replica of
// group's newest applied state as it wrote it into Badger since the
// pipeline started, and the Badger version that holds exactly that state,
// with a hold on every version above it (HoldVersions) so that a read at the
// version sees it for as long as the hold lasts. done gets it, or why not (no
// apply of the replica since start, the pipeline closed), on the applier's
// goroutine; it must not block.
//
// The caller knows whether Badger's partition then holds only what the
// state says: after a restart, Badger may hold entries the replica applied
// before it, until it applied them again (replication.WALPipeline waits).
func (p *Pipeline) CaptureRaftSnapshot(group, replica uint64, done func(RaftCapture, error)) {
	p.mu.Lock()
	err := p.refusalLocked()
	if err == nil {
		p.applies.push(applyJob{capture: &captureJob{key: raftKey{group, replica}, done: done}, size: 1})
	}
	p.mu.Unlock()
	if err != nil {
		done(RaftCapture{}, err)
	}
}

// capture runs a captureJob (applier only).
func (p *Pipeline) capture(c *captureJob) {
	st, ok := p.lastApplied[c.key]
	if !ok {
		c.done(RaftCapture{}, fmt.Errorf("persistence: group %d replica %d applied nothing since the start", c.key.group, c.key.replica))
		return
	}
	v := p.db.version
	c.done(RaftCapture{State: st, Version: v, Release: p.HoldVersions(v)}, nil)
}

// RaftSnapshotReader reads a partition's keys at one version as snapshot
// chunks (see StagedSnapshot.Append). One goroutine uses it.
type RaftSnapshotReader struct {
	txn    *badger.Txn
	it     *badger.Iterator
	prefix []byte
	chunk  int
	done   bool
}

// ReadRaftSnapshot returns a reader of group's keys (its partition's) as of
// version (a RaftCapture's, whose hold must last until Close), in chunks of
// about chunkBytes.
func (db *DB) ReadRaftSnapshot(group, version uint64, chunkBytes int) *RaftSnapshotReader {
	prefix := PartitionPrefix(uint32(group))
	txn := db.bdb.NewTransactionAt(version, false)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: false})
	it.Seek(prefix)
	return &RaftSnapshotReader{txn: txn, it: it, prefix: prefix, chunk: max(chunkBytes, 1)}
}

// Next returns the next chunk (a new slice), or io.EOF after the last. A
// chunk holds at least one key.
func (r *RaftSnapshotReader) Next() ([]byte, error) {
	if r.done {
		return nil, io.EOF
	}
	var b []byte
	for ; r.it.ValidForPrefix(r.prefix) && len(b) < r.chunk; r.it.Next() {
		item := r.it.Item()
		k := item.Key()
		err := item.Value(func(v []byte) error {
			b = append(b, opSet)
			b = binary.AppendUvarint(b, uint64(len(k)))
			b = append(b, k...)
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("persistence: read a snapshot: %w", err)
		}
	}
	if len(b) == 0 {
		r.done = true
		return nil, io.EOF
	}
	return b, nil
}

// Close ends the read.
func (r *RaftSnapshotReader) Close() {
	if r.it != nil {
		r.it.Close()
		r.txn.Discard()
		r.it = nil
	}
}

// HasNewerReplica reports whether the node holds a log of a replica of group
// newer than replica: replica left the group, and the partition's data here is
// the newer one's.
func (db *DB) HasNewerReplica(group, replica uint64) bool { return db.raft.hasNewer(group, replica) }
