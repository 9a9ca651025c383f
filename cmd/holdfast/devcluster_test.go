package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// `serve --dev-cluster --dev-etcd-port P` puts its embedded etcd on
// 127.0.0.1:P and prints that endpoint (issue 26: a random port that only
// the log named); a second node configured with it joins the same cluster:
// a write through one node is read through the other.
func TestServe_DevClusterOnAGivenEtcdPortTakesASecondNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	cfgFile, dataDir, _ := crashSetup(t, "")
	etcdAddr := freeAddr(t)
	_, port, _ := net.SplitHostPort(etcdAddr)
	dev := startServerCmd(t, exec.Command(os.Args[0], "-test.run=^$", "--", "serve", "--dev-cluster", "--dev-etcd-port", port,
		"--data-dir", dataDir, "--listen", "127.0.0.1:0", "--config", cfgFile))
	if want := "embedded etcd at " + etcdAddr; !strings.Contains(dev.log(), want) {
		t.Fatalf("the dev node does not print %q:\n%s", want, dev.log())
	}

	n2File := filepath.Join(t.TempDir(), "n2.yaml")
	n2 := fmt.Sprintf("apps:\n  - {id: app_crash, key: %s, secret: %s}\n"+
		"cluster: {name: dev, nodeId: n2, advertise: '%s', etcd: {endpoints: ['%s']}}\n", crashAppKey, crashAppSecret, freeAddr(t), etcdAddr)
	if err := os.WriteFile(n2File, []byte(n2), 0o644); err != nil {
		t.Fatal(err)
	}
	second := startServer(t, filepath.Join(t.TempDir(), "n2"), n2File)
	// Writes through either node reach the same objects, wherever they live.
	c := &http.Client{Timeout: 10 * time.Second}
	ctx := context.Background()
	for i := range 8 {
		obj := fmt.Sprintf("/api/v1/objects/app_crash/counter/c%d/n", i)
		for _, s := range []*server{dev, second} {
			pollUntil(t, 30*time.Second, "an increment of "+obj+" through "+s.url, func() bool {
				st, _, err := call(ctx, c, "POST", s.url+obj+"/increment", map[string]any{"by": 1})
				return err == nil && st == 200
			})
		}
		st, reply, err := call(ctx, c, "GET", dev.url+obj, nil)
		if err != nil || st != 200 || reply["value"] != float64(2) {
			t.Fatalf("%s after an increment through each node: %d %v %v", obj, st, reply, err)
		}
	}
	out, err := cliCommand(ctx, dev, "cluster", "status", "--config", n2File).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dev-1") || !strings.Contains(string(out), "n2") {
		t.Fatalf("cluster status through the dev cluster's etcd: %v\n%s", err, out)
	}
}

// pollUntil calls ok until it holds, failing the test after d.
func pollUntil(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, d)
		}
	}
}

// A --dev-etcd-port without --dev-cluster, or out of range, stops start-up.
func TestServe_DevEtcdPortNeedsDevCluster(t *testing.T) {
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"--dev-etcd-port", "2379"}, "add --dev-cluster"},
		{[]string{"--dev-cluster", "--dev-etcd-port", "70000"}, "from 1 to 65535"},
	} {
		cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--", "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0"}, c.args...)...)
		cmd.Env = append(os.Environ(), "HOLDFAST_TEST_MAIN=1")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.mention) {
			t.Fatalf("%v: %v\n%s", c.args, err, out)
		}
	}
}
