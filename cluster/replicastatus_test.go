package cluster

import "testing"

// TestReplicatedStatus_AReplicaBeingAddedDoesNotCountYet: a group of two
// voters and a third replica a move is still adding is under-replicated,
// even with all three live: the third is a learner until the move promotes
// it, and losing a voter then loses the majority. Status said otherwise, and
// a test that crashed a voter once status said settled left the partition
// unavailable (TestReplicated_AClusterSmallerThanItsFactorGrowsIntoIt).
func TestReplicatedStatus_AReplicaBeingAddedDoesNotCountYet(t *testing.T) {
	nodes := map[string]NodeInfo{"a": {ID: "a", Storage: "sa"}, "b": {ID: "b", Storage: "sb"}, "c": {ID: "c", Storage: "sc"}}
	reports := map[string]replicaReport{}
	for i, n := range []string{"a", "b", "c"} {
		reports[n] = replicaReport{Parts: map[string]replicaState{"0": {Replica: uint64(i + 1), Term: 2, Applied: 10, Serving: n == "a"}}}
	}
	group := func(third ReplicaEntry) []GroupEntry {
		return []GroupEntry{{Replicas: []ReplicaEntry{{ID: 1, Node: "a", Storage: "sa"}, {ID: 2, Node: "b", Storage: "sb"}, third}}}
	}
	for _, c := range []struct {
		name   string
		third  ReplicaEntry
		under  bool
		moving bool
	}{
		{"a voter", ReplicaEntry{ID: 3, Node: "c", Storage: "sc"}, false, false},
		{"being added", ReplicaEntry{ID: 3, Node: "c", Storage: "sc", Adding: true}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := &Status{}
			rows := map[string]*NodeStatus{}
			for id, n := range nodes {
				rows[id] = &NodeStatus{NodeInfo: n}
			}
			replicatedStatus(st, 3, nodes, group(c.third), reports, rows)
			p := st.Parts[0]
			if p.UnderReplicated != c.under || (st.UnderReplicated == 1) != c.under || p.Replicas[2].Moving != c.moving {
				t.Fatalf("under-replicated %v (%d), third replica %+v; want %v, moving %v", p.UnderReplicated, st.UnderReplicated, p.Replicas[2], c.under, c.moving)
			}
			if p.Leader != "a" || p.Replicas[2].State != "live" {
				t.Fatalf("leader %q, third %+v", p.Leader, p.Replicas[2])
			}
		})
	}
}
