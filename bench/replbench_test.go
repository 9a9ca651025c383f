package main

import (
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cluster"
)

// TestReplicatedTiny runs the -replicated mode's two phases on a tiny
// profile (8 partitions, one kill, 2 MiB) so that the mode keeps working: it
// builds the holdfast binary and starts three serve processes and etcd.
func TestReplicatedTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("builds holdfast and starts three server processes")
	}
	dir := t.TempDir()
	cfg := replConfig{kills: 1, mib: 2, partitions: 8, valueKiB: 64, settleTimeout: 2 * time.Minute,
		progress: testWriter{t}, noRebalance: true}
	r, err := replicated(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Failover.Kills) != 1 {
		t.Fatalf("kills: %+v", r.Failover.Kills)
	}
	k := r.Failover.Kills[0]
	// The victim leads the most partitions of 8 over 3 nodes: 3 at least.
	if len(k.Seconds) < 3 || k.NotWritten != 0 {
		t.Errorf("kill of %s: %d objects written again (%v), %d not", k.Victim, len(k.Seconds), k.Seconds, k.NotWritten)
	}
	for _, s := range k.Seconds {
		if s <= 0 {
			t.Errorf("kill of %s: an object written again %vs after the kill", k.Victim, s)
		}
	}
	if r.Failover.Writes == 0 {
		t.Error("no write acknowledged in the failover phase")
	}
	cu := r.Catchup
	if cu.PayloadBytes != 2<<20 || cu.ReplicatedSeconds <= 0 || cu.DiskAfterBytes <= 0 {
		t.Errorf("catch-up: %+v", cu)
	}
	// Every partition of the wiped node was filled again by a snapshot.
	if cu.SnapshotsReceived < float64(cfg.partitions) {
		t.Errorf("the rebuilt node received %v snapshots, want %d at least", cu.SnapshotsReceived, cfg.partitions)
	}
	var b strings.Builder
	writeReplReport(&b, cfg, r)
	if !strings.Contains(b.String(), "seconds per GiB of payload") {
		t.Errorf("report:\n%s", b.String())
	}
	t.Logf("report:\n%s", b.String())
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// status is a replicated cluster's status of nodes a, b, c (all live) whose
// partition p has replicas reps[p] and is led by leaders[p].
func replStatus(reps [][]string, leaders []string) *cluster.Status {
	st := &cluster.Status{Partitions: len(reps), ReplicationFactor: 3}
	for _, id := range []string{"a", "b", "c"} {
		st.Nodes = append(st.Nodes, cluster.NodeStatus{NodeInfo: cluster.NodeInfo{ID: id}, State: cluster.NodeLive})
	}
	for p, rs := range reps {
		ps := cluster.PartStatus{Partition: uint32(p), Leader: leaders[p], Available: leaders[p] != ""}
		if ps.Available {
			st.Served++
		}
		for _, n := range rs {
			ps.Replicas = append(ps.Replicas, cluster.ReplicaStatus{Node: n, State: "live"})
		}
		st.Parts = append(st.Parts, ps)
	}
	return st
}

func TestReplShort(t *testing.T) {
	abc, bca, cab := []string{"a", "b", "c"}, []string{"b", "c", "a"}, []string{"c", "a", "b"}
	for _, c := range []struct {
		name             string
		st               *cluster.Status
		replicated, full bool // replShort finds nothing, not settled / settled
	}{
		{"balanced, each led by its first replica", replStatus([][]string{abc, bca, cab}, []string{"a", "b", "c"}), true, true},
		{"led by another replica", replStatus([][]string{abc, bca, cab}, []string{"a", "a", "c"}), true, false},
		{"first replicas not balanced", replStatus([][]string{abc, abc, abc}, []string{"a", "a", "a"}), true, false},
		{"a partition not served", replStatus([][]string{abc, bca, cab}, []string{"a", "", "c"}), false, false},
		{"a replica too many (a move)", replStatus([][]string{abc, {"b", "c", "a", "a"}, cab}, []string{"a", "b", "c"}), false, false},
		{"a replica short", replStatus([][]string{abc, {"b", "c"}, cab}, []string{"a", "b", "c"}), false, false},
		{"a replica refused", func() *cluster.Status {
			st := replStatus([][]string{abc, bca, cab}, []string{"a", "b", "c"})
			st.Parts[2].Replicas[1].State = "refused"
			return st
		}(), false, false},
		{"a node down", func() *cluster.Status {
			st := replStatus([][]string{abc, bca, cab}, []string{"a", "b", "c"})
			st.Nodes[1].State = cluster.NodeDown
			return st
		}(), false, false},
		{"under-replicated by the count", func() *cluster.Status {
			st := replStatus([][]string{abc, bca, cab}, []string{"a", "b", "c"})
			st.UnderReplicated = 1
			return st
		}(), false, false},
	} {
		if why := replShort(c.st, false); (why == "") != c.replicated {
			t.Errorf("%s: replShort(not settled) = %q, want fully replicated: %v", c.name, why, c.replicated)
		}
		if why := replShort(c.st, true); (why == "") != c.full {
			t.Errorf("%s: replShort(settled) = %q, want settled: %v", c.name, why, c.full)
		}
	}
}

func TestParseServedBy(t *testing.T) {
	if n, p, ok := parseServedBy("b/17/42"); !ok || n != "b" || p != 17 {
		t.Errorf("b/17/42: %q %d %v", n, p, ok)
	}
	for _, h := range []string{"", "b/17", "/1/2", "b/x/2"} {
		if _, _, ok := parseServedBy(h); ok {
			t.Errorf("%q parsed", h)
		}
	}
}
