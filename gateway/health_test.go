package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
)

var _ Node = (*cluster.Node)(nil)

// fakeNode is a Node whose readiness and storage state the test sets.
type fakeNode struct {
	ready              atomic.Bool
	fatal, unavailable atomic.Pointer[error]
}

func (f *fakeNode) Request(context.Context, actors.ObjectID, any) (any, error) {
	return nil, errors.New("fake node: no objects")
}

func (f *fakeNode) Ready() bool { return f.ready.Load() }

func (f *fakeNode) StorageHealth() (fatal, unavailable error) {
	if p := f.fatal.Load(); p != nil {
		fatal = *p
	}
	if p := f.unavailable.Load(); p != nil {
		unavailable = *p
	}
	return fatal, unavailable
}

// TestServer_HealthAndReadiness: /healthz is 503 only when the storage failed
// for good (a restart is the only repair); /readyz is 503 with the cause, and
// code unavailable, whenever the node cannot take writes. Neither leaks the
// storage's error text.
func TestServer_HealthAndReadiness(t *testing.T) {
	node := &fakeNode{}
	srv := httptest.NewServer(New(Config{Node: node, Apps: NewApps([]App{testApp})}).Handler())
	defer srv.Close()
	get := func(path string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatalf("%s: body is not JSON: %v", path, err)
		}
		return resp.StatusCode, body
	}
	secret := errors.New("write /data/db/wal/00000001.log: input/output error")
	for _, c := range []struct {
		name               string
		ready              bool
		fatal, unavailable error
		health, readiness  int
		cause              string
	}{
		{"serving", true, nil, nil, 200, 200, ""},
		{"starting", false, nil, nil, 200, 503, "not ready"},
		{"storage briefly unavailable", true, nil, secret, 200, 503, "temporarily unavailable"},
		{"storage failed", false, secret, secret, 503, 503, "only a restart"},
	} {
		t.Run(c.name, func(t *testing.T) {
			node.ready.Store(c.ready)
			node.fatal.Store(&c.fatal)
			node.unavailable.Store(&c.unavailable)
			status, body := get("/healthz")
			if status != c.health {
				t.Fatalf("/healthz: %d %v, want %d", status, body, c.health)
			}
			status, body = get("/readyz")
			if status != c.readiness {
				t.Fatalf("/readyz: %d %v, want %d", status, body, c.readiness)
			}
			if c.readiness == 503 {
				if msg, _ := body["error"].(string); body["code"] != "unavailable" || !strings.Contains(msg, c.cause) {
					t.Fatalf("/readyz body %v: want code unavailable and a cause with %q", body, c.cause)
				}
			}
			for _, p := range []string{"/healthz", "/readyz"} {
				if _, body := get(p); strings.Contains(fmt.Sprint(body), "input/output") {
					t.Fatalf("%s leaks the storage error: %v", p, body)
				}
			}
		})
	}
}

// TestServer_BodyTimeout: a client that stops in the middle of its body gets
// a 400 once BodyTimeout has passed, instead of holding the connection; a
// long poll whose body arrived is not cut off by it.
func TestServer_BodyTimeout(t *testing.T) {
	ts := newTestServerWith(t, cluster.Config{}, func(c *Config) { c.BodyTimeout = 300 * time.Millisecond })
	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "PUT /api/v1/objects/app_test/order/slow/status HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
		"X-App-Key: " + testApp.Key + "\r\nX-App-Secret: " + testApp.Secret + "\r\nContent-Length: 100\r\n\r\n{\"value\":"
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second)) // the test's own bound, far above 300 ms
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no reply to a stalled body: %v", err)
	}
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(fmt.Sprint(body["error"]), "did not arrive in time") {
		t.Fatalf("stalled body: %d %v", resp.StatusCode, body)
	}
	if r := ts.do("GET", "/api/v1/objects/app_test/order/slow", nil, nil); r.status != 404 && r.status != 200 {
		t.Fatalf("read after the stalled write: %d %s", r.status, r.body)
	} else if strings.Contains(string(r.body), "status") {
		t.Fatalf("the stalled write changed the object: %s", r.body)
	}

	// A long poll of 1.5 s, five times BodyTimeout, answers when its wait is
	// over (empty), not with a cancelled request.
	start := time.Now()
	r := ts.do("POST", "/api/v1/queues/app_test/jobs/q1/receive", `{"waitMs":1500}`, nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"messages":[]`) {
		t.Fatalf("long poll: %d %s", r.status, r.body)
	}
	if waited := time.Since(start); waited < 1400*time.Millisecond {
		t.Fatalf("the long poll ended after %v, before its wait", waited)
	}
	// And the connection stays usable for the next request (keep-alive).
	if r := ts.do("GET", "/healthz", nil, map[string]string{}); r.status != 200 {
		t.Fatalf("healthz: %d", r.status)
	}
}

// TestServer_BodyTimeoutSparesBodilessRequests: a request without a body gets
// no read deadline, so a handler slower than BodyTimeout keeps its context.
func TestServer_BodyTimeoutSparesBodilessRequests(t *testing.T) {
	node := &slowNode{delay: 600 * time.Millisecond}
	srv := httptest.NewServer(New(Config{Node: node, Apps: NewApps([]App{testApp}), BodyTimeout: 100 * time.Millisecond}).Handler())
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/api/v1/objects/app_test/order/o1", nil)
	req.Header.Set("X-App-Key", testApp.Key)
	req.Header.Set("X-App-Secret", testApp.Secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 || node.cancelled.Load() {
		t.Fatalf("slow GET: %d, context cancelled %v", resp.StatusCode, node.cancelled.Load())
	}
}

// slowNode answers every request not found after delay, noting whether the
// request's context ended first.
type slowNode struct {
	fakeNode
	delay     time.Duration
	cancelled atomic.Bool
}

func (n *slowNode) Request(ctx context.Context, _ actors.ObjectID, _ any) (any, error) {
	select {
	case <-ctx.Done():
		n.cancelled.Store(true)
		return nil, ctx.Err()
	case <-time.After(n.delay):
		return nil, &actors.Error{Kind: actors.KindNotFound, Msg: "no such object"}
	}
}
