package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/holdfast/holdfast/persistence"
)

// WALPipeline's snapshots (design section 6; persistence/raftsnapshot.go for
// the storage side).
//
// Sending. raft asks the leader's Storage.Snapshot() when a follower needs
// entries the log no longer holds. The first ask returns
// ErrSnapshotTemporarilyUnavailable (raft asks again at the follower's next
// answer) and has the persistence applier capture, between two batches, the
// replica's applied state and the Badger version that holds exactly it,
// under a hold (persistence.CaptureRaftSnapshot): the snapshot's data are the
// partition's keys read at that version, consistent with the index, term and
// ConfState it claims. A capture is made only once the replica applied again
// everything its log held at the start (before that, Badger may hold entries
// applied before a restart beyond what the replica applied since). Later asks
// get the same snapshot while its configuration is the replica's and it is
// younger than SnapshotReuse; a replica added since needs one that lists it.
// While a snapshot is prepared or streamed (SnapshotSource), the log is not
// truncated past its index: the follower continues from the entry after it.
// A prepared snapshot no stream reads is released (its hold given back) once
// replaced or older than SnapshotReuse.
//
// Receiving (SnapshotSink): the chunks go to a staged file, each synced; the
// stream's end puts a reference to the file in the MsgSnap's Data, and the
// append job that carries the snapshot hands it to persistence (op 8 with
// the HardState, then the installation into Badger). The replica's applied
// index becomes the snapshot's once Badger holds it. Until a truncation at or
// above the snapshot's index (issued once Badger flushed it) the log keeps
// the reference and a restart installs the snapshot again.

// Snapshot.Data prefixes: a prepared snapshot's id (the sender's), a staged
// file's reference (the receiver's, after the stream).
const (
	snapDataPrepared byte = 'S'
	snapDataStaged   byte = 'R'
)

// prepSnap is a captured snapshot of one group (under w.mu).
type prepSnap struct {
	id      uint64
	state   persistence.RaftAppliedState
	cs      *raftpb.ConfState
	version uint64
	release func()
	refs    int // open readers
	at      time.Time
	stale   bool // replaced: released once refs is 0
}

func (ps *prepSnap) metadata() *raftpb.Snapshot {
	data := binary.AppendUvarint([]byte{snapDataPrepared}, ps.id)
	return &raftpb.Snapshot{Data: data, Metadata: &raftpb.SnapshotMetadata{
		ConfState: ps.cs, Index: new(ps.state.Index), Term: new(ps.state.Term)}}
}

// walStorage is a replica's RaftStorage whose Snapshot comes from the
// pipeline.
type walStorage struct {
	raft.Storage
	w *WALPipeline
	g GroupID
}

func (s walStorage) Snapshot() (*raftpb.Snapshot, error) { return s.w.snapshot(s.g) }

var (
	_ SnapshotSource = (*WALPipeline)(nil)
	_ SnapshotSink   = (*WALPipeline)(nil)
)

// snapshot is group g's Storage.Snapshot() (see the top of this file).
func (w *WALPipeline) snapshot(g GroupID) (*raftpb.Snapshot, error) {
	w.mu.Lock()
	if list := w.snaps[g]; len(list) > 0 {
		ps := list[len(list)-1]
		if !ps.stale && bytes.Equal(ps.state.ConfState, w.conf[g]) && time.Since(ps.at) < w.cfg.SnapshotReuse {
			w.mu.Unlock()
			return ps.metadata(), nil
		}
	}
	if w.preparing[g] || w.stopped || w.applied[g] < w.safe[g] {
		w.mu.Unlock()
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	w.preparing[g] = true
	replica := w.replica[g]
	w.mu.Unlock()
	w.p.CaptureRaftSnapshot(uint64(g), uint64(replica), func(c persistence.RaftCapture, err error) {
		var cs *raftpb.ConfState
		if err == nil {
			cs = &raftpb.ConfState{}
			if uerr := proto.Unmarshal(c.State.ConfState, cs); uerr != nil {
				err = fmt.Errorf("the applied configuration: %w", uerr)
			}
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.preparing[g] = false
		if err != nil || w.stopped {
			if c.Release != nil {
				c.Release()
			}
			if err != nil && !errors.Is(err, persistence.ErrClosed) {
				w.log.Warn("replication: could not capture a snapshot; raft asks again", "group", uint64(g), "err", err)
			}
			return
		}
		for _, old := range w.snaps[g] {
			old.stale = true
		}
		w.nextSnapID++
		w.snaps[g] = append(w.snaps[g], &prepSnap{id: w.nextSnapID, state: c.State, cs: cs, version: c.Version, release: c.Release, at: time.Now()})
		w.releaseSnapsLocked(g)
	})
	return nil, raft.ErrSnapshotTemporarilyUnavailable
}

// releaseSnapsLocked gives back the holds of g's snapshots that no reader
// uses and that are replaced or too old. w.mu is held.
func (w *WALPipeline) releaseSnapsLocked(g GroupID) {
	list := w.snaps[g][:0]
	for _, ps := range w.snaps[g] {
		if ps.refs == 0 && (ps.stale || w.stopped || time.Since(ps.at) >= w.cfg.SnapshotReuse) {
			ps.release()
			continue
		}
		list = append(list, ps)
	}
	if len(list) == 0 {
		delete(w.snaps, g)
		return
	}
	w.snaps[g] = list
}

// protectLocked returns the lowest index a prepared or streamed snapshot of
// g needs the log to go on from (its state), whether one does, and whether
// one is being captured (then nothing may be truncated). w.mu is held.
func (w *WALPipeline) protectLocked(g GroupID) (lo persistence.RaftAppliedState, has, capturing bool) {
	for _, ps := range w.snaps[g] {
		if !has || ps.state.Index < lo.Index {
			lo, has = ps.state, true
		}
	}
	return lo, has, w.preparing[g]
}

// OpenSnapshot implements SnapshotSource: the partition's keys at the
// snapshot's version, in chunks of SnapshotChunk bytes.
func (w *WALPipeline) OpenSnapshot(g GroupID, snap *raftpb.Snapshot) (SnapshotReader, error) {
	data := snap.GetData()
	if len(data) < 2 || data[0] != snapDataPrepared {
		return nil, fmt.Errorf("replication: group %d: the snapshot does not name a prepared snapshot", g)
	}
	id, n := binary.Uvarint(data[1:])
	if n <= 0 {
		return nil, fmt.Errorf("replication: group %d: the snapshot does not name a prepared snapshot", g)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return nil, errors.New("replication: the pipeline is closed")
	}
	for _, ps := range w.snaps[g] {
		if ps.id == id {
			ps.refs++
			w.readers.Add(1)
			r := w.db.ReadRaftSnapshot(uint64(g), ps.version, w.cfg.SnapshotChunk)
			return &walSnapReader{r: r, close: func() {
				w.mu.Lock()
				ps.refs--
				w.releaseSnapsLocked(g)
				w.mu.Unlock()
				w.readers.Done()
			}}, nil
		}
	}
	return nil, fmt.Errorf("replication: group %d: snapshot %d was released", g, id)
}

type walSnapReader struct {
	r     *persistence.RaftSnapshotReader
	close func()
}

func (r *walSnapReader) Next() ([]byte, error) { return r.r.Next() }

func (r *walSnapReader) Close() {
	if r.close != nil {
		r.r.Close()
		r.close()
		r.close = nil
	}
}

// ReceiveSnapshot implements SnapshotSink: chunks go to a staged file of
// the local replica to of g (which must be the pipeline's replica of g).
// A staged snapshot of g that no append took yet is dropped: raft did not
// want it, or this one replaces it.
func (w *WALPipeline) ReceiveSnapshot(g GroupID, to ReplicaID) (SnapshotWriter, error) {
	w.mu.Lock()
	replica, known := w.replica[g]
	old, hasOld := w.staged[g]
	delete(w.staged, g)
	stopped := w.stopped
	w.mu.Unlock()
	if hasOld {
		w.db.RemoveStagedSnapshot(uint64(g), uint64(replica), old)
	}
	switch {
	case stopped:
		return nil, errors.New("replication: the pipeline is closed")
	case !known || replica != to:
		return nil, fmt.Errorf("replication: group %d replica %d is not on this node", g, to)
	}
	s, err := w.db.StageRaftSnapshot(uint64(g), uint64(to))
	if err != nil {
		return nil, err
	}
	return &walSnapWriter{w: w, g: g, s: s}, nil
}

type walSnapWriter struct {
	w *WALPipeline
	g GroupID
	s *persistence.StagedSnapshot
}

func (x *walSnapWriter) Write(chunk []byte) error { return x.s.Append(chunk) }

func (x *walSnapWriter) Commit() ([]byte, error) {
	ref, err := x.s.Finish()
	if err != nil {
		return nil, err
	}
	x.w.mu.Lock()
	x.w.staged[x.g] = ref
	x.w.mu.Unlock()
	return encodeStagedRef(ref), nil
}

func (x *walSnapWriter) Abort() { x.s.Abort() }

func encodeStagedRef(ref persistence.RaftSnapshotRef) []byte {
	b := []byte{snapDataStaged}
	b = binary.AppendUvarint(b, ref.ID)
	b = binary.AppendUvarint(b, ref.Size)
	return binary.AppendUvarint(b, ref.Chunks)
}

func decodeStagedRef(b []byte) (persistence.RaftSnapshotRef, bool) {
	var ref persistence.RaftSnapshotRef
	if len(b) < 1 || b[0] != snapDataStaged {
		return ref, false
	}
	b = b[1:]
	for _, v := range []*uint64{&ref.ID, &ref.Size, &ref.Chunks} {
		n, used := binary.Uvarint(b)
		if used <= 0 {
			return ref, false
		}
		*v, b = n, b[used:]
	}
	return ref, len(b) == 0 && ref.ID != 0
}

// appendSnapshot turns the snapshot of an append job into persistence's
// (the rest of Append is the caller's), or fails.
func (w *WALPipeline) appendSnapshot(job Job, a *persistence.RaftAppend) (func(), error) {
	snap := job.Msg.GetSnapshot()
	g := job.Group
	ref, ok := decodeStagedRef(snap.GetData())
	if !ok {
		return nil, fmt.Errorf("replication: group %d: a snapshot at index %d without staged data (the transport must stream snapshots: NetConfig.Snapshots and SnapshotSink)", g, snap.GetMetadata().GetIndex())
	}
	md := snap.GetMetadata()
	cs := raftpb.EnsureConfState(md.GetConfState())
	b, err := proto.Marshal(cs)
	if err != nil {
		return nil, fmt.Errorf("replication: group %d: %w", g, err)
	}
	idx, term := md.GetIndex(), md.GetTerm()
	w.mu.Lock()
	if cur, has := w.staged[g]; has && cur == ref {
		delete(w.staged, g) // the database's from here on
	}
	w.mu.Unlock()
	a.Snapshot = &persistence.RaftSnapshot{Index: idx, Term: term, ConfState: b, Ref: ref,
		Installed: func(err error) {
			if err != nil {
				if !errors.Is(err, persistence.ErrClosed) {
					w.fail(fmt.Errorf("replication: group %d: install the snapshot at %d: %w", g, idx, err))
				}
				return
			}
			w.mu.Lock()
			w.applied[g] = max(w.applied[g], idx)
			w.safe[g] = idx // Badger's partition is exactly the snapshot's
			w.mu.Unlock()
			if w.cfg.OnSnapshot != nil {
				w.cfg.OnSnapshot(g, idx, term, cs)
			}
		}}
	// Run once the append is durable, before job.Done: the entries raft
	// applies next build on the snapshot's configuration.
	return func() {
		w.mu.Lock()
		w.first[g], w.cs[g], w.conf[g], w.installed[g] = idx+1, cs, b, idx
		delete(w.mark, g)
		w.mu.Unlock()
		w.log.Info("replication: snapshot durable; installing", "group", uint64(g), "index", idx, "term", term)
	}, nil
}
