package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cluster"
)

// TestReplicated_ProcessesRecoverPartition: three `holdfast serve`
// processes; the two nodes other than a partition's leader are killed (-9),
// and the partition has no majority. `holdfast cluster recover-partition`
// is refused while the majority lives and without --accept-data-loss; once
// they are gone, it serves the partition from the survivor with every write
// it held, at an epoch above 2^40, and the next write's log_id is 2^32+1.
// When the two return, the partition grows back to three replicas, and
// serves the data with the survivor killed too.
func TestReplicated_ProcessesRecoverPartition(t *testing.T) {
	pc, objects := newReplicatedProcCluster(t, nil)
	c := &http.Client{Timeout: 10 * time.Second}
	obj := objects[0]
	_, s := pc.get(c, pc.nodeURL("a"), obj, 30*time.Second)
	p, survivor := s.partition, s.node
	P := fmt.Sprint(p)
	inc := func(url string) map[string]any {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			status, reply, err := pc.callServed(context.Background(), c, "POST", url+"/api/v1/objects/app_crash/crash/"+obj+"/n/increment", map[string]any{"by": 1})
			if err == nil && status == http.StatusOK {
				return reply
			}
			if err == nil && status != http.StatusServiceUnavailable || time.Now().After(deadline) {
				t.Fatalf("increment %s via %s: %d %v %v", obj, url, status, reply, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for range 10 {
		inc(pc.nodeURL(survivor))
	}
	if out, err := pc.holdfast("cluster", "recover-partition", P); err == nil || !strings.Contains(out, "accept-data-loss") {
		t.Fatalf("recover-partition without --accept-data-loss: %v %s", err, out)
	}
	if out, err := pc.holdfast("cluster", "recover-partition", P, "--accept-data-loss"); err == nil || !strings.Contains(out, "majority of its replicas is live") {
		t.Fatalf("recover-partition with every replica live: %v %s", err, out)
	}
	var lost []string
	for _, id := range []string{"a", "b", "c"} {
		if id != survivor {
			pc.kill(id)
			lost = append(lost, id)
		}
	}
	killed := time.Now()
	deadline := killed.Add(90 * time.Second)
	for {
		// The killed nodes count as live until their etcd leases expire.
		out, err := pc.holdfast("cluster", "recover-partition", P, "--accept-data-loss")
		if err == nil {
			t.Logf("%v after the kills: %s", time.Since(killed).Round(time.Millisecond), strings.TrimSpace(out))
			break
		}
		if !strings.Contains(out, "is live") && !strings.Contains(out, "is served") || time.Now().After(deadline) {
			t.Fatalf("recover-partition %s: %v %s", P, err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
	st, by := pc.get(c, pc.nodeURL(survivor), obj, 30*time.Second)
	if st["state"].(map[string]any)["n"] != float64(10) || by.node != survivor || by.epoch <= 1<<40 {
		t.Fatalf("after the recovery %s reads %v served by %+v: want n 10, by %s at an epoch above 2^40", obj, st, by, survivor)
	}
	if r := inc(pc.nodeURL(survivor)); r["log_id"] != float64(1<<32+1) || r["value"] != float64(11) {
		t.Fatalf("first write after the recovery: %v, want log_id 2^32+1 and value 11", r)
	}
	for _, id := range lost {
		pc.start(id)
	}
	deadline = time.Now().Add(90 * time.Second)
	for {
		st, err := cluster.ReadStatus(context.Background(), []string{pc.etcd}, pc.name)
		why := ""
		switch {
		case err != nil:
			why = err.Error()
		case st.Unavailable != 0 || st.UnderReplicated != 0:
			why = fmt.Sprintf("%d unavailable, %d under-replicated", st.Unavailable, st.UnderReplicated)
		}
		if why == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster is not whole again 90 s after the lost nodes returned: %s", why)
		}
		time.Sleep(500 * time.Millisecond)
	}
	pc.kill(survivor)
	st, by = pc.get(c, pc.nodeURL(lost[0]), obj, 30*time.Second)
	if st["state"].(map[string]any)["n"] != float64(11) || by.node == survivor {
		t.Fatalf("with %s killed, %s reads %v served by %+v: want n 11", survivor, obj, st, by)
	}
}

// TestRecoverPartition_BadInput: a partition that is not a number, or no
// --accept-data-loss, is refused before anything is read or written (no
// etcd is needed to refuse it).
func TestRecoverPartition_BadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"x", "--accept-data-loss"}, "a partition number"},
		{[]string{"4294967296", "--accept-data-loss"}, "a partition number"},
		{[]string{"3"}, "accept-data-loss"},
	} {
		args := append([]string{"-test.run=^$", "--", "cluster", "recover-partition"}, c.args...)
		cmd := exec.Command(os.Args[0], append(args, "--etcd", "127.0.0.1:1", "--name", "none")...)
		cmd.Env = append(os.Environ(), "HOLDFAST_TEST_MAIN=1")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("recover-partition %v: %v %s, want an error naming %q", c.args, err, out, c.want)
		}
	}
}
