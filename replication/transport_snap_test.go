package replication

import (
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// snapRecorder is a fake engine that also hears snapshot reports.
type snapRecorder struct {
	*recorder
	snaps []snapReport // guarded by recorder.mu
}

func (r *snapRecorder) ReportSnapshot(g GroupID, to ReplicaID, status raft.SnapshotStatus) {
	r.mu.Lock()
	r.snaps = append(r.snaps, snapReport{to: to, status: status})
	r.mu.Unlock()
	wake(r.ch)
}

// TestNetTransport_ReportsSnapshots: the sender of a MsgSnap hears
// SnapshotFinish once its frame was sent, SnapshotFailure when the frame
// could not be sent.
func TestNetTransport_ReportsSnapshots(t *testing.T) {
	net := &memNet{nodes: map[NodeID]*NetTransport{}, block: map[NodeID]chan struct{}{}, fail: map[NodeID]bool{}}
	var trs [3]*NetTransport
	recs := [3]*snapRecorder{nil, {recorder: newRecorder()}, {recorder: newRecorder()}}
	for i := NodeID(1); i <= 2; i++ {
		tr, err := NewNetTransport(NetConfig{Node: i, Storage: string(rune('a' + i)), BeatInterval: 5 * time.Millisecond, Logger: quietLog()}, memCarrier{n: net, from: i})
		if err != nil {
			t.Fatal(err)
		}
		trs[i] = tr
		net.nodes[i] = tr
	}
	trs[1].SetPeer(2, "c")
	trs[2].SetPeer(1, "b")
	for i := 1; i <= 2; i++ {
		if err := trs[i].Start(recs[i]); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = trs[i].Close() })
	}
	snap := func() []Envelope {
		return []Envelope{{Group: 7, Msg: &raftpb.Message{Type: raftpb.MsgSnap.Enum(), From: new(uint64(1)), To: new(uint64(2)),
			Snapshot: &raftpb.Snapshot{Data: []byte("state"), Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(9)), Term: new(uint64(2))}}}}}
	}
	r := recs[1]
	trs[1].Send(2, snap())
	r.waitFor(t, "a snapshot report", func() bool { return len(r.snaps) >= 1 })
	net.mu.Lock()
	net.fail[2] = true
	net.mu.Unlock()
	trs[1].Send(2, snap())
	r.waitFor(t, "a second snapshot report", func() bool { return len(r.snaps) >= 2 })
	r.mu.Lock()
	defer r.mu.Unlock()
	want := []snapReport{{to: 2, status: raft.SnapshotFinish}, {to: 2, status: raft.SnapshotFailure}}
	if len(r.snaps) != 2 || r.snaps[0] != want[0] || r.snaps[1] != want[1] {
		t.Fatalf("reports %+v, want %+v", r.snaps, want)
	}
}
