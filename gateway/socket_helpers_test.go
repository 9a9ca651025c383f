package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// wsClient is a minimal Phoenix Channels v2 client for Go tests: it sends frames
// as given and reads every frame the server sends, so tests can check refs,
// order and payloads exactly. The JavaScript acceptance suite (jstest/) drives the
// official phoenix client.
type wsClient struct {
	t      *testing.T
	conn   *websocket.Conn
	ref    atomic.Int64
	frames chan wsFrame // read by a goroutine: a Read whose ctx ends closes the conn
	err    error        // why frames was closed
}

// wsFrame is a server frame.
type wsFrame struct {
	JoinRef *string
	Ref     *string
	Topic   string
	Event   string
	Payload json.RawMessage
}

func (f wsFrame) String() string {
	s := func(p *string) string {
		if p == nil {
			return "null"
		}
		return *p
	}
	return fmt.Sprintf("[%s %s %s %s %s]", s(f.JoinRef), s(f.Ref), f.Topic, f.Event, f.Payload)
}

func (f wsFrame) payload(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(f.Payload, &m); err != nil {
		t.Fatalf("payload of %v: %v", f, err)
	}
	return m
}

func (ts *testServer) wsURL(query string) string {
	return "ws" + strings.TrimPrefix(ts.url, "http") + "/socket/websocket" + query
}

// dial connects as testApp with vsn 2.0.0.
func (ts *testServer) dial(t *testing.T) *wsClient {
	t.Helper()
	return ts.dialURL(t, ts.wsURL("?app_key="+testApp.Key+"&vsn=2.0.0"))
}

func (ts *testServer) dialURL(t *testing.T, url string) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"phoenix"}})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (HTTP %d)", url, err, status)
	}
	conn.SetReadLimit(64 << 20)
	c := &wsClient{t: t, conn: conn, frames: make(chan wsFrame, 100000)}
	go c.readLoop()
	t.Cleanup(func() { conn.CloseNow() })
	return c
}

func (c *wsClient) readLoop() {
	defer close(c.frames)
	for {
		f, err := c.readFrame()
		if err != nil {
			c.err = err
			return
		}
		c.frames <- f
	}
}

// dialStatus tries to connect and returns the HTTP status of the refusal (or 101).
func (ts *testServer) dialStatus(t *testing.T, query string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, ts.wsURL(query), nil)
	if err == nil {
		conn.CloseNow()
		return http.StatusSwitchingProtocols
	}
	if resp == nil {
		t.Fatalf("dial: %v", err)
	}
	return resp.StatusCode
}

// send sends [joinRef, ref, topic, event, payload] and returns ref. joinRef ""
// sends null.
func (c *wsClient) send(joinRef, topic, event string, payload any) string {
	c.t.Helper()
	ref := fmt.Sprint(c.ref.Add(1) + 100) // never "1": refs are echoed, not assumed
	var jr any
	if joinRef != "" {
		jr = joinRef
	}
	c.sendRaw([]any{jr, ref, topic, event, payload})
	return ref
}

func (c *wsClient) sendRaw(v any) {
	c.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// join sends a phx_join whose join_ref is also its ref, and returns it.
func (c *wsClient) join(topic string, params map[string]any) string {
	c.t.Helper()
	ref := fmt.Sprint(c.ref.Add(1) + 100)
	c.sendRaw([]any{ref, ref, topic, "phx_join", params})
	return ref
}

// read returns the next frame, failing the test after 10s.
func (c *wsClient) read() wsFrame {
	c.t.Helper()
	f, err := c.tryRead(10 * time.Second)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return f
}

func (c *wsClient) tryRead(d time.Duration) (wsFrame, error) {
	select {
	case f, ok := <-c.frames:
		if !ok {
			return wsFrame{}, c.err
		}
		return f, nil
	case <-time.After(d):
		return wsFrame{}, fmt.Errorf("no frame within %v", d)
	}
}

// closed waits until the server closes the socket and returns the close error.
func (c *wsClient) closed(d time.Duration) error {
	deadline := time.After(d)
	for {
		select {
		case _, ok := <-c.frames:
			if !ok {
				return c.err
			}
		case <-deadline:
			return nil
		}
	}
}

func (c *wsClient) readFrame() (wsFrame, error) {
	typ, b, err := c.conn.Read(context.Background())
	if err != nil {
		return wsFrame{}, err
	}
	if typ != websocket.MessageText {
		return wsFrame{}, fmt.Errorf("binary frame from the server")
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(b, &parts); err != nil || len(parts) != 5 {
		return wsFrame{}, fmt.Errorf("frame %s is not a 5-element array", b)
	}
	var f wsFrame
	for i, dst := range []any{&f.JoinRef, &f.Ref, &f.Topic, &f.Event} {
		if err := json.Unmarshal(parts[i], dst); err != nil {
			return wsFrame{}, fmt.Errorf("frame %s element %d: %v", b, i, err)
		}
	}
	f.Payload = parts[4]
	return f, nil
}

// joinOK joins topic, expects the ok reply and the snapshot, and returns the
// join's ref.
func (c *wsClient) joinOK(topic string, params map[string]any) string {
	c.t.Helper()
	ref := c.join(topic, params)
	c.expectReply(topic, ref, "ok")
	if f := c.read(); f.Event != "snapshot" || f.Topic != topic {
		c.t.Fatalf("after joining %s: %v, want the snapshot", topic, f)
	}
	return ref
}

// expectReply reads the next frame and checks that it is the phx_reply to ref
// with status; it returns the response.
func (c *wsClient) expectReply(topic, ref, status string) map[string]any {
	c.t.Helper()
	f := c.read()
	if f.Event != "phx_reply" || f.Topic != topic || f.Ref == nil || *f.Ref != ref {
		c.t.Fatalf("got %v, want the phx_reply to ref %s on %s", f, ref, topic)
	}
	p := f.payload(c.t)
	if p["status"] != status {
		c.t.Fatalf("reply %v: status %v, want %s", f, p["status"], status)
	}
	resp, _ := p["response"].(map[string]any)
	return resp
}

// expectJoinError joins topic with params and checks the refusal reason.
func (c *wsClient) expectJoinError(topic string, params map[string]any, reason string) {
	c.t.Helper()
	ref := c.join(topic, params)
	resp := c.expectReply(topic, ref, "error")
	if resp["reason"] != reason {
		c.t.Fatalf("join %s with %v: reason %q, want %q", topic, params, resp["reason"], reason)
	}
}

// noFrame checks that nothing arrives within d.
func (c *wsClient) noFrame(d time.Duration) {
	c.t.Helper()
	if f, err := c.tryRead(d); err == nil {
		c.t.Fatalf("unexpected frame %v", f)
	}
}

func topicOf(typ, key string) string { return "durable:" + testApp.Key + ":" + typ + ":" + key }

func secretParams() map[string]any { return map[string]any{"app_secret": testApp.Secret} }
