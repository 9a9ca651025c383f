package persistence

import (
	"fmt"
	"sync/atomic"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// RaftStorage is one replica's raft log as the write-ahead log holds it, as
// a raft.Storage: what the committer made durable (Pipeline.AppendRaft) and
// Open replayed. Entries are read from the entry cache or from their log
// segment.
type RaftStorage struct {
	x         *raftIndex
	key       raftKey
	confState func() *raftpb.ConfState
	// l is the replica's log once it has one. The index never drops or
	// replaces a replica's log (raftIndex.replica creates it once; a
	// reopened database has a new index, and new RaftStorages), so the
	// pointer stays good: raft asks Term and FirstIndex several times per
	// message, and each skipped the index's mutex (shared by every replica
	// and the committer) and its map.
	l atomic.Pointer[replicaLog]
}

var _ raft.Storage = (*RaftStorage)(nil)

// RaftStorage returns the raft.Storage of replica's log in group. Its
// ConfState (InitialState's, and the snapshot metadata's) is the one the log
// holds as of its first index - 1 (TruncateRaft), or else confState's (nil
// func or result: an empty one). A replica without a log yet has an empty
// one: first index 1, last index 0.
func (db *DB) RaftStorage(group, replica uint64, confState func() *raftpb.ConfState) *RaftStorage {
	return &RaftStorage{x: db.raft, key: raftKey{group, replica}, confState: confState}
}

// log returns the replica's log, locked, or nil (no log yet: the caller
// answers as for an empty one).
func (s *RaftStorage) log() *replicaLog {
	l := s.l.Load()
	if l == nil {
		if l = s.x.replica(s.key, false); l == nil {
			return nil
		}
		s.l.Store(l)
	}
	l.mu.Lock()
	return l
}

// conf returns the replica's configuration as of first-1 (see RaftStorage),
// l locked or nil.
func (s *RaftStorage) conf(l *replicaLog) (*raftpb.ConfState, error) {
	if l != nil && l.conf.set {
		cs := &raftpb.ConfState{}
		if err := proto.Unmarshal([]byte(l.conf.cs), cs); err != nil {
			return nil, fmt.Errorf("persistence: group %d replica %d: the log's configuration: %w", s.key.group, s.key.replica, err)
		}
		return cs, nil
	}
	var cs *raftpb.ConfState
	if s.confState != nil {
		cs = s.confState()
	}
	return raftpb.EnsureConfState(cs), nil
}

// InitialState implements raft.Storage.
func (s *RaftStorage) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	l := s.log()
	if l == nil {
		cs, _ := s.conf(nil)
		return &raftpb.HardState{}, cs, nil
	}
	defer l.mu.Unlock()
	cs, err := s.conf(l)
	if err != nil {
		return nil, nil, err
	}
	if !l.hasHS {
		return &raftpb.HardState{}, cs, nil
	}
	return &raftpb.HardState{Term: new(l.hs.term), Vote: new(l.hs.vote), Commit: new(l.hs.commit)}, cs, nil
}

// Entries implements raft.Storage: the entries [lo, hi), at least one, at
// most maxSize bytes (raft's measure: their protobuf sizes) beyond the first.
func (s *RaftStorage) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	l := s.log()
	if l == nil {
		if lo < 1 {
			return nil, raft.ErrCompacted
		}
		return nil, raft.ErrUnavailable
	}
	defer l.mu.Unlock()
	switch {
	case lo < l.first:
		return nil, raft.ErrCompacted
	case hi > l.last()+1:
		return nil, fmt.Errorf("%w: entries [%d, %d) asked of group %d replica %d, whose last index is %d",
			raft.ErrUnavailable, lo, hi, s.key.group, s.key.replica, l.last())
	case lo >= hi:
		return nil, raft.ErrUnavailable
	}
	out := make([]*raftpb.Entry, 0, min(hi-lo, 64))
	var size uint64
	for i := lo; i < hi; i++ {
		e := &l.ents[i-l.first]
		data := e.data
		if data == nil && e.size > 0 {
			data = make([]byte, e.size)
			if err := s.x.w.readAt(e.seg, data, e.off); err != nil {
				return nil, fmt.Errorf("group %d replica %d: read entry %d: %w", s.key.group, s.key.replica, i, err)
			}
		}
		ent := &raftpb.Entry{Index: new(i), Term: new(e.term), Type: raftpb.EntryType(e.typ).Enum(), Data: data}
		size += uint64(proto.Size(ent))
		if len(out) > 0 && size > maxSize {
			break
		}
		out = append(out, ent)
	}
	return out, nil
}

// Term implements raft.Storage.
func (s *RaftStorage) Term(i uint64) (uint64, error) {
	l := s.log()
	if l == nil {
		if i == 0 {
			return 0, nil
		}
		return 0, raft.ErrUnavailable
	}
	defer l.mu.Unlock()
	switch {
	case i+1 < l.first:
		return 0, raft.ErrCompacted
	case i > l.last():
		return 0, raft.ErrUnavailable
	}
	t, _ := l.term(i)
	return t, nil
}

// LastIndex implements raft.Storage.
func (s *RaftStorage) LastIndex() (uint64, error) {
	l := s.log()
	if l == nil {
		return 0, nil
	}
	defer l.mu.Unlock()
	return l.last(), nil
}

// FirstIndex implements raft.Storage.
func (s *RaftStorage) FirstIndex() (uint64, error) {
	l := s.log()
	if l == nil {
		return 1, nil
	}
	defer l.mu.Unlock()
	return l.first, nil
}

// Snapshot implements raft.Storage. Snapshots come with design step 6: until
// then a log that was never truncated has the empty snapshot (index 0), and a
// truncated one has none to give (raft asks again later).
func (s *RaftStorage) Snapshot() (*raftpb.Snapshot, error) {
	first, _ := s.FirstIndex()
	if first > 1 {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	l := s.log()
	if l != nil {
		defer l.mu.Unlock()
	}
	cs, err := s.conf(l)
	if err != nil {
		return nil, err
	}
	return &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{ConfState: cs, Index: new(uint64(0)), Term: new(uint64(0))}}, nil
}
