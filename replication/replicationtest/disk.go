package replicationtest

import (
	"fmt"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/replication"
)

// MemDisk is one node's "disk": for each group, the raft log and HardState
// the node's pipeline synced (a raft.MemoryStorage that holds nothing else)
// and the state machine's applied index. It outlives the node's engines and
// pipelines: a crash loses what the pipeline had not synced, never the disk.
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
	applied uint64 // guarded by MemDisk.mu
}

// NewMemDisk returns an empty disk.
func NewMemDisk() *MemDisk {
	return &MemDisk{groups: make(map[replication.GroupID]*diskGroup)}
}

// Bootstrap creates group g's empty log with voters as its configuration
// (raft's recommended bootstrap: a storage whose ConfState lists the voters).
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
	ms := raft.NewMemoryStorage()
	if err := ms.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		ConfState: &raftpb.ConfState{Voters: ids},
		Index:     new(uint64(0)),
		Term:      new(uint64(0)),
	}}); err != nil {
		return err
	}
	d.groups[g] = &diskGroup{storage: ms}
	return nil
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
	if dg.durable != nil {
		ms, err := cloneStorage(dg.durable)
		if err != nil {
			return nil, 0, err
		}
		dg.storage = ms
	}
	last, _ := dg.storage.LastIndex()
	if dg.applied > last {
		return nil, 0, fmt.Errorf("replicationtest: group %d: applied index %d above the durable log (last index %d): entries raft counted as durable were lost", g, dg.applied, last)
	}
	hs, _, _ := dg.storage.InitialState()
	if hs.GetCommit() > last {
		return nil, 0, fmt.Errorf("replicationtest: group %d: durable commit %d above the durable log (last index %d)", g, hs.GetCommit(), last)
	}
	if hs.GetCommit() < dg.applied {
		_ = dg.storage.SetHardState(&raftpb.HardState{Term: new(hs.GetTerm()), Vote: new(hs.GetVote()), Commit: new(dg.applied)})
	}
	return dg.storage, dg.applied, nil
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
