package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// statusJSON runs `holdfast cluster status --json` (with more args) and
// decodes it.
func (pc *procCluster) statusJSON(args ...string) (map[string]any, string) {
	pc.t.Helper()
	out, err := pc.holdfast(append([]string{"cluster", "status", "--json"}, args...)...)
	if err != nil {
		pc.t.Fatalf("cluster status --json: %v\n%s", err, out)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		pc.t.Fatalf("cluster status --json: %v\n%s", err, out)
	}
	return st, out
}

// nodeRow returns node id's row of a decoded status.
func nodeRow(st map[string]any, id string) map[string]any {
	nodes, _ := st["nodes"].([]any)
	for _, n := range nodes {
		if row, ok := n.(map[string]any); ok && row["id"] == id {
			return row
		}
	}
	return nil
}

var camelKey = regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)

// checkCamel fails the test for any key of v, at any depth, not in camelCase.
func checkCamel(t *testing.T, v any, at string) {
	t.Helper()
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if !camelKey.MatchString(k) {
				t.Errorf("status JSON key %q at %s is not camelCase", k, at)
			}
			checkCamel(t, e, at+"."+k)
		}
	case []any:
		for _, e := range x {
			checkCamel(t, e, at+"[]")
		}
	}
}

// TestCluster_ProcessesStatusShowsWhatRoutingSees: with a lease long enough
// that etcd still lists a SIGKILLed node, cluster status shows it unreachable
// and its partitions unavailable as soon as the other nodes' routers answer
// 503 for them, well before its registration expires; once it is back, it is
// live again. Also the shapes: a summary by default, every partition with
// --partitions, camelCase JSON.
func TestCluster_ProcessesStatusShowsWhatRoutingSees(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd process and several server processes")
	}
	pc := newProcCluster(t, "")
	pc.leaseTTL = "20s" // etcd lists a killed node for 20s: status must not wait for that
	pc.startThree()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	// The shapes, on a healthy cluster.
	out, err := pc.holdfast("cluster", "status")
	if err != nil || !strings.Contains(out, "cluster mp: 32 partitions: 32 served, 0 unavailable, 0 refused") ||
		strings.Contains(out, "MOVING TO") || !regexp.MustCompile(`(?m)^b\s+live\s+1[01]\s`).MatchString(out) {
		t.Fatalf("cluster status:\n%s", out)
	}
	out, err = pc.holdfast("cluster", "status", "--partitions")
	if rows := regexp.MustCompile(`(?m)^\d+\s+[abc]\s+\d+\s+-\s+served\s`).FindAllString(out, -1); err != nil || len(rows) != 32 {
		t.Fatalf("cluster status --partitions: %d partition rows\n%s", len(rows), out)
	}
	st, _ := pc.statusJSON("--partitions")
	checkCamel(t, st, "status")
	if parts, _ := st["partitions"].([]any); len(parts) != 32 || st["partitionCount"] != 32.0 || st["served"] != 32.0 {
		t.Fatalf("status JSON: %v", st)
	}
	if st, _ := pc.statusJSON(); st["partitions"] != nil || nodeRow(st, "a")["state"] != "live" {
		t.Fatalf("status JSON without --partitions: %v", st)
	}

	// Connections to b exist (a and c forwarded to it), then b is killed.
	objs := pc.objectsOf(ctx, pc.servers["a"].url, "b", 2)
	_ = pc.objectsOf(ctx, pc.servers["c"].url, "b", 2)
	owned := nodeRow(st, "b")["owned"].(float64)
	pc.kill("b")
	c := &http.Client{Timeout: 10 * time.Second}
	var last string
	for deadline := time.Now().Add(15 * time.Second); ; {
		// Routing is asked, as a client would.
		code, reply, err := call(ctx, c, "GET", fmt.Sprintf("%s/api/v1/objects/app_crash/crash/%s", pc.servers["a"].url, objs[0]), nil)
		if err != nil || code != http.StatusServiceUnavailable {
			t.Fatalf("read of b's object with b killed: %d %v %v", code, reply, err)
		}
		st, out := pc.statusJSON()
		last = out
		row := nodeRow(st, "b")
		if row["state"] == "down" {
			t.Fatalf("status showed b only once etcd dropped it; before, it said:\n%s", last)
		}
		if row["state"] == "unreachable" && row["unavailable"] == owned && row["served"] == 0.0 && st["unavailable"] == owned {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status does not show b unreachable 15s after its kill (its lease is 20s):\n%s", last)
		}
	}
	out, _ = pc.holdfast("cluster", "status")
	if !regexp.MustCompile(`(?m)^b\s+unreachable\s`).MatchString(out) || !strings.Contains(out, "node b is unreachable: does not answer") {
		t.Fatalf("cluster status with b killed:\n%s", out)
	}
	pc.start("b") // waits out the killed run's registration
	pc.waitStable(60 * time.Second)
	if st, out := pc.statusJSON(); nodeRow(st, "b")["state"] != "live" || st["served"] != 32.0 {
		t.Fatalf("status after b returned:\n%s", out)
	}
}

// TestCluster_ProcessesLeaveWaits: `holdfast cluster leave` reports progress
// and returns once the node handed its partitions off and its process
// exited; with --no-wait it returns at once.
func TestCluster_ProcessesLeaveWaits(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd process and several server processes")
	}
	pc := newProcCluster(t, "")
	pc.startThree()
	pc.mu.Lock()
	b, c := pc.servers["b"], pc.servers["c"]
	delete(pc.servers, "b")
	pc.mu.Unlock()
	out, err := pc.holdfast("cluster", "leave", "b", "--timeout", "50s")
	if err != nil || !strings.Contains(out, "node b: handing partitions off,") ||
		!strings.Contains(out, "waiting for its process to exit") || !strings.Contains(out, "node b left cluster mp") {
		t.Fatalf("cluster leave: %v\n%s", err, out)
	}
	select { // it exited: at most the last instants of its shutdown remain
	case err := <-b.exited:
		if err != nil {
			t.Fatalf("b after cluster leave: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cluster leave returned, b still runs 10s later")
	}
	st := pc.waitStable(30 * time.Second)
	if row, ok := st.Node("b"); ok {
		t.Fatalf("b after it left: %+v", row)
	}
	pc.mu.Lock()
	delete(pc.servers, "c")
	pc.mu.Unlock()
	start := time.Now()
	out, err = pc.holdfast("cluster", "leave", "c", "--no-wait")
	if err != nil || !strings.Contains(out, "asked node c to leave") || strings.Contains(out, "handing") {
		t.Fatalf("cluster leave --no-wait: %v\n%s", err, out)
	}
	select {
	case <-c.exited:
		t.Logf("c exited before leave --no-wait returned (%v)", time.Since(start))
	default:
	}
	select {
	case err := <-c.exited:
		if err != nil {
			t.Fatalf("c after cluster leave --no-wait: %v", err)
		}
	case <-time.After(50 * time.Second):
		t.Fatal("c did not leave")
	}
	pc.waitStable(30 * time.Second)
	if out, err := pc.holdfast("cluster", "leave", "c"); err == nil || !strings.Contains(out, "not live") {
		t.Fatalf("leave of a node that is gone: %v\n%s", err, out)
	}
}
