package replication

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// TestAddGroup_StorageRaftRefusesIsAnError: a replica whose storage does not
// hold what its applied index says (raft panics in NewRawNode) is refused
// with ErrGroupFailed; the process goes on, and the engine has no such
// group.
func TestAddGroup_StorageRaftRefusesIsAnError(t *testing.T) {
	cfg, err := Config{Node: 1, Logger: slog.New(slog.DiscardHandler)}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{cfg: cfg, clock: time.Now, epoch: time.Now(), groups: make(map[GroupID]*group)}
	e.list.Store(new([]*group))
	st := raft.NewMemoryStorage()
	if err := st.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		Index: new(uint64(5)), Term: new(uint64(1)), ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}},
	}}); err != nil {
		t.Fatal(err)
	}
	err = e.AddGroup(GroupConfig{ID: 1, Replica: 1, Peers: map[ReplicaID]NodeID{1: 1, 2: 2, 3: 3}, Storage: st, Applied: 1})
	if !errors.Is(err, ErrGroupFailed) {
		t.Fatalf("AddGroup with applied 1 below the snapshot's 5: %v, want ErrGroupFailed", err)
	}
	if e.group(1) != nil {
		t.Fatal("the refused group is in the engine")
	}
}
