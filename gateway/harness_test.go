package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
)

// Test apps: two tenants, so that cross-app access can be checked.
var (
	testApp  = App{ID: "app_test", Key: "pk_test", Secret: "sk_test_secret"}
	otherApp = App{ID: "app_other", Key: "pk_other", Secret: "sk_other_secret"}
)

// testServer is a real node behind a real HTTP server on 127.0.0.1:0.
type testServer struct {
	t     *testing.T
	node  *cluster.Node
	gw    *Server
	stop  func() // stops the HTTP server
	front *Front // the HTTP server (nil for one serving s.Handler() alone)
	url   string
	// closed is set by closeNow: the cleanup has nothing left to stop.
	closed bool
}

func newTestServer(t *testing.T, cfg cluster.Config) *testServer {
	t.Helper()
	return newTestServerWith(t, cfg, nil)
}

// newTestServerWith lets a test change the gateway's configuration.
func newTestServerWith(t *testing.T, cfg cluster.Config, gwcfg func(*Config)) *testServer {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	node, err := cluster.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gc := Config{Node: node, Apps: NewApps([]App{testApp, otherApp})}
	if gwcfg != nil {
		gwcfg(&gc)
	}
	s := New(gc)
	front, url, stop := startFront(t, s)
	ts := &testServer{t: t, node: node, gw: s, stop: stop, front: front, url: url}
	t.Cleanup(func() {
		if ts.closed {
			return
		}
		s.Close()
		stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := node.Close(ctx); err != nil {
			t.Errorf("close node: %v", err)
		}
	})
	return ts
}

// startFront serves s as holdfast serve does, through its Front (fasthttp,
// and net/http for what it hands off), on 127.0.0.1, and returns its URL and
// what stops it.
func startFront(t testing.TB, s *Server) (*Front, string, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := NewFront(s, &http.Server{ReadHeaderTimeout: 10 * time.Second})
	served := make(chan error, 1)
	go func() { served <- f.Serve(ln) }()
	return f, "http://" + ln.Addr().String(), func() {
		_ = f.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("front: %v", err)
		}
	}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", r.body, err)
	}
	return m
}

// do sends a request as testApp (or with the given headers when hdr is not nil).
func (ts *testServer) do(method, path string, body any, hdr map[string]string) reply {
	ts.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			ts.t.Fatal(err)
		}
		rd = bytes.NewReader(enc)
	}
	req, err := http.NewRequest(method, ts.url+path, rd)
	if err != nil {
		ts.t.Fatal(err)
	}
	if hdr == nil {
		hdr = map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": testApp.Secret}
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ts.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		ts.t.Fatal(err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// state returns the object's state and log_id through the Go API, bypassing HTTP.
func (ts *testServer) state(typ, key string) *actors.KVState {
	ts.t.Helper()
	st, err := actors.NewKV(ts.node, actors.ObjectID{App: testApp.ID, Type: typ, Key: key}).Get(context.Background())
	if err != nil {
		ts.t.Fatal(err)
	}
	return st
}

func TestSmoke(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	r := ts.do("PUT", "/api/v1/objects/app_test/order/o1/status", map[string]any{"value": "new"}, nil)
	t.Logf("%d %s", r.status, r.body)
	r = ts.do("POST", "/api/v1/objects/pk_test/order/o1/n/increment", "", nil)
	t.Logf("%d %s", r.status, r.body)
	r = ts.do("GET", "/api/v1/objects/pk_test/order/o1", nil, nil)
	t.Logf("%d %s", r.status, r.body)
	r = ts.do("GET", "/api/v1/objects/pk_test/order/o1/log", nil, nil)
	t.Logf("%d %s", r.status, r.body)
	r = ts.do("POST", "/api/v1/objects/pk_test/order/o1", nil, nil)
	t.Logf("%d %s %v", r.status, r.body, r.header)
	r = ts.do("GET", "/api/v1/objects/pk_test/order/a%2Fb", nil, nil)
	t.Logf("%d %s", r.status, r.body)
	r = ts.do("GET", "/api/v1/nothing", nil, nil)
	t.Logf("%d %s", r.status, r.body)
	r = ts.do("POST", "/api/v1/objects/pk_test/order/o1/transaction", `[{"op":"set","key":"a","value":null}]`, nil)
	t.Logf("%d %s", r.status, r.body)
	r = ts.do("POST", "/api/v1/objects/pk_test/order/o1/transaction", `[{"op":"append","key":"l","value":null},{"op":"increment","key":"n","by":1.5}]`, nil)
	t.Logf("%d %s", r.status, r.body)
	r = ts.do("GET", "/api/v1/objects/pk_test/order/o1/", nil, nil)
	t.Logf("%d %s", r.status, r.body)
}
