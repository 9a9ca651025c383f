package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
	"github.com/valyala/fasthttp"
)

// frontServer is a node's gateway served twice: through its Front (the
// harness's), and on net/http alone (the mux, as before the Front), for
// differential tests.
type frontServer struct {
	*testServer
	plain string // the URL of the net/http-only server
}

func newFrontServer(t *testing.T, gwcfg func(*Config)) *frontServer {
	t.Helper()
	ts := newTestServerWith(t, cluster.Config{}, gwcfg)
	plain := httptest.NewServer(ts.gw.Handler())
	t.Cleanup(plain.Close)
	return &frontServer{testServer: ts, plain: plain.URL}
}

// rawConn is one client connection written and read by hand.
type rawConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, url string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second)) // the test's bound
	return &rawConn{t: t, c: c, r: bufio.NewReader(c)}
}

func (rc *rawConn) send(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatal(err)
	}
}

// read reads one reply and its body, past any interim (1xx) reply, as a
// client must (RFC 9110, 15.2).
func (rc *rawConn) read() (*http.Response, string) {
	rc.t.Helper()
	resp, err := http.ReadResponse(rc.r, nil)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 {
		resp, err = http.ReadResponse(rc.r, nil)
	}
	if err != nil {
		rc.t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rc.t.Fatal(err)
	}
	return resp, string(b)
}

var authHeader = "X-App-Key: " + testApp.Key + "\r\nX-App-Secret: " + testApp.Secret + "\r\n"

func incrementRequest(key string) string {
	return "POST /api/v1/objects/app_test/counter/" + key + "/n/increment HTTP/1.1\r\nHost: x\r\n" + authHeader + "Content-Length: 0\r\n\r\n"
}

// TestFront_HotRoutesOnFasthttp: a slot's writes and reads are served on
// fasthttp, on one keep-alive connection, with the replies of the mux.
func TestFront_HotRoutesOnFasthttp(t *testing.T) {
	fs := newFrontServer(t, nil)
	rc := dialRaw(t, fs.url)
	for i := 1; i <= 3; i++ {
		rc.send(incrementRequest("k"))
		resp, body := rc.read()
		if want := fmt.Sprintf(`{"log_id":%d,"value":%d}`+"\n", i, i); resp.StatusCode != 200 || body != want {
			t.Fatalf("increment %d: %d %q, want %q", i, resp.StatusCode, body, want)
		}
		if resp.Header.Get("Content-Type") != "application/json" || len(resp.Header.Get("X-Request-Id")) != 16 {
			t.Fatalf("increment %d: header %v", i, resp.Header)
		}
	}
	rc.send("GET /api/v1/objects/app_test/counter/k/n HTTP/1.1\r\nHost: x\r\n" + authHeader + "\r\n")
	if resp, body := rc.read(); resp.StatusCode != 200 || body != `{"value":3}`+"\n" {
		t.Fatalf("GET slot: %d %q", resp.StatusCode, body)
	}
	if s, h := fs.front.served.Load(), fs.front.handedOff.Load(); s != 4 || h != 0 {
		t.Fatalf("fasthttp served %d, handed off %d: want 4 and 0", s, h)
	}
}

// TestFront_HandOff: a request that is not a fast route hands the connection
// to net/http, which serves it and the connection's later requests, fast
// routes included, in order; pipelined requests too.
func TestFront_HandOff(t *testing.T) {
	fs := newFrontServer(t, nil)
	rc := dialRaw(t, fs.url)
	rc.send(incrementRequest("h"))
	if resp, body := rc.read(); resp.StatusCode != 200 || body != `{"log_id":1,"value":1}`+"\n" {
		t.Fatalf("first increment: %d %q", resp.StatusCode, body)
	}
	// Three requests in one write: the hand-off must keep the two after it.
	rc.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + incrementRequest("h") + incrementRequest("h"))
	if resp, body := rc.read(); resp.StatusCode != 200 || !strings.Contains(body, `"ok"`) {
		t.Fatalf("healthz: %d %q", resp.StatusCode, body)
	}
	for i := 2; i <= 3; i++ {
		if resp, body := rc.read(); resp.StatusCode != 200 || body != fmt.Sprintf(`{"log_id":%d,"value":%d}`+"\n", i, i) {
			t.Fatalf("increment %d after the hand-off: %d %q", i, resp.StatusCode, body)
		}
	}
	if s, h := fs.front.served.Load(), fs.front.handedOff.Load(); s != 1 || h != 1 {
		t.Fatalf("fasthttp served %d, handed off %d: want 1 and 1 (net/http has the connection after)", s, h)
	}
}

// TestFront_HandOffBodies: bodies fasthttp did not read whole (over 8 KiB,
// chunked) and a body behind Expect: 100-continue reach net/http intact.
func TestFront_HandOffBodies(t *testing.T) {
	fs := newFrontServer(t, nil)
	big := strings.Repeat("x", 20_000)
	put := func(key, header, body string) string {
		return "PUT /api/v1/objects/app_test/doc/" + key + "/v HTTP/1.1\r\nHost: x\r\n" + authHeader + "Content-Type: application/json\r\n" + header + "\r\n" + body
	}
	value := `{"value":"` + big + `"}`
	chunked := fmt.Sprintf("%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", 10, value[:10], len(value)-10, value[10:])
	cases := []struct {
		name, key, header, body string
		continues               bool
	}{
		{"20 KB", "big", fmt.Sprintf("Content-Length: %d\r\n", len(value)), value, false},
		{"chunked", "chunked", "Transfer-Encoding: chunked\r\n", chunked, false},
		{"small behind Expect", "expect", "Content-Length: 11\r\nExpect: 100-continue\r\n", `{"value":7}`, true},
		{"large behind Expect", "expect-big", fmt.Sprintf("Content-Length: %d\r\nExpect: 100-continue\r\n", len(value)), value, true},
	}
	for _, c := range cases {
		rc := dialRaw(t, fs.url)
		if !c.continues {
			rc.send(put(c.key, c.header, c.body))
		} else {
			rc.send(put(c.key, c.header, ""))
			line, err := rc.r.ReadString('\n')
			if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
				t.Fatalf("%s: %q %v, want 100 Continue", c.name, line, err)
			}
			if blank, _ := rc.r.ReadString('\n'); blank != "\r\n" {
				t.Fatalf("%s: after 100 Continue: %q", c.name, blank)
			}
			rc.send(c.body)
		}
		resp, body := rc.read()
		if resp.StatusCode != 200 || !strings.HasPrefix(body, `{"log_id":1`) {
			t.Fatalf("%s: %d %q", c.name, resp.StatusCode, body)
		}
		// No second 100 Continue, nothing else on the connection: the next
		// request is answered next.
		rc.send("GET /api/v1/objects/app_test/doc/" + c.key + "/v HTTP/1.1\r\nHost: x\r\n" + authHeader + "\r\n")
		resp, body = rc.read()
		want := strings.TrimSuffix(strings.TrimPrefix(c.body, `{"value":`), "}")
		if c.name == "chunked" {
			want = `"` + big + `"`
		}
		if resp.StatusCode != 200 || body != `{"value":`+want+"}\n" {
			t.Fatalf("%s: read back %d %.80q", c.name, resp.StatusCode, body)
		}
	}
}

// TestFront_WebsocketsSkipFasthttp: a connection that opens with a websocket
// upgrade goes to net/http before fasthttp reads anything.
func TestFront_WebsocketsSkipFasthttp(t *testing.T) {
	fs := newFrontServer(t, nil)
	rc := dialRaw(t, fs.url)
	rc.send("GET /socket/websocket?vsn=2.0.0 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	resp, err := http.ReadResponse(rc.r, nil)
	if err != nil {
		t.Fatal(err)
	}
	// No credentials: the socket's own refusal, from net/http's handler.
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("websocket without credentials: %d %v", resp.StatusCode, resp.Header)
	}
	if s, h := fs.front.served.Load(), fs.front.handedOff.Load(); s != 0 || h != 0 {
		t.Fatalf("fasthttp saw the websocket's connection: served %d, handed off %d", s, h)
	}
}

// TestFront_HeaderTooLarge: a header over MaxHeaderBytes gets the JSON 431.
func TestFront_HeaderTooLarge(t *testing.T) {
	fs := newFrontServer(t, nil)
	rc := dialRaw(t, fs.url)
	rc.send("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", MaxHeaderBytes) + "\r\n\r\n")
	resp, body := rc.read()
	var b map[string]any
	if err := json.Unmarshal([]byte(body), &b); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge ||
		b["code"] != "too_large" || b["request_id"] == nil {
		t.Fatalf("over-long header: %d %q", resp.StatusCode, body)
	}
}

// recordingMetrics keeps the requests the gateway observed.
type recordingMetrics struct {
	mu   sync.Mutex
	seen []string
}

func (m *recordingMetrics) Request(behaviour, method, route string, code int, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seen = append(m.seen, fmt.Sprintf("%s %s %s %d", behaviour, method, route, code))
}

func (m *recordingMetrics) SlowSocketClosed() {}

func (m *recordingMetrics) take() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.seen
	m.seen = nil
	return s
}

// TestFront_SameRepliesAsTheMux sends every fast route's requests, good and
// bad, to the Front and to net/http alone: status, body (its request id
// aside), the headers a client reads, the served-by header and the metrics
// must be the same. Each side writes its own objects, so that their replies
// match step for step.
func TestFront_SameRepliesAsTheMux(t *testing.T) {
	m := &recordingMetrics{}
	fs := newFrontServer(t, func(c *Config) { c.Metrics = m; c.ServedHeader = true })
	type step struct {
		method, path, body string
		hdr                map[string]string
	}
	auth := map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": testApp.Secret}
	with := func(kv ...string) map[string]string {
		h := map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": testApp.Secret}
		for i := 0; i < len(kv); i += 2 {
			h[kv[i]] = kv[i+1]
		}
		return h
	}
	const o = "/api/v1/objects/app_test/acct/"
	steps := []step{
		{"GET", o + "K", "", auth},   // 404: never written
		{"GET", o + "K/n", "", auth}, // 404
		{"POST", o + "K/n/increment", "", auth},
		{"POST", o + "K/n/increment", `{"by":5}`, auth},
		{"POST", o + "K/n/increment", `{"by":"5"}`, auth},
		{"POST", o + "K/n/increment", `{"by":1.5}`, auth},
		{"POST", o + "K/n/increment", `not json`, auth},
		{"POST", o + "K/n/increment", `[1]`, auth},
		{"POST", o + "K/n/increment", "{\"by\":1,\"x\":\"\xff\"}", auth},
		{"POST", o + "K/n/increment", `{"by":1,"x":"\ud800"}`, auth},
		{"POST", o + "K/n/increment", "", nil},
		{"POST", o + "K/n/increment", "", map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": "wrong"}},
		{"POST", "/api/v1/objects/app_other/acct/K/n/increment", "", auth},
		{"POST", "/api/v1/objects/" + testApp.Key + "/acct/K/n/increment", "", auth}, // by App Key
		{"PUT", o + "K/name", `{"value":"<b>&amp;</b>"}`, auth},
		{"PUT", o + "K/name", `{"val":1}`, auth},
		{"PUT", o + "K/name", ``, auth},
		{"PUT", o + "K/big", `{"value":"` + strings.Repeat("y", 7000) + `"}`, auth},
		{"GET", o + "K/name", "", auth},
		{"GET", o + "K", "", auth},
		{"POST", o + "K/list/append", `{"value":{"a":[1,2]}}`, auth},
		{"POST", o + "K/list/append", `{}`, auth},
		{"PUT", o + "K/i", `{"value":1}`, with("Idempotency-Key", "once")},
		{"PUT", o + "K/i", `{"value":2}`, with("Idempotency-Key", "once")}, // the first reply again
		{"PUT", o + "K/i", `{"value":3}`, with("Idempotency-Key", "")},
		{"PUT", o + "K/i", `{"value":3}`, with("Idempotency-Key", strings.Repeat("k", actors.MaxIdempotencyKey+1))},
		{"DELETE", o + "K/name", "", auth},
		{"DELETE", o + "K/never", "", auth},
		{"GET", o + "K/name", "", auth},
		{"GET", o + "K/log", "", auth},    // the change log's route, not slot "log"
		{"GET", o + "K/alarms", "", auth}, // the alarms' route
		{"POST", o + "K/events", `{"event":"run:x","payload":{}}`, auth},
		{"GET", o + "K/n?x=1", "", auth},    // a query the route ignores
		{"GET", o + "K/%6E", "", auth},      // encoded: net/http decodes it
		{"GET", o + "K/n/", "", auth},       // no such route
		{"PATCH", o + "K/n", "", auth},      // no such method
		{"HEAD", o + "K/n", "", auth},       // GET's route, on the mux
		{"GET", o + "Bad Key!/n", "", auth}, // the host's name check
		{"PUT", o + strings.Repeat("k", 2000) + "/v", `{"value":1}`, auth},
	}
	do := func(base, side string, st step) (int, http.Header, map[string]any, string) {
		path := strings.Replace(st.path, "/acct/K", "/acct/"+side, 1)
		var body io.Reader
		if st.body != "" {
			body = strings.NewReader(st.body)
		}
		req, err := http.NewRequest(st.method, base+path, body)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range st.hdr {
			req.Header.Set(k, v)
		}
		// A connection per request: a request handed off would move a
		// kept-alive connection to net/http for the requests after it.
		req.Close = true
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		text := strings.ReplaceAll(string(raw), side, "K")
		var b map[string]any
		if len(raw) > 0 && json.Unmarshal([]byte(text), &b) == nil {
			delete(b, "request_id")
		}
		return resp.StatusCode, resp.Header, b, text
	}
	for _, st := range steps {
		m.take()
		fc, fh, fb, fraw := do(fs.url, "front", st)
		fm := m.take()
		pc, ph, pb, praw := do(fs.plain, "plain", st)
		pm := m.take()
		name := st.method + " " + st.path
		if fc != pc || fmt.Sprint(fb) != fmt.Sprint(pb) || fb == nil && fraw != praw && st.method != "HEAD" {
			t.Errorf("%s: Front %d %.200s, net/http %d %.200s", name, fc, fraw, pc, praw)
			continue
		}
		for _, k := range []string{"Content-Type", "Retry-After", "Allow"} {
			if fh.Get(k) != ph.Get(k) {
				t.Errorf("%s: %s %q on the Front, %q on net/http", name, k, fh.Get(k), ph.Get(k))
			}
		}
		if len(fh.Get("X-Request-Id")) != 16 {
			t.Errorf("%s: X-Request-Id %q on the Front", name, fh.Get("X-Request-Id"))
		}
		if id, ok := fb["request_id"]; ok && id != fh.Get("X-Request-Id") {
			t.Errorf("%s: request_id %v, X-Request-Id %q", name, id, fh.Get("X-Request-Id"))
		}
		if (fh.Get("X-Holdfast-Served-By") == "") != (ph.Get("X-Holdfast-Served-By") == "") {
			t.Errorf("%s: served-by %q on the Front, %q on net/http", name, fh.Get("X-Holdfast-Served-By"), ph.Get("X-Holdfast-Served-By"))
		}
		if !slices.Equal(fm, pm) {
			t.Errorf("%s: metrics %v on the Front, %v on net/http", name, fm, pm)
		}
	}
	if fs.front.served.Load() == 0 {
		t.Fatal("the Front served nothing on fasthttp")
	}
}

// TestFront_RoutesAsTheMux: for random requests, a fast route is chosen only
// where the mux chooses the same pattern, with the same path values.
func TestFront_RoutesAsTheMux(t *testing.T) {
	s := New(Config{Node: &stubNode{}, Apps: NewApps([]App{testApp})})
	defer s.Close()
	segs := []string{"app_test", "t", "k", "n", "log", "alarms", "events", "transaction", "increment", "append",
		"", ".", "..", "a%2Fb", "%6E", "x.y", "-_~:@!$&'()*+,;=", "ü"}
	methods := []string{"GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS"}
	rng := rand.New(rand.NewPCG(1, 2))
	fast := 0
	for i := 0; i < 20000; i++ {
		n := 1 + rng.IntN(6)
		parts := make([]string, n)
		for j := range parts {
			parts[j] = segs[rng.IntN(len(segs))]
		}
		path := objectsPrefix + strings.Join(parts, "/")
		method := methods[rng.IntN(len(methods))]
		var ctx fasthttp.RequestCtx
		raw := method + " " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
		if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			continue // not a request fasthttp reads: never a fast route
		}
		rt, vals, ok := s.fastRouteOf(&ctx)
		if !ok {
			continue
		}
		fast++
		req := httptest.NewRequest(method, path, nil)
		_, pattern := s.mux.Handler(req)
		if pattern != rt.pattern {
			t.Fatalf("%s %s: fast route %q, the mux %q", method, path, rt.pattern, pattern)
		}
		// The path values a handler of that pattern gets from the mux.
		var got []string
		req2 := httptest.NewRequest(method, path, nil)
		rec := httptest.NewRecorder()
		probe := http.NewServeMux()
		probe.HandleFunc(rt.pattern, func(_ http.ResponseWriter, r *http.Request) {
			got = []string{r.PathValue("app"), r.PathValue("type"), r.PathValue("key"), r.PathValue("slot")}
		})
		probe.ServeHTTP(rec, req2)
		if !slices.Equal(got, vals[:]) {
			t.Fatalf("%s %s: fast route's values %q, the mux's %q", method, path, vals, got)
		}
	}
	if fast < 100 {
		t.Fatalf("only %d of the random requests took a fast route", fast)
	}
}

// TestFront_Shutdown: Shutdown lets a request in flight finish and closes
// the idle connections; Serve returns http.ErrServerClosed.
func TestFront_Shutdown(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := NewFront(ts.gw, &http.Server{ReadHeaderTimeout: 10 * time.Second})
	served := make(chan error, 1)
	go func() { served <- f.Serve(ln) }()
	url := "http://" + ln.Addr().String()
	idle := dialRaw(t, url)
	idle.send(incrementRequest("s"))
	idle.read()
	slow := dialRaw(t, url)
	slow.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") // handed off: net/http's
	slow.read()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := <-served; err != http.ErrServerClosed {
		t.Fatalf("Serve: %v", err)
	}
	for _, rc := range []*rawConn{idle, slow} {
		if _, err := rc.r.ReadByte(); err == nil {
			t.Fatal("a connection stayed open after Shutdown")
		}
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Fatal("the listener accepts after Shutdown")
	}
}

// waitingNode answers no request before its context ends.
type waitingNode struct{ fakeNode }

func (n *waitingNode) Request(ctx context.Context, _ actors.ObjectID, _ any) (any, error) {
	if _, ok := ctx.Deadline(); !ok {
		return nil, fmt.Errorf("a request without a deadline")
	}
	<-ctx.Done()
	return nil, actors.TimedOut(ctx.Err())
}

// TestFront_RequestTimeout: a fast route's request ends RequestTimeout after
// it started, give or take the shared deadline's second, with the mux's 503.
func TestFront_RequestTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	s := New(Config{Node: &waitingNode{}, Apps: NewApps([]App{testApp}), RequestTimeout: timeout})
	defer s.Close()
	_, url, stop := startFront(t, s)
	defer stop()
	plain := httptest.NewServer(s.Handler())
	defer plain.Close()
	for _, base := range []string{url, plain.URL} {
		for _, method := range []string{"GET", "POST"} {
			path := "/api/v1/objects/app_test/t/k/n"
			if method == "POST" {
				path += "/increment"
			}
			req, _ := http.NewRequest(method, base+path, nil)
			req.Header.Set("X-App-Key", testApp.Key)
			req.Header.Set("X-App-Secret", testApp.Secret)
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took := time.Since(start)
			// At most a second more than the timeout, and the machine's slack.
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "timed out") ||
				took < timeout || took > timeout+time.Second+3*time.Second {
				t.Fatalf("%s %s: %d %s after %v", method, base, resp.StatusCode, body, took)
			}
		}
	}
}

// TestFront_PipelinesAsTheMux writes random runs of requests, fast routes
// and others, with bodies of every framing (none, small, over 8 KiB,
// chunked), all at once on one connection to the Front and on another to
// net/http alone, and compares the replies one by one: a hand-off in the
// middle of a run must lose or repeat no byte of the requests after it.
func TestFront_PipelinesAsTheMux(t *testing.T) {
	fs := newFrontServer(t, nil)
	rng := rand.New(rand.NewPCG(7, 11))
	body := func(n int) string { return `{"value":"` + strings.Repeat("z", n) + `"}` }
	request := func(side string, i int) string {
		obj := "/api/v1/objects/app_test/pipe/" + side
		switch rng.IntN(7) {
		case 0:
			return "POST " + obj + "/n/increment HTTP/1.1\r\nHost: x\r\n" + authHeader + "Content-Length: 0\r\n\r\n"
		case 1:
			b := `{"by":` + fmt.Sprint(i) + `}`
			return "POST " + obj + "/n/increment HTTP/1.1\r\nHost: x\r\n" + authHeader + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(b)) + b
		case 2:
			b := body(rng.IntN(3) * 6000) // 0, 6 KB (fast) or 12 KB (handed off)
			return "PUT " + obj + "/v HTTP/1.1\r\nHost: x\r\n" + authHeader + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(b)) + b
		case 3:
			b := body(100 + rng.IntN(100))
			return "PUT " + obj + "/c HTTP/1.1\r\nHost: x\r\n" + authHeader + "Transfer-Encoding: chunked\r\n\r\n" +
				fmt.Sprintf("%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", 5, b[:5], len(b)-5, b[5:])
		case 4:
			return "GET " + obj + "/v HTTP/1.1\r\nHost: x\r\n" + authHeader + "\r\n"
		case 5:
			return "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
		default:
			return "GET " + obj + "/log?after=0&limit=2 HTTP/1.1\r\nHost: x\r\n" + authHeader + "\r\n"
		}
	}
	for run := 0; run < 20; run++ {
		n := 1 + rng.IntN(12)
		seed := rng.Uint64()
		var replies [2][]string
		for s, side := range []string{"front", "plain"} {
			rng = rand.New(rand.NewPCG(seed, uint64(run))) // the same requests on both sides
			var all strings.Builder
			for i := range n {
				all.WriteString(request(fmt.Sprintf("%s-%d", side, run), i))
			}
			url := fs.url
			if side == "plain" {
				url = fs.plain
			}
			rc := dialRaw(t, url)
			rc.send(all.String())
			for range n {
				resp, b := rc.read()
				var m map[string]any
				if json.Unmarshal([]byte(b), &m) == nil {
					delete(m, "request_id")
				}
				replies[s] = append(replies[s], fmt.Sprintf("%d %v", resp.StatusCode, m))
			}
		}
		if !slices.Equal(replies[0], replies[1]) {
			t.Fatalf("run %d: the Front replied\n%q\nnet/http alone\n%q", run, replies[0], replies[1])
		}
	}
	if fs.front.served.Load() == 0 || fs.front.handedOff.Load() == 0 {
		t.Fatalf("served %d, handed off %d: the runs should take both ways", fs.front.served.Load(), fs.front.handedOff.Load())
	}
}

// TestFront_OddHeadersAsTheMux: requests with unusual but valid header
// fields (any case, repeated, empty, tabs, a folded line) get the replies
// net/http alone gives, whether the Front serves them or hands them off.
func TestFront_OddHeadersAsTheMux(t *testing.T) {
	fs := newFrontServer(t, nil)
	odd := []string{
		"x-app-key: " + testApp.Key + "\r\nx-app-secret: " + testApp.Secret + "\r\n",
		"X-APP-KEY: " + testApp.Key + "\r\nX-App-Secret:\t" + testApp.Secret + "\t\r\n",
		authHeader + "X-Empty:\r\nX-Twice: 1\r\nX-Twice: 2\r\n",
		authHeader + "Idempotency-Key: a\r\nIdempotency-Key: b\r\n",
		authHeader + "X-Folded: one\r\n two\r\n",
		"X-App-Key: " + testApp.Key + "\r\n", // no secret
		authHeader + "Expect: 100-continue\r\n",
		authHeader + "Connection: keep-alive\r\n",
	}
	for i, h := range odd {
		var replies [2][]string
		for s, base := range []string{fs.url, fs.plain} {
			obj := fmt.Sprintf("/api/v1/objects/app_test/odd/k%d-%d", i, s)
			reqs := "POST " + obj + "/n/increment HTTP/1.1\r\nHost: x\r\n" + h + "Content-Length: 0\r\n\r\n" +
				"GET " + obj + "/log HTTP/1.1\r\nHost: x\r\n" + h + "\r\n" +
				"GET " + obj + "/n HTTP/1.1\r\nHost: x\r\n" + h + "\r\n"
			rc := dialRaw(t, base)
			rc.send(reqs)
			for range 3 {
				resp, b := rc.read()
				var m map[string]any
				if json.Unmarshal([]byte(strings.ReplaceAll(b, fmt.Sprintf("k%d-%d", i, s), "K")), &m) == nil {
					delete(m, "request_id")
				}
				replies[s] = append(replies[s], fmt.Sprintf("%d %v", resp.StatusCode, m))
			}
		}
		if !slices.Equal(replies[0], replies[1]) {
			t.Errorf("headers %q: the Front replied\n%q\nnet/http alone\n%q", h, replies[0], replies[1])
		}
	}
}

// TestFront_BodiesInFlightOnFastRoutes: a fast route's body counts against
// MaxBodyBytesInFlight as on the mux: while one write holds its body, the
// next write with a body gets 503 with retryAfterMs, served on fasthttp.
func TestFront_BodiesInFlightOnFastRoutes(t *testing.T) {
	node := &blockingNode{entered: make(chan struct{}, 4), release: make(chan struct{})}
	node.ready.Store(true)
	s := New(Config{Node: node, Apps: NewApps([]App{testApp}), MaxBodyBytesInFlight: 4 << 10})
	defer s.Close()
	f, url, stop := startFront(t, s)
	defer stop()
	body := `{"value":"` + strings.Repeat("x", 3<<10) + `"}` // two pass 4 KiB; each under 8 KiB
	put := "PUT /api/v1/objects/app_test/t/k/v HTTP/1.1\r\nHost: x\r\n" + authHeader +
		fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)) + body
	first := dialRaw(t, url)
	first.send(put)
	<-node.entered // the first write holds its body
	second := dialRaw(t, url)
	second.send(put)
	resp, b := second.read()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(b, "retryAfterMs") {
		t.Fatalf("a second write past the bound: %d %s", resp.StatusCode, b)
	}
	close(node.release)
	if resp, b := first.read(); resp.StatusCode != http.StatusOK {
		t.Fatalf("the first write: %d %s", resp.StatusCode, b)
	}
	second.send(put)
	if resp, b := second.read(); resp.StatusCode != http.StatusOK {
		t.Fatalf("a write once the first finished: %d %s", resp.StatusCode, b)
	}
	if f.served.Load() != 3 || f.handedOff.Load() != 0 {
		t.Fatalf("served %d, handed off %d: want all three on fasthttp", f.served.Load(), f.handedOff.Load())
	}
}
