package main

import (
	"strings"
	"testing"

	"github.com/holdfast/holdfast/cluster"
)

// TestPrintStatus_Replicated: a replicated cluster's status names replicas,
// leaders and lag, not owners; a single-copy cluster's keeps its columns.
func TestPrintStatus_Replicated(t *testing.T) {
	st := &cluster.Status{Name: "prod", Partitions: 2, ReplicationFactor: 3, Served: 1, Unavailable: 1, UnderReplicated: 2, Controller: "a",
		Nodes: []cluster.NodeStatus{
			{NodeInfo: cluster.NodeInfo{ID: "a", Addr: "h:1", Raft: "h:2", HTTP: "h:3"}, State: cluster.NodeLive, Owned: 2, Served: 1},
			{NodeInfo: cluster.NodeInfo{ID: "b"}, State: cluster.NodeDown, Owned: 2, Reason: "not registered"},
		},
		Parts: []cluster.PartStatus{
			{Partition: 0, Leader: "a", Term: 7, Available: true, State: cluster.PartServed, UnderReplicated: true,
				Replicas: []cluster.ReplicaStatus{{Node: "a", State: "live"}, {Node: "b", State: "down"}, {Node: "c", State: "live", Lag: 12}}},
			{Partition: 1, State: cluster.PartUnavailable, UnderReplicated: true, Reason: "only 1 of its 3 replicas are live: a majority is needed",
				Replicas: []cluster.ReplicaStatus{{Node: "a", State: "live"}, {Node: "b", State: "down"}, {Node: "d", State: "down"}}},
		},
	}
	var b strings.Builder
	printStatus(&b, st)
	out := b.String()
	for _, want := range []string{
		"cluster prod: 2 partitions of 3 replicas: 1 served, 1 unavailable, 2 under-replicated; controller a",
		"REPLICAS", "LEADS", "h:2",
		"node b is down: not registered",
		"a:live:0 b:down:0 c:live:12", "served,under-replicated",
		"only 1 of its 3 replicas are live",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	st.ReplicationFactor, st.Parts = 1, nil
	b.Reset()
	printStatus(&b, st)
	if !strings.Contains(b.String(), "REFUSED") || strings.Contains(b.String(), "LEADS") {
		t.Errorf("a single-copy cluster's status:\n%s", b.String())
	}
}
