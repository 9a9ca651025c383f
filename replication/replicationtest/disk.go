package replicationtest

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/replication"
)

// MemDisk is one node's "disk": for each group, the raft log and HardState
// the node's pipeline synced (a raft.MemoryStorage; its snapshot, once the
// pipeline compacts, is the state machine at the snapshot's index) and the
// state machine: its applied index, its digest (a hash chain over every
// applied entry: two replicas at one index hold the same digest iff they
// applied the same entries) and the ConfState at the applied index. It
// outlives the node's engines and pipelines: a crash loses what the pipeline
// had not synced, never the disk.
type MemDisk struct {
	mu     sync.Mutex
	groups map[replication.GroupID]*diskGroup
}

type diskGroup struct {
	storage *raft.MemoryStorage
	// durable, when set, is what survives a crash while storage runs ahead of
	// it (a page cache not yet synced): only the planted bug ackBeforeSync
	// uses it. Open rebuilds storage from it.
	durable *raft.MemoryStorage
	// Guarded by MemDisk.mu: the state machine.
	applied uint64
	digest  Digest
	conf    *raftpb.ConfState
	removed bool // the replica was removed from the group: its data are gone
	// replica, when set (CreateEmpty), is the replica these data belong to:
	// the pipeline ignores jobs of an earlier replica of the group on this
	// node that were still queued when it was removed.
	replica  replication.ReplicaID
	installs int // snapshots installed
}

// Digest is a state machine's state: a hash chain over the entries it
// applied (snapshots carry it as their data).
type Digest [32]byte

// next chains one applied entry into the digest.
func (d Digest) next(ent *raftpb.Entry) Digest {
	h := sha256.New()
	h.Write(d[:])
	var b [17]byte
	binary.BigEndian.PutUint64(b[:8], ent.GetIndex())
	binary.BigEndian.PutUint64(b[8:16], ent.GetTerm())
	b[16] = byte(ent.GetType())
	h.Write(b[:])
	h.Write(ent.GetData())
	var out Digest
	h.Sum(out[:0])
	return out
}

// BootstrapIndex is the index of a bootstrapped group's initial snapshot:
// its log starts above it. The initial configuration is in that snapshot,
// not in the log, so a replica with an empty log can only learn the group
// from a snapshot (index 0 would let a leader send it the log from index 1
// and it would apply the entries under an empty config).
const BootstrapIndex = 1

// ErrRemoved: the replica was removed from its group and its data deleted.
var ErrRemoved = errors.New("replicationtest: replica removed from its group")

// NewMemDisk returns an empty disk.
func NewMemDisk() *MemDisk {
	return &MemDisk{groups: make(map[replication.GroupID]*diskGroup)}
}

// Bootstrap creates group g's log with voters as its configuration: a
// snapshot at BootstrapIndex (term 1) whose ConfState lists the voters.
func (d *MemDisk) Bootstrap(g replication.GroupID, voters []replication.ReplicaID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.groups[g]; ok {
		return fmt.Errorf("replicationtest: group %d already bootstrapped", g)
	}
	ids := make([]uint64, len(voters))
	for i, v := range voters {
		ids[i] = uint64(v)
	}
	cs := &raftpb.ConfState{Voters: ids}
	ms := raft.NewMemoryStorage()
	var zero Digest
	if err := ms.ApplySnapshot(&raftpb.Snapshot{Data: zero[:], Metadata: &raftpb.SnapshotMetadata{
		ConfState: cs,
		Index:     new(uint64(BootstrapIndex)),
		Term:      new(uint64(1)),
	}}); err != nil {
		return err
	}
	if err := ms.SetHardState(&raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(0)), Commit: new(uint64(BootstrapIndex))}); err != nil {
		return err
	}
	d.groups[g] = &diskGroup{storage: ms, applied: BootstrapIndex, conf: cs}
	return nil
}

// CreateEmpty creates replica r of group g on this disk, new and empty: no
// log, an empty ConfState. It can only learn the group by a snapshot.
func (d *MemDisk) CreateEmpty(g replication.GroupID, r replication.ReplicaID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if dg, ok := d.groups[g]; ok && !dg.removed {
		return fmt.Errorf("replicationtest: group %d already on this disk", g)
	}
	d.groups[g] = &diskGroup{storage: raft.NewMemoryStorage(), conf: &raftpb.ConfState{}, replica: r}
	return nil
}

// Remove deletes group g's replica data (it was removed from the group).
func (d *MemDisk) Remove(g replication.GroupID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if dg := d.groups[g]; dg != nil {
		dg.removed = true
	}
}

// State returns group g's state machine: applied index, digest, config, and
// how many snapshots it installed.
func (d *MemDisk) State(g replication.GroupID) (applied uint64, digest Digest, conf *raftpb.ConfState, installs int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dg := d.groups[g]
	if dg == nil {
		return 0, Digest{}, nil, 0
	}
	return dg.applied, dg.digest, dg.conf, dg.installs
}

// FirstIndex returns the first index of group g's log (above its snapshot).
func (d *MemDisk) FirstIndex(g replication.GroupID) uint64 {
	dg := d.group(g)
	if dg == nil {
		return 0
	}
	i, _ := dg.storage.FirstIndex()
	return i
}

// diskStorage is the raft.Storage a replica opens: the log, with the
// ConfState at the applied index (the state machine's; a MemoryStorage only
// knows its snapshot's).
type diskStorage struct {
	*raft.MemoryStorage
	d  *MemDisk
	dg *diskGroup
}

// Snapshot is the state machine as it is now (design section 6: index =
// the applied index, its term, its config; the data, the digest, travel
// inline here): a fresh snapshot, never older than the last config change
// applied, so a learner added after the last compaction finds itself in it.
func (s diskStorage) Snapshot() (*raftpb.Snapshot, error) {
	s.d.mu.Lock()
	applied, d, cs := s.dg.applied, s.dg.digest, s.dg.conf
	s.d.mu.Unlock()
	term, err := s.MemoryStorage.Term(applied)
	if err != nil {
		return s.MemoryStorage.Snapshot() // compacted past it meanwhile: the log's own
	}
	return &raftpb.Snapshot{Data: d[:], Metadata: &raftpb.SnapshotMetadata{
		Index: new(applied), Term: new(term), ConfState: cs,
	}}, nil
}

func (s diskStorage) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	hs, _, err := s.MemoryStorage.InitialState()
	s.d.mu.Lock()
	cs := s.dg.conf
	s.d.mu.Unlock()
	return hs, cs, err
}

// stale reports whether job j belongs to another replica than dg's data, or
// to a removed one: the pipeline drops it.
func (d *MemDisk) stale(dg *diskGroup, j replication.Job) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return dg.removed || (dg.replica != 0 && replication.ReplicaID(j.Msg.GetFrom()) != dg.replica)
}

func (d *MemDisk) group(g replication.GroupID) *diskGroup {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.groups[g]
}

// Open returns group g's storage and applied index for a (re)starting
// engine, after checking them as a recovery would: the applied index must be
// within the durable log. A HardState commit below the applied index is raised
// to it: a commit-only HardState change needs no sync (raft's MustSync), so a
// crash can lose it while the entries it committed were already applied.
func (d *MemDisk) Open(g replication.GroupID) (raft.Storage, uint64, error) {
	dg := d.group(g)
	if dg == nil {
		return nil, 0, fmt.Errorf("replicationtest: group %d not bootstrapped", g)
	}
	d.mu.Lock()
	removed, applied := dg.removed, dg.applied
	d.mu.Unlock()
	if removed {
		return nil, 0, fmt.Errorf("group %d: %w", g, ErrRemoved)
	}
	if dg.durable != nil {
		ms, err := cloneStorage(dg.durable)
		if err != nil {
			return nil, 0, err
		}
		dg.storage = ms
	}
	last, _ := dg.storage.LastIndex()
	if applied > last {
		return nil, 0, fmt.Errorf("replicationtest: group %d: applied index %d above the durable log (last index %d): entries raft counted as durable were lost", g, applied, last)
	}
	hs, _, _ := dg.storage.InitialState()
	if hs.GetCommit() > last {
		return nil, 0, fmt.Errorf("replicationtest: group %d: durable commit %d above the durable log (last index %d)", g, hs.GetCommit(), last)
	}
	if hs.GetCommit() < applied {
		_ = dg.storage.SetHardState(&raftpb.HardState{Term: new(hs.GetTerm()), Vote: new(hs.GetVote()), Commit: new(applied)})
	}
	return diskStorage{MemoryStorage: dg.storage, d: d, dg: dg}, applied, nil
}

// Applied returns group g's durable applied index.
func (d *MemDisk) Applied(g replication.GroupID) uint64 {
	dg := d.group(g)
	if dg == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return dg.applied
}

// cloneStorage copies a MemoryStorage (snapshot, entries, HardState).
func cloneStorage(src *raft.MemoryStorage) (*raft.MemoryStorage, error) {
	ms := raft.NewMemoryStorage()
	snap, err := src.Snapshot()
	if err != nil {
		return nil, err
	}
	if err := ms.ApplySnapshot(snap); err != nil {
		return nil, err
	}
	first, _ := src.FirstIndex()
	last, _ := src.LastIndex()
	if last >= first {
		ents, err := src.Entries(first, last+1, ^uint64(0))
		if err != nil {
			return nil, err
		}
		if err := ms.Append(ents); err != nil {
			return nil, err
		}
	}
	hs, _, _ := src.InitialState()
	if hs != nil {
		if err := ms.SetHardState(hs); err != nil {
			return nil, err
		}
	}
	return ms, nil
}
