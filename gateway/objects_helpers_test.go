package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
)

// Helpers shared by the objects_*_test.go files.

// objPath is the REST path of object (type, key) of testApp, by App ID, with rest
// appended as further segments. typ and key are used as written (already escaped).
func objPath(typ, key string, rest ...string) string {
	return appObjPath(testApp.ID, typ, key, rest...)
}

func appObjPath(app, typ, key string, rest ...string) string {
	p := "/api/v1/objects/" + app + "/" + typ + "/" + key
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

// authHdr returns testApp's credentials plus extra headers.
func authHdr(extra map[string]string) map[string]string {
	h := map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": testApp.Secret}
	for k, v := range extra {
		h[k] = v
	}
	return h
}

func idemHdr(key string) map[string]string {
	return authHdr(map[string]string{"Idempotency-Key": key})
}

// decodeExact decodes JSON keeping number literals as written, so that 3 and 3.0
// compare different.
func decodeExact(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return v, nil
}

// wantJSON checks the status and that the body is the JSON value want (member
// order and whitespace aside; number literals must match as written).
func wantJSON(t *testing.T, r reply, status int, want string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	got, err := decodeExact(r.body)
	if err != nil {
		t.Fatalf("body %q is not JSON: %v", r.body, err)
	}
	w, err := decodeExact([]byte(want))
	if err != nil {
		t.Fatalf("bad want %q: %v", want, err)
	}
	if !reflect.DeepEqual(got, w) {
		t.Fatalf("body %s, want %s", bytes.TrimSpace(r.body), want)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
}

// wantError checks an error reply of spec/errors.md: status, a non-empty "error"
// string, and "code" equal to code (every error but the 401 has one). extra lists the
// further members the body must hold, with their values; no other member is
// allowed but "request_id", which must repeat the X-Request-Id header.
func wantError(t *testing.T, r reply, status int, code string, extra map[string]any) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(r.body))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", r.body, err)
	}
	if msg, ok := m["error"].(string); !ok || msg == "" {
		t.Errorf("body %s: \"error\" is not a non-empty string", r.body)
	}
	if got, _ := m["code"].(string); got == "" || got != code {
		t.Errorf("body %s: code %v, want %q", r.body, m["code"], code)
	}
	// Every error body repeats the request's id (X-Request-Id).
	if id := r.header.Get("X-Request-Id"); id == "" || m["request_id"] != id {
		t.Errorf("body %s: request_id %v, want the X-Request-Id %q", r.body, m["request_id"], id)
	}
	allowed := map[string]bool{"error": true, "code": true, "request_id": true}
	for k, v := range extra {
		allowed[k] = true
		if g, ok := m[k]; !ok || fmt.Sprint(g) != fmt.Sprint(v) {
			t.Errorf("body %s: %s = %v, want %v", r.body, k, g, v)
		}
	}
	for k := range m {
		if !allowed[k] {
			t.Errorf("body %s: unexpected member %q", r.body, k)
		}
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
}

// wantUnauthorized checks the exact 401 body of spec/errors.md.
func wantUnauthorized(t *testing.T, r reply) {
	t.Helper()
	if r.status != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401; body %s", r.status, r.body)
	}
	if got := string(bytes.TrimSpace(r.body)); got != `{"errors":[{"status":"401","title":"Unauthorized"}]}` {
		t.Fatalf("401 body %s", got)
	}
}

// snap is an object's state and log_id read through the Go API.
type snap struct {
	state map[string]string
	logID uint64
}

func (s snap) String() string {
	names := make([]string, 0, len(s.state))
	for n := range s.state {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		v := s.state[n]
		if len(v) > 60 {
			v = fmt.Sprintf("%s...(%d bytes)", v[:40], len(v))
		}
		fmt.Fprintf(&b, "%s=%s ", n, v)
	}
	return fmt.Sprintf("{log_id %d; %s}", s.logID, b.String())
}

func stateOf(t *testing.T, ts *testServer, app, typ, key string) snap {
	t.Helper()
	st, err := actors.NewKV(ts.node, actors.ObjectID{App: app, Type: typ, Key: key}).Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := snap{state: map[string]string{}, logID: st.LogID}
	for n, v := range st.State {
		s.state[n] = string(v)
	}
	return s
}

func snapOf(t *testing.T, ts *testServer, typ, key string) snap {
	t.Helper()
	return stateOf(t, ts, testApp.ID, typ, key)
}

// wantSnap checks an object's stored state (raw JSON per slot, as stored) and log_id.
func wantSnap(t *testing.T, ts *testServer, typ, key string, logID uint64, state map[string]string) {
	t.Helper()
	got := snapOf(t, ts, typ, key)
	if state == nil {
		state = map[string]string{}
	}
	want := snap{state: state, logID: logID}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("object %s/%s is %v, want %v", typ, key, got, want)
	}
}

// wantUnchanged checks that the object still is before.
func wantUnchanged(t *testing.T, ts *testServer, typ, key string, before snap) {
	t.Helper()
	if got := snapOf(t, ts, typ, key); !reflect.DeepEqual(got, before) {
		t.Fatalf("a refused request changed %s/%s: %v, was %v", typ, key, got, before)
	}
}

// mustDo sends a request that must succeed with status.
func mustDo(t *testing.T, ts *testServer, method, path string, body any, status int) reply {
	t.Helper()
	r := ts.do(method, path, body, nil)
	if r.status != status {
		t.Fatalf("%s %s: status %d, want %d; body %s", method, path, r.status, status, r.body)
	}
	return r
}

// logIDOf decodes the log_id of a write reply.
func logIDOf(t *testing.T, r reply) uint64 {
	t.Helper()
	var m struct {
		LogID *uint64 `json:"log_id"`
	}
	if err := json.Unmarshal(r.body, &m); err != nil || m.LogID == nil {
		t.Fatalf("reply %s has no log_id", r.body)
	}
	return *m.LogID
}

// send is a goroutine-safe request as testApp: it returns an error instead of
// failing the test.
func send(url, method, path, body string, hdr map[string]string) (reply, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url+path, rd)
	if err != nil {
		return reply{}, err
	}
	if hdr == nil {
		hdr = authHdr(nil)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// startStoppable starts a node and an HTTP server like newTestServer, and returns
// a stop function that closes both (once; it also runs at cleanup). Starting a new
// one on the same DataDir after stop is a node restart.
func startStoppable(t *testing.T, cfg cluster.Config) (*testServer, func()) {
	t.Helper()
	if cfg.DataDir == "" {
		t.Fatal("startStoppable needs a DataDir")
	}
	node, err := cluster.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, url, stopFront := startFront(t, New(Config{Node: node, Apps: NewApps([]App{testApp, otherApp})}))
	ts := &testServer{t: t, node: node, stop: stopFront, url: url}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			stopFront()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := node.Close(ctx); err != nil {
				t.Errorf("close node: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return ts, stop
}

// retention returns TypeOptions keeping n change-log entries for typ, and the
// defaults for every other type.
func retention(typ string, n int) func(string) actors.TypeOptions {
	return func(t string) actors.TypeOptions {
		if t == typ {
			return actors.TypeOptions{ChangeLogEntries: n}
		}
		return actors.DefaultTypeOptions()
	}
}

// jsonString returns a JSON string literal of exactly n bytes (n >= 2).
func jsonString(n int) string {
	return `"` + strings.Repeat("x", n-2) + `"`
}

// bind makes ts report failures to t (a subtest) until the returned function runs.
func (ts *testServer) bind(t *testing.T) func() {
	old := ts.t
	ts.t = t
	return func() { ts.t = old }
}

// refusal is one request that must be refused without writing anything.
type refusal struct {
	name   string
	method string
	path   string
	body   any
	hdr    map[string]string
	status int
	code   string
}

// runRefusals sends each request against object (typ, key) and checks the error
// reply and that the object is unchanged.
func runRefusals(t *testing.T, ts *testServer, typ, key string, cases []refusal) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer ts.bind(t)()
			before := snapOf(t, ts, typ, key)
			r := ts.do(c.method, c.path, c.body, c.hdr)
			if c.status == http.StatusUnauthorized {
				wantUnauthorized(t, r)
			} else {
				wantError(t, r, c.status, c.code, nil)
			}
			wantUnchanged(t, ts, typ, key, before)
		})
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
