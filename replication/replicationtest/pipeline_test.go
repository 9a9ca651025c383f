package replicationtest

import (
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/replication"
)

// TestMemPipeline_AckBeforeSyncTakesASnapshotAsAFirstAppend: with the planted
// bug ackBeforeSync, the first append of a new, empty replica (a move's: it
// learns the group from a snapshot) is written to the visible storage, then
// to the durable copy cloned from it. The clone already holds the snapshot;
// writing it again must not fail (it panicked the model test's append
// goroutine: "requested index is older than the existing snapshot").
func TestMemPipeline_AckBeforeSyncTakesASnapshotAsAFirstAppend(t *testing.T) {
	const g, r = replication.GroupID(1), replication.ReplicaID(4)
	disk := NewMemDisk()
	if err := disk.CreateEmpty(g, r); err != nil {
		t.Fatal(err)
	}
	p := NewMemPipeline(disk, nil, 0)
	p.ackBeforeSync = true
	p.Start()
	defer p.Close()

	var d Digest
	d[0] = 7
	snap := &raftpb.Snapshot{Data: d[:], Metadata: &raftpb.SnapshotMetadata{
		ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 4}},
		Index:     new(uint64(10)),
		Term:      new(uint64(2)),
	}}
	ents := []*raftpb.Entry{{Index: new(uint64(11)), Term: new(uint64(2)), Type: raftpb.EntryNormal.Enum()}}
	done := make(chan struct{})
	p.Append(replication.Job{Group: g, Msg: &raftpb.Message{
		From: new(uint64(r)), Snapshot: snap, Entries: ents,
		Term: new(uint64(2)), Vote: new(uint64(0)), Commit: new(uint64(10)),
	}, Done: func() { close(done) }})
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the append job was never done")
	}
	// Its sync is done once Syncs counts it (Done comes before it here).
	for deadline := time.Now().Add(5 * time.Second); p.Syncs() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the batch was never synced")
		}
	}
	applied, digest, conf, installs := disk.State(g)
	if applied != 10 || digest != d || len(conf.GetVoters()) != 3 || installs != 1 {
		t.Fatalf("state after the snapshot: applied %d, digest %x, conf %v, installs %d; want 10, %x, 3 voters, 1", applied, digest[:2], conf, installs, d[:2])
	}
	// A crash keeps the durable copy: the snapshot and the entry after it.
	p.Crash()
	st, _, err := disk.Open(g)
	if err != nil {
		t.Fatal(err)
	}
	if last, _ := st.LastIndex(); last != 11 {
		t.Fatalf("durable log ends at %d, want 11", last)
	}
	if s, _ := st.Snapshot(); s.GetMetadata().GetIndex() != 10 {
		t.Fatalf("durable snapshot at %d, want 10", s.GetMetadata().GetIndex())
	}
}
