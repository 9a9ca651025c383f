package replication

import (
	"fmt"
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestRedundantAppends: a commit-only append (MsgApp, no entries) is
// redundant exactly when a later MsgApp of the same Ready goes to the same
// replica; nothing else is ever skipped.
func TestRedundantAppends(t *testing.T) {
	app := func(to uint64, entries int) *raftpb.Message {
		m := &raftpb.Message{Type: raftpb.MsgApp.Enum(), To: new(to)}
		for range entries {
			m.Entries = append(m.Entries, &raftpb.Entry{})
		}
		return m
	}
	other := func(typ raftpb.MessageType, to uint64) *raftpb.Message {
		return &raftpb.Message{Type: typ.Enum(), To: new(to)}
	}
	for i, tc := range []struct {
		msgs []*raftpb.Message
		skip []int // indices skipped
	}{
		{nil, nil},
		{[]*raftpb.Message{app(2, 0), app(3, 0)}, nil},                               // commit only, nothing after
		{[]*raftpb.Message{app(2, 1), app(2, 0)}, nil},                               // entries, then a newer commit: both needed
		{[]*raftpb.Message{app(2, 0), app(3, 0), app(2, 4), app(3, 4)}, []int{0, 1}}, // commit, then proposals
		{[]*raftpb.Message{app(2, 0), app(2, 0)}, []int{0}},                          // two commits: the later
		{[]*raftpb.Message{app(2, 0), app(3, 2)}, nil},                               // another replica's
		{[]*raftpb.Message{app(2, 0), other(raftpb.MsgHeartbeat, 2), other(raftpb.MsgSnap, 2)}, nil},
		{[]*raftpb.Message{app(2, 0), other(raftpb.MsgHeartbeat, 2), app(2, 1), app(2, 0), app(2, 3)}, []int{0, 3}},
		{[]*raftpb.Message{other(raftpb.MsgAppResp, 2), other(raftpb.MsgAppResp, 2)}, nil},
		{[]*raftpb.Message{app(1, 0), app(2, 0), app(3, 0), app(4, 0), app(5, 0), app(6, 0), app(7, 0), app(8, 0), app(9, 0), app(10, 0),
			app(10, 1), app(1, 1)}, []int{0, 9}}, // more replicas than the scratch arrays hold
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			skip := redundantAppends(tc.msgs, make([]bool, 1))
			var got []int
			for j, s := range skip {
				if s {
					got = append(got, j)
				}
			}
			if !slices.Equal(got, tc.skip) {
				t.Fatalf("skipped %v, want %v", got, tc.skip)
			}
			if tc.skip == nil && skip != nil {
				t.Fatalf("returned %v with nothing to skip, want nil", skip)
			}
		})
	}
	// The scratch slice is reused (cleared) when it is long enough.
	scratch := []bool{true, true, true, true}
	skip := redundantAppends([]*raftpb.Message{app(2, 0), app(2, 1)}, scratch)
	if !slices.Equal(skip, []bool{true, false}) || &skip[0] != &scratch[0] {
		t.Fatalf("got %v (reused: %v), want [true false] in the scratch slice", skip, &skip[0] == &scratch[0])
	}
}
