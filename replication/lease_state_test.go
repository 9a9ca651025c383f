package replication

import (
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// leaseEngine returns an engine with one group (replica 1) whose lease is in
// term 3, with voters, on a clock the test moves.
func leaseEngine(t *testing.T, voters ...[]ReplicaID) (*Engine, *group, *time.Time) {
	t.Helper()
	base := time.Now()
	now := base
	e := &Engine{
		cfg:    Config{ElectionTick: 10, TickInterval: 100 * time.Millisecond},
		clock:  func() time.Time { return now },
		epoch:  base,
		groups: make(map[GroupID]*group),
	}
	g := &group{id: 1, replica: 1}
	g.lease.self, g.lease.expiry, g.lease.acks = 1, never, make(map[ReplicaID]int64)
	g.lease.term, g.lease.appliedTerm, g.lease.voters = 3, true, voters
	e.groups[1] = g
	return e, g, &now
}

// TestLease_Length: (ElectionTick-1) ticks minus one tick minus 10%.
func TestLease_Length(t *testing.T) {
	e, _, _ := leaseEngine(t)
	if got, want := time.Duration(e.leaseLength()), 710*time.Millisecond; got != want {
		t.Fatalf("lease length %v, want %v (900 ms - 100 ms - 90 ms)", got, want)
	}
	e.cfg.ElectionTick = 2
	if e.leaseLength() > 0 {
		t.Fatalf("ElectionTick 2: lease length %v, want none", time.Duration(e.leaseLength()))
	}
}

// TestLease_QuorumOfSendTimes: the lease runs from the quorum-th newest
// acknowledged send time (this replica counting as now), the earlier of a
// joint configuration's two majorities; an older ack never replaces a newer.
func TestLease_QuorumOfSendTimes(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name   string
		voters [][]ReplicaID
		acks   map[ReplicaID]time.Duration // send time after the epoch
		want   time.Duration               // expiry after the epoch; 0: none
	}{
		{"3 voters", [][]ReplicaID{{1, 2, 3}}, map[ReplicaID]time.Duration{2: ms(100), 3: ms(50)}, ms(100 + 710)},
		{"3 voters, one ack", [][]ReplicaID{{1, 2, 3}}, map[ReplicaID]time.Duration{3: ms(50)}, ms(50 + 710)},
		{"3 voters, no ack", [][]ReplicaID{{1, 2, 3}}, nil, 0},
		{"5 voters", [][]ReplicaID{{1, 2, 3, 4, 5}}, map[ReplicaID]time.Duration{2: ms(100), 3: ms(90), 4: ms(80), 5: ms(70)}, ms(90 + 710)},
		{"5 voters, one ack", [][]ReplicaID{{1, 2, 3, 4, 5}}, map[ReplicaID]time.Duration{2: ms(100)}, 0},
		{"joint", [][]ReplicaID{{1, 2, 3}, {3, 4, 5}}, map[ReplicaID]time.Duration{2: ms(100), 3: ms(90), 4: ms(80), 5: ms(70)}, ms(80 + 710)},
		{"not a voter", [][]ReplicaID{{2, 3, 4}}, map[ReplicaID]time.Duration{2: ms(100), 3: ms(90), 4: ms(80)}, ms(90 + 710)},
		{"learner acks ignored", [][]ReplicaID{{1, 2, 3}}, map[ReplicaID]time.Duration{9: ms(100)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, g, now := leaseEngine(t, tc.voters...)
			for r, d := range tc.acks {
				e.OnBeatAck(1, r, e.epoch.Add(d))
				e.OnBeatAck(1, r, e.epoch.Add(d-ms(40))) // older: ignored
			}
			g.lease.mu.Lock()
			g.lease.recomputeLocked(e.leaseLength())
			got := g.lease.expiry
			g.lease.mu.Unlock()
			if tc.want == 0 {
				if got != never {
					t.Fatalf("expiry %v, want no lease", time.Duration(got))
				}
				return
			}
			if time.Duration(got) != tc.want {
				t.Fatalf("expiry %v, want %v", time.Duration(got), tc.want)
			}
			*now = e.epoch.Add(tc.want - 1)
			if term, ok := e.LeaseValid(1); !ok || term != 3 {
				t.Fatalf("just before expiry: LeaseValid = %d, %v", term, ok)
			}
			*now = e.epoch.Add(tc.want)
			if _, ok := e.LeaseValid(1); ok {
				t.Fatal("valid at expiry")
			}
		})
	}
}

// TestLease_Blocked: no lease before an entry of the term is applied, during
// a transfer, while a fenced transferee has not acked, or for acks sent
// before since.
func TestLease_Blocked(t *testing.T) {
	e, g, _ := leaseEngine(t, []ReplicaID{1, 2, 3})
	valid := func() bool {
		g.lease.mu.Lock()
		g.lease.recomputeLocked(e.leaseLength())
		g.lease.mu.Unlock()
		_, ok := e.LeaseValid(1)
		return ok
	}
	g.lease.appliedTerm = false
	e.OnBeatAck(1, 2, e.epoch)
	if valid() {
		t.Fatal("lease before an entry of the term was applied")
	}
	g.lease.appliedTerm = true
	if !valid() {
		t.Fatal("no lease with a quorum of acks")
	}
	g.lease.transferring = true
	if valid() {
		t.Fatal("lease during a transfer")
	}
	g.lease.transferring = false
	g.lease.fence = []ReplicaID{3}
	if valid() {
		t.Fatal("lease before the fenced transferee acked")
	}
	e.OnBeatAck(1, 3, e.epoch)
	if !valid() {
		t.Fatal("no lease once the fenced transferee acked")
	}
	g.lease.fence = nil
	clear(g.lease.acks)
	g.lease.since = int64(time.Millisecond)
	e.OnBeatAck(1, 2, e.epoch) // sent before since
	if valid() {
		t.Fatal("lease from an ack sent before since")
	}
}

// TestLease_VotersAfterConfChange: applying a conf change entry makes the
// lease take the voters again (a fourth voter raises the quorum to three).
func TestLease_VotersAfterConfChange(t *testing.T) {
	cfg, err := Config{Node: 1, Logger: slog.New(slog.DiscardHandler)}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{cfg: cfg, clock: time.Now, epoch: time.Now(), groups: make(map[GroupID]*group)}
	st := raft.NewMemoryStorage()
	if err := st.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		Index: new(uint64(1)), Term: new(uint64(1)), ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}},
	}}); err != nil {
		t.Fatal(err)
	}
	g, err := newGroup(GroupConfig{ID: 1, Replica: 1, Peers: map[ReplicaID]NodeID{1: 1, 2: 2, 3: 3, 4: 4}, Storage: st, Applied: 1}, e)
	if err != nil {
		t.Fatal(err)
	}
	e.groups[1] = g
	g.role, g.term, g.appliedTerm = raft.StateLeader, 3, 3
	e.leaseStep(g) // a new term: voters {1, 2, 3}
	e.OnBeatAck(1, 2, time.Now())
	if _, ok := e.LeaseValid(1); !ok {
		t.Fatal("no lease with 2 of 3 voters")
	}
	g.rn.ApplyConfChange(&raftpb.ConfChange{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: new(uint64(4))})
	g.noteConfApplied([]*raftpb.Entry{{Type: raftpb.EntryConfChange.Enum(), Index: new(uint64(2)), Term: new(uint64(3))}})
	e.leaseStep(g)
	if _, ok := e.LeaseValid(1); ok {
		t.Fatal("lease with 2 of 4 voters after the conf change")
	}
	e.OnBeatAck(1, 4, time.Now())
	if _, ok := e.LeaseValid(1); !ok {
		t.Fatal("no lease with 3 of 4 voters")
	}
}
