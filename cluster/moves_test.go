package cluster

import (
	"reflect"
	"testing"
)

// TestSettled: a settled move puts the new replica in the place of the one it
// replaced (so the first replica, the preferred leader, can be a node that
// joined later), clears its flags, keeps the entry's counters, and drops an
// aborted replica.
func TestSettled(t *testing.T) {
	a := ReplicaEntry{ID: 1, Node: "a"}
	b := ReplicaEntry{ID: 2, Node: "b"}
	c := ReplicaEntry{ID: 3, Node: "c"}
	d := ReplicaEntry{ID: 4, Node: "d", Replaces: 1}
	ids := func(g GroupEntry) []uint64 {
		var out []uint64
		for _, r := range g.Replicas {
			out = append(out, r.ID)
		}
		return out
	}
	g := GroupEntry{Replicas: []ReplicaEntry{a, b, c, d}, Next: 5, Losses: 2}
	for _, tc := range []struct {
		name       string
		g          GroupEntry
		gone, done uint64
		want       []uint64
	}{
		{"a replacement takes the replaced one's place", g, 1, 4, []uint64{4, 2, 3}},
		{"a replacement of a later replica", GroupEntry{Replicas: []ReplicaEntry{a, b, c, {ID: 4, Replaces: 3}}}, 3, 4, []uint64{1, 2, 4}},
		{"an added replica stays last", GroupEntry{Replicas: []ReplicaEntry{a, b, {ID: 4, Adding: true}}}, 0, 4, []uint64{1, 2, 4}},
		{"an aborted move drops the new replica", g, 4, 0, []uint64{1, 2, 3}},
		{"the replaced one already gone", GroupEntry{Replicas: []ReplicaEntry{b, c, d}}, 1, 4, []uint64{2, 3, 4}},
	} {
		ne := settled(tc.g, tc.gone, tc.done)
		if got := ids(ne); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: replicas %v, want %v", tc.name, got, tc.want)
		}
		if ne.Next != tc.g.Next || ne.Losses != tc.g.Losses {
			t.Errorf("%s: next %d losses %d, want %d %d", tc.name, ne.Next, ne.Losses, tc.g.Next, tc.g.Losses)
		}
		for _, r := range ne.Replicas {
			if r.pending() || r.Abort {
				t.Errorf("%s: replica %d still has move flags: %+v", tc.name, r.ID, r)
			}
		}
	}
}
