package replication_test

import (
	"fmt"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/replication"
)

type discardRaftLogger struct{}

func (discardRaftLogger) Debug(...any)            {}
func (discardRaftLogger) Debugf(string, ...any)   {}
func (discardRaftLogger) Error(...any)            {}
func (discardRaftLogger) Errorf(string, ...any)   {}
func (discardRaftLogger) Info(...any)             {}
func (discardRaftLogger) Infof(string, ...any)    {}
func (discardRaftLogger) Warning(...any)          {}
func (discardRaftLogger) Warningf(string, ...any) {}
func (discardRaftLogger) Fatal(v ...any)          { panic(fmt.Sprint(v...)) }
func (discardRaftLogger) Fatalf(f string, v ...any) {
	panic(fmt.Sprintf(f, v...))
}
func (discardRaftLogger) Panic(v ...any) { panic(fmt.Sprint(v...)) }
func (discardRaftLogger) Panicf(f string, v ...any) {
	panic(fmt.Sprintf(f, v...))
}

// drawConfChange draws a random conf change entry: a V1 change, a V2 simple
// change, a V2 joint change (auto, implicit or explicit), or a V2 leave.
func drawConfChange(t *rapid.T) *raftpb.Entry {
	id := rapid.Custom(func(t *rapid.T) *uint64 { return new(rapid.Uint64Range(1, 6).Draw(t, "id")) })
	typ := rapid.Custom(func(t *rapid.T) *raftpb.ConfChangeType {
		return rapid.SampledFrom([]raftpb.ConfChangeType{
			raftpb.ConfChangeAddNode, raftpb.ConfChangeRemoveNode, raftpb.ConfChangeAddLearnerNode,
		}).Draw(t, "type").Enum()
	})
	switch rapid.IntRange(0, 3).Draw(t, "kind") {
	case 0:
		cc := &raftpb.ConfChange{Type: typ.Draw(t, "t"), NodeId: id.Draw(t, "n")}
		data, _ := proto.Marshal(cc)
		return &raftpb.Entry{Type: raftpb.EntryConfChange.Enum(), Data: data}
	case 3:
		return &raftpb.Entry{Type: raftpb.EntryConfChangeV2.Enum()} // leave joint
	default:
		cc := &raftpb.ConfChangeV2{
			Transition: rapid.SampledFrom([]raftpb.ConfChangeTransition{
				raftpb.ConfChangeTransitionAuto, raftpb.ConfChangeTransitionJointImplicit, raftpb.ConfChangeTransitionJointExplicit,
			}).Draw(t, "transition").Enum(),
		}
		for range rapid.IntRange(1, 3).Draw(t, "changes") {
			cc.Changes = append(cc.Changes, &raftpb.ConfChangeSingle{Type: typ.Draw(t, "t"), NodeId: id.Draw(t, "n")})
		}
		data, _ := proto.Marshal(cc)
		return &raftpb.Entry{Type: raftpb.EntryConfChangeV2.Enum(), Data: data}
	}
}

// TestNextConfState_MatchesRawNode: on random sequences of conf changes,
// NextConfState gives exactly the ConfState RawNode.ApplyConfChange returns,
// and fails exactly when raft refuses (panics on) the change.
func TestNextConfState_MatchesRawNode(t *testing.T) {
	var applied, joint, refused int
	rapid.Check(t, func(t *rapid.T) {
		ms := raft.NewMemoryStorage()
		start := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
		if err := ms.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{ConfState: start, Index: new(uint64(1)), Term: new(uint64(1))}}); err != nil {
			t.Fatal(err)
		}
		rn, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: ms, MaxInflightMsgs: 16, AsyncStorageWrites: true, Logger: discardRaftLogger{}})
		if err != nil {
			t.Fatal(err)
		}
		cs := start
		for i := range rapid.IntRange(1, 30).Draw(t, "steps") {
			ent := drawConfChange(t)
			ent.Index = new(uint64(i + 2))
			next, err := replication.NextConfState(cs, ent)
			var cc raftpb.ConfChangeI
			if ent.GetType() == raftpb.EntryConfChange {
				v := new(raftpb.ConfChange)
				_ = proto.Unmarshal(ent.GetData(), v)
				cc = v
			} else {
				v := new(raftpb.ConfChangeV2)
				_ = proto.Unmarshal(ent.GetData(), v)
				cc = v
			}
			var got *raftpb.ConfState
			panicked := func() (p bool) {
				defer func() {
					if recover() != nil {
						p = true
					}
				}()
				got = rn.ApplyConfChange(cc)
				return false
			}()
			if panicked != (err != nil) {
				t.Fatalf("step %d %s on %v: raft panicked %v, NextConfState error %v", i, raft.DescribeConfChange(cc), cs, panicked, err)
			}
			if panicked {
				refused++
				continue
			}
			if !proto.Equal(got, next) {
				t.Fatalf("step %d %s on %v: raft %v, NextConfState %v", i, raft.DescribeConfChange(cc), cs, got, next)
			}
			cs = next
			applied++
			if len(cs.GetVotersOutgoing()) > 0 {
				joint++
			}
		}
	})
	// The property must have compared real changes, joint ones included
	// (-short runs a fifth of the checks).
	least := 100
	if testing.Short() {
		least = 20
	}
	if applied < least || joint < least/5 || refused < least/5 {
		t.Fatalf("too few cases: %d applied (%d joint), %d refused", applied, joint, refused)
	}
	t.Logf("%d changes applied (%d into joint configs), %d refused", applied, joint, refused)
}
