package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// floodFileLimit is the descriptor limit the flooded server runs under.
const floodFileLimit = 256

// TestServe_ConnectionFloodKeepsStorageDescriptors models descriptor
// exhaustion by idle connections (a client pool that keeps hundreds alive, or
// an attack) against a node with a small RLIMIT_NOFILE (ulimit -n 256). The
// node caps its HTTP connections at half the limit: the flood beyond it
// waits in the kernel's backlog. Through a connection opened before the flood
// the test then writes about 80 MB, which makes the write-ahead log move to a
// new segment (a few new descriptors): every write must succeed, and the
// node must stay healthy. Without the cap (maxConnections far above the
// limit) the flood takes every descriptor and the log's segment switch fails:
// the node answers 503 and /healthz says only a restart repairs it.
func TestServe_ConnectionFloodKeepsStorageDescriptors(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server process")
	}
	cfgFile, dataDir, _ := crashSetup(t, "")
	cmd := exec.Command("sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, floodFileLimit),
		os.Args[0], "-test.run=^$", "--", "serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--config", cfgFile)
	cmd.Env = floodExtraEnv
	srv := startServerCmd(t, cmd)
	if want := fmt.Sprintf("max_connections=%d", floodFileLimit/2); floodExtraEnv == nil && !strings.Contains(srv.log(), want) {
		t.Fatalf("the start-up log does not say %s:\n%s", want, srv.log())
	}

	// One kept-alive connection, opened before the flood, for the writes.
	tr := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	ctx := context.Background()
	if status, _, err := call(ctx, client, "GET", srv.url+"/healthz", nil); err != nil || status != 200 {
		t.Fatalf("healthz before the flood: %d %v", status, err)
	}

	// The flood: more idle connections than the limit, each sending one
	// request and then keeping the connection open.
	flood := 2 * floodFileLimit
	var answered atomic.Int64
	var conns []net.Conn
	var readers sync.WaitGroup
	defer func() {
		for _, c := range conns {
			c.Close()
		}
		readers.Wait()
	}()
	addr := strings.TrimPrefix(srv.url, "http://")
	for range flood {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		conns = append(conns, c)
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: flood\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		readers.Add(1)
		go func() {
			defer readers.Done()
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				resp.Body.Close()
				answered.Add(1)
			}
		}()
	}
	// Wait until the server took all the connections it will take: the
	// answered count holds still for a second.
	last, still := int64(-1), time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && time.Since(still) < time.Second; time.Sleep(50 * time.Millisecond) {
		if n := answered.Load(); n != last {
			last, still = n, time.Now()
		}
	}
	t.Logf("%d of %d flood connections answered", answered.Load(), flood)
	if n := answered.Load(); n == 0 || n >= int64(flood) {
		t.Fatalf("%d of %d flood connections answered: the flood is not holding the server", n, flood)
	}

	// About 80 MB of writes through the early connection: the write-ahead
	// log (64 MiB segments) opens its next segment meanwhile.
	value := strings.Repeat("v", 900_000)
	for i := range 90 {
		status, reply, err := call(ctx, client, "PUT", fmt.Sprintf("%s/api/v1/objects/app_crash/flood/o%d/big", srv.url, i%8), map[string]any{"value": value})
		if err != nil || status != 200 {
			t.Fatalf("write %d during the flood: %d %v %v\n%s", i, status, reply, err, lastBytes(srv.log(), 3000))
		}
	}
	if status, reply, err := call(ctx, client, "GET", srv.url+"/healthz", nil); err != nil || status != 200 {
		t.Fatalf("healthz after the writes: %d %v %v", status, reply, err)
	}
	if status, reply, err := call(ctx, client, "GET", srv.url+"/api/v1/objects/app_crash/flood/o3", nil); err != nil || status != 200 {
		t.Fatalf("read after the writes: %d %v %v", status, reply, err)
	}
	if strings.Contains(srv.log(), "too many open files") {
		t.Fatalf("the server ran out of descriptors:\n%s", lastBytes(srv.log(), 3000))
	}
}

// floodExtraEnv is nil; setting it to []string{"HOLDFAST_MAX_CONNECTIONS=100000"}
// runs the test without an effective cap (it must then fail).
var floodExtraEnv []string

func lastBytes(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
