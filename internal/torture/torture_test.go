package torture

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func build(t *testing.T, tags string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "holdfast")
	args := []string{"build", "-o", bin}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command("go", append(args, "github.com/holdfast/holdfast/cmd/holdfast")...).CombinedOutput()
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// A short torture run passes on the real server, and fails on one built with a
// planted bug (replies leave before their writes are durable).
func TestTorture_PassesAndCatchesAPlantedBug(t *testing.T) {
	if testing.Short() {
		t.Skip("two torture runs of 10 s each")
	}
	for _, c := range []struct {
		tags   string
		wantOK bool
	}{{"", true}, {"plantedbug", false}} {
		bin := build(t, c.tags)
		if c.tags == "plantedbug" {
			// Outside the torture, such a binary refuses to serve.
			out, err := exec.Command(bin, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0").CombinedOutput()
			if err == nil || !strings.Contains(string(out), "plantedbug tag") {
				t.Fatalf("a plantedbug binary served without HOLDFAST_ALLOW_PLANTED_BUG: %v\n%s", err, out)
			}
		}
		var progress strings.Builder
		v, err := Run(context.Background(), Config{Binary: bin, Dir: t.TempDir(), Duration: 10 * time.Second,
			Objects: 4, KillMin: 500 * time.Millisecond, KillMax: 2 * time.Second, Seed: 1, Progress: &progress})
		if err != nil {
			t.Fatal(err)
		}
		if v.Kills < 4 {
			t.Fatalf("tags %q: only %d kills", c.tags, v.Kills)
		}
		if v.OK != c.wantOK {
			t.Fatalf("tags %q: verdict OK=%v, want %v\n%s", c.tags, v.OK, c.wantOK, progress.String())
		}
		if !c.wantOK && (len(v.Failures) == 0 || !strings.Contains(v.String(), "smallest failing history")) {
			t.Fatalf("a failed verdict with no failure or no failing history:\n%s", v)
		}
	}
}

// A short torture run against a cluster of 3 nodes, with kills and graceful
// leaves of one node at a time, passes.
func TestTorture_ClusterPasses(t *testing.T) {
	if testing.Short() {
		t.Skip("a torture run of a 3-node cluster, about 30 s")
	}
	var progress strings.Builder
	v, err := Run(context.Background(), Config{Binary: build(t, ""), Dir: t.TempDir(), Duration: 15 * time.Second, Cluster: 3,
		Objects: 4, KillMin: 500 * time.Millisecond, KillMax: 2 * time.Second, Seed: 1, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if v.Kills < 2 || v.Leaves < 1 {
		t.Fatalf("only %d kills (the last one of every node included) and %d leaves\n%s", v.Kills, v.Leaves, progress.String())
	}
	if !v.OK {
		t.Fatalf("the cluster failed the check:\n%s", progress.String())
	}
	t.Logf("\n%s", progress.String())
}

// A short torture run against a replicated cluster of 3 nodes (every
// partition a raft group of 3), with a raft link cut, a disk wipe, kills and
// graceful leaves of one node at a time, passes the linearizability check.
func TestTorture_ReplicatedClusterPasses(t *testing.T) {
	if testing.Short() {
		t.Skip("a torture run of a replicated 3-node cluster, about a minute")
	}
	var progress strings.Builder
	v, err := Run(context.Background(), Config{Binary: build(t, ""), Dir: t.TempDir(), Duration: 15 * time.Second, Cluster: 3, ReplicationFactor: 3,
		Objects: 4, KillMin: 500 * time.Millisecond, KillMax: 2 * time.Second, Seed: 1, Progress: &progress,
		order: []string{cutAll, FaultWipe, FaultKill, cutLink}})
	if err != nil {
		t.Fatal(err)
	}
	if v.Kills < 3 || v.Wipes < 1 || v.Cuts < 1 {
		t.Fatalf("only %d kills (the last one of every node included), %d wipes, %d cuts\n%s", v.Kills, v.Wipes, v.Cuts, progress.String())
	}
	if !v.OK {
		t.Fatalf("the cluster failed the check:\n%s", progress.String())
	}
	t.Logf("\n%s", progress.String())
}

// A torture run with raft link cuts fails on a replicated cluster built with
// the plantedraftbug tag: a leader acknowledges a write once its own fsync is
// done, without a majority, so a leader cut off from the others acknowledges
// writes that the next leader never had.
func TestTorture_ReplicatedCatchesAPlantedRaftBug(t *testing.T) {
	if testing.Short() {
		t.Skip("a torture run of a replicated 3-node cluster, about a minute")
	}
	bin := build(t, "plantedraftbug")
	out, err := exec.Command(bin, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "plantedraftbug tag") {
		t.Fatalf("a plantedraftbug binary served without HOLDFAST_ALLOW_PLANTED_BUG: %v\n%s", err, out)
	}
	var progress strings.Builder
	v, err := Run(context.Background(), Config{Binary: bin, Dir: t.TempDir(), Duration: 15 * time.Second, Cluster: 3, ReplicationFactor: 3,
		Objects: 4, KillMin: 500 * time.Millisecond, KillMax: time.Second, Seed: 1, Progress: &progress,
		Faults: []string{FaultCut}, order: []string{cutAll, cutAll, cutAll, cutAll}})
	if err != nil {
		t.Fatal(err)
	}
	if v.Cuts < 2 {
		t.Fatalf("only %d cuts\n%s", v.Cuts, progress.String())
	}
	if v.OK {
		t.Fatalf("the torture passed a binary whose leaders acknowledge writes without a majority:\n%s", progress.String())
	}
	t.Logf("\n%s", progress.String())
}
