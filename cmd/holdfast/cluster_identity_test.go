package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startIn starts node id (its configuration as pc.start makes it) on the data
// directory dir instead of its own: a reused nodeId on another disk.
func (pc *procCluster) startIn(id, dir string) *server {
	pc.t.Helper()
	s := startServer(pc.t, dir, filepath.Join(pc.dir, id+".yaml"))
	pc.mu.Lock()
	pc.servers[id] = s
	pc.started = append(pc.started, startedNode{id + "(" + filepath.Base(dir) + ")", s})
	pc.mu.Unlock()
	return s
}

// objectsOf returns n objects (keys of type crash) whose partitions node id
// serves, found by asking through via and reading who served.
func (pc *procCluster) objectsOf(ctx context.Context, via, id string, n int) []string {
	pc.t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	var out []string
	for i := 0; len(out) < n && i < 2000; i++ {
		key := fmt.Sprintf("id%d", i)
		_, _, served, err := pc.callServedBy(ctx, c, "GET", fmt.Sprintf("%s/api/v1/objects/app_crash/crash/%s", via, key), nil)
		if err != nil {
			pc.t.Fatal(err)
		}
		if strings.HasPrefix(served, id+"/") {
			out = append(out, key)
		}
	}
	if len(out) < n {
		pc.t.Fatalf("found %d objects served by %s", len(out), id)
	}
	return out
}

// readCounter reads slot n of object key through url: its value and 200 (a
// missing slot, 404, is 0), or the status when it was not served.
func readCounter(ctx context.Context, c *http.Client, url, key string) (value int, status int, err error) {
	status, reply, err := call(ctx, c, "GET", fmt.Sprintf("%s/api/v1/objects/app_crash/crash/%s/n", url, key), nil)
	if err == nil && status == http.StatusNotFound {
		return 0, http.StatusOK, nil // served, and the slot is not there
	}
	if err != nil || status != http.StatusOK {
		return 0, status, err
	}
	v, ok := reply["value"].(float64)
	if !ok {
		return 0, status, fmt.Errorf("reply %v", reply)
	}
	return int(v), status, nil
}

// TestCluster_ProcessesReusedNodeIDOnEmptyDiskRefuses models a disk loss with
// a reused nodeId: increments acknowledged through node b, kill -9 of b, and a
// process started with b's nodeId on a new, empty data directory. It must not
// serve b's partitions (503 through every node; no read ever shows less than
// was acknowledged), it logs why, and cluster status shows it refused. Once it
// stops and the real b returns on its own directory, every acknowledged
// increment is there. (Before storage IDs, the impostor took the partitions up
// and served them empty.)
func TestCluster_ProcessesReusedNodeIDOnEmptyDiskRefuses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd process and several server processes")
	}
	pc := newProcCluster(t, "")
	pc.startThree()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := &http.Client{Timeout: 10 * time.Second}
	objs := pc.objectsOf(ctx, pc.servers["a"].url, "b", 4)
	acked := map[string]int{}
	for _, o := range objs {
		for range 25 {
			st, reply, err := call(ctx, c, "POST", pc.servers["b"].url+"/api/v1/objects/app_crash/crash/"+o+"/n/increment", map[string]any{"by": 1})
			if err != nil || st != http.StatusOK {
				t.Fatalf("increment %s: %d %v %v", o, st, reply, err)
			}
			acked[o]++
		}
	}
	pc.kill("b")
	impostor := pc.startIn("b", filepath.Join(pc.dir, "b-new-disk"))
	// Until the impostor says it refuses, and a while after, no read of b's
	// objects through any node is below what was acknowledged.
	check := func() (served int) {
		for _, url := range pc.urls() {
			for _, o := range objs {
				v, st, err := readCounter(ctx, c, url, o)
				switch {
				case err != nil:
					t.Fatalf("read %s via %s: %v", o, url, err)
				case st == http.StatusOK && v < acked[o]:
					t.Fatalf("read %s via %s: %d, below the %d increments acknowledged", o, url, v, acked[o])
				case st == http.StatusOK:
					served++
				case st != http.StatusServiceUnavailable:
					t.Fatalf("read %s via %s: status %d", o, url, st)
				}
			}
		}
		return served
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(impostor.log(), "refusing to serve them"); {
		check()
		if time.Now().After(deadline) {
			t.Fatal("the process with b's nodeId and a new disk did not say it refuses b's partitions")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for range 10 { // its refusal holds (the controller does not move them either)
		if served := check(); served != 0 {
			t.Fatalf("%d reads of b's objects were served while b's disk is missing", served)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if log := impostor.log(); !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "forget-node b --accept-data-loss") || !strings.Contains(log, "expectedStorageId=") {
		t.Fatalf("the refusal's log line: %s", log)
	}
	// A write through another node is refused with the usual 503 shape.
	st, reply, err := call(ctx, c, "POST", pc.servers["a"].url+"/api/v1/objects/app_crash/crash/"+objs[0]+"/n/increment", map[string]any{"by": 1})
	if err != nil || st != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(reply), "refuses") {
		t.Fatalf("write of b's object during the refusal: %d %v %v", st, reply, err)
	}
	// cluster status says so, and why.
	out, err := pc.holdfast("cluster", "status", "--json")
	if err != nil {
		t.Fatalf("cluster status: %v\n%s", err, out)
	}
	var status struct {
		Refused int `json:"refused"`
		Nodes   []struct {
			ID, State, Reason string
			Refused           int
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &status); err != nil {
		t.Fatalf("cluster status --json: %v\n%s", err, out)
	}
	refusedB := false
	for _, n := range status.Nodes {
		if n.ID == "b" && n.State == "refused" && n.Refused > 0 && n.Refused == status.Refused && strings.Contains(n.Reason, "forget-node b") {
			refusedB = true
		}
	}
	if !refusedB {
		t.Fatalf("cluster status does not show b refused:\n%s", out)
	}
	// The impostor stops (SIGTERM: nothing to hand off), the real b returns.
	pc.leave("b")
	pc.start("b")
	pc.waitStable(60 * time.Second)
	for _, url := range pc.urls() {
		for _, o := range objs {
			if v, st, err := readCounter(ctx, c, url, o); err != nil || st != http.StatusOK || v != acked[o] {
				t.Fatalf("read %s via %s after b returned: %d (status %d, %v), want %d", o, url, v, st, err, acked[o])
			}
		}
	}
}
