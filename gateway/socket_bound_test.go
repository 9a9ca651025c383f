package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/holdfast/holdfast/cluster"
)

// Issue 26, point 2: every frame owed to a websocket counts against its buffer,
// and replays are paged as the socket drains. The tests read the socket's
// counters (sockStats), not the heap.

// rawSocket is a websocket client that reads only when told to: a slow reader.
type rawSocket struct {
	t    *testing.T
	conn *websocket.Conn
}

func (ts *testServer) dialRaw(t *testing.T) *rawSocket {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, ts.wsURL("?app_key="+testApp.Key+"&vsn=2.0.0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadLimit(64 << 20)
	t.Cleanup(func() { conn.CloseNow() })
	return &rawSocket{t: t, conn: conn}
}

func (c *rawSocket) join(ref, topic string, params map[string]any) {
	c.t.Helper()
	b, _ := json.Marshal([]any{ref, ref, topic, "phx_join", params})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		c.t.Fatal(err)
	}
}

// read returns the next frame; an error once the socket is closed.
func (c *rawSocket) read() (wsFrame, error) { return c.readWithin(20 * time.Second) }

func (c *rawSocket) readWithin(d time.Duration) (wsFrame, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, b, err := c.conn.Read(ctx)
	if err != nil {
		return wsFrame{}, err
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(b, &parts); err != nil || len(parts) != 5 {
		return wsFrame{}, fmt.Errorf("frame %.100s is not a 5-element array", b)
	}
	var f wsFrame
	for i, dst := range []any{&f.JoinRef, &f.Ref, &f.Topic, &f.Event} {
		if err := json.Unmarshal(parts[i], dst); err != nil {
			return wsFrame{}, err
		}
	}
	f.Payload = parts[4]
	return f, nil
}

func frameLogID(t *testing.T, f wsFrame) int {
	t.Helper()
	var p struct {
		LogID int `json:"log_id"`
	}
	if err := json.Unmarshal(f.Payload, &p); err != nil {
		t.Fatalf("%.200v: %v", f, err)
	}
	return p.LogID
}

// TestSocket_RejoinsOfABigObjectStayWithinTheBuffer: a client that does not read
// joins an object of 4 x 512 KiB slots 20 times. Its snapshots (2 MiB each,
// four times the buffer) are not piled up in its queue: what it is owed behind
// the frame being written never exceeds the buffer, and the last join's
// snapshot still arrives once it reads.
func TestSocket_RejoinsOfABigObjectStayWithinTheBuffer(t *testing.T) {
	const buffer = 512 << 10
	ts := newTestServerWith(t, cluster.Config{}, func(c *Config) { c.SocketBuffer = buffer })
	base := "/api/v1/objects/app_test/order/big"
	value := strings.Repeat("x", 512<<10-64)
	for i := 0; i < 4; i++ {
		if r := ts.do("PUT", fmt.Sprintf("%s/s%d", base, i), map[string]any{"value": value}, nil); r.status != 200 {
			t.Fatalf("write: %d %s", r.status, r.body)
		}
	}
	topic := topicOf("order", "big")
	c := ts.dialRaw(t)
	const joins = 20
	for i := 1; i <= joins; i++ {
		c.join(fmt.Sprint("j", i), topic, secretParams())
	}
	last := fmt.Sprint("j", joins)
	gotReply, snapshots := false, 0
	for {
		f, err := c.read()
		if err != nil {
			if s := websocket.CloseStatus(err); s != websocket.StatusTryAgainLater {
				t.Fatalf("read: %v", err)
			}
			t.Log("closed as a slow consumer") // also within the bound
			break
		}
		if f.Event == "snapshot" {
			snapshots++
		}
		if f.Event == "phx_reply" && f.Ref != nil && *f.Ref == last {
			gotReply = true
		}
		if gotReply && f.Event == "snapshot" && f.JoinRef != nil && *f.JoinRef == last {
			break
		}
	}
	peak := ts.gw.sockStats.peakQueued.Load()
	t.Logf("peak owed behind the head frame: %d bytes (buffer %d); %d snapshots read", peak, buffer, snapshots)
	if peak > buffer {
		t.Fatalf("the socket was owed %d bytes behind the frame being written, over its buffer of %d", peak, buffer)
	}
}

// writeLog makes n change-log entries of size bytes each on order/o1.
func writeLog(t *testing.T, ts *testServer, n, size int) {
	t.Helper()
	value := strings.Repeat("v", size)
	for i := 1; i <= n; i++ {
		if r := ts.do("PUT", "/api/v1/objects/app_test/order/o1/s", map[string]any{"value": value}, nil); r.status != 200 {
			t.Fatalf("write %d: %d %s", i, r.status, r.body)
		}
	}
}

// TestSocket_ReplayIsPagedAsTheReaderDrains: a replay of a change log 12 times
// the buffer, to a reader that reads slowly, arrives whole and in order, in
// several pages, and the socket is never owed more than its buffer.
func TestSocket_ReplayIsPagedAsTheReaderDrains(t *testing.T) {
	const buffer = 64 << 10
	ts := newTestServerWith(t, cluster.Config{}, func(c *Config) { c.SocketBuffer = buffer })
	const entries = 200
	writeLog(t, ts, entries, 4<<10) // 800 KiB of log
	c := ts.dialRaw(t)
	topic := topicOf("order", "o1")
	c.join("r1", topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": 0})
	next := 1
	for {
		f, err := c.read()
		if err != nil {
			t.Fatalf("after log_id %d: %v", next-1, err)
		}
		if f.Event == "phx_reply" {
			continue
		}
		if f.Event == "snapshot" {
			break
		}
		if f.Event != "change" || frameLogID(t, f) != next {
			t.Fatalf("%.120v, want the replay's change %d", f, next)
		}
		next++
		if next%10 == 0 {
			time.Sleep(time.Millisecond) // a slow reader
		}
	}
	if next != entries+1 {
		t.Fatalf("replayed up to %d, want %d", next-1, entries)
	}
	peak, pages := ts.gw.sockStats.peakQueued.Load(), ts.gw.sockStats.replayPages.Load()
	t.Logf("peak owed %d bytes (buffer %d); %d replay pages", peak, buffer, pages)
	if peak > buffer {
		t.Fatalf("the socket was owed %d bytes behind the frame being written, over its buffer of %d", peak, buffer)
	}
	if pages < 4 {
		t.Fatalf("%d replay pages: the replay was not paged", pages)
	}
}

// TestSocket_LiveEventsDuringAPagedReplayComeOnceAfterIt: writes made while a
// channel's replay is held back by a reader that does not read reach it once,
// in order: each log_id once, as a replay item before the snapshot (the replay
// runs on to the snapshot's log_id) or as a live event after it.
func TestSocket_LiveEventsDuringAPagedReplayComeOnceAfterIt(t *testing.T) {
	const buffer = 64 << 10
	ts := newTestServerWith(t, cluster.Config{}, func(c *Config) { c.SocketBuffer = buffer })
	// 12 MiB of log: more than loopback's socket buffers hold, so that the
	// replay is still going when the writes below are made.
	const entries = 400
	writeLog(t, ts, entries, 32<<10)
	c := ts.dialRaw(t)
	topic := topicOf("order", "o1")
	c.join("r1", topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": 0})
	// The join is served once the socket owes something.
	waitFor(t, "the replay to start", func() bool { return ts.gw.sockStats.replayPages.Load() > 0 })
	const writes = 30
	for i := 1; i <= writes; i++ {
		if r := ts.do("PUT", "/api/v1/objects/app_test/order/o1/n", map[string]any{"value": i}, nil); r.status != 200 {
			t.Fatalf("write %d: %d %s", i, r.status, r.body)
		}
	}
	if ts.gw.sockStats.stashed.Load() == 0 {
		t.Fatal("no live event came during the replay: the test proves nothing")
	}
	next, snap := 1, 0
	for next <= entries+writes || snap == 0 {
		f, err := c.read()
		if err != nil {
			t.Fatalf("after log_id %d: %v", next-1, err)
		}
		switch f.Event {
		case "phx_reply":
			continue
		case "snapshot":
			if snap != 0 {
				t.Fatalf("a second snapshot")
			}
			snap = frameLogID(t, f)
			if snap != next-1 {
				t.Fatalf("snapshot at %d after the replay's %d", snap, next-1)
			}
			continue
		case "change":
			if id := frameLogID(t, f); id != next {
				t.Fatalf("change %d, want %d (snapshot at %d)", id, next, snap)
			}
			live := strings.Contains(string(f.Payload), `"previous"`)
			if live != (snap != 0) {
				t.Fatalf("change %d: live %v, snapshot at %d", next, live, snap)
			}
			next++
		default:
			t.Fatalf("%.120v", f)
		}
	}
	if snap < entries {
		t.Fatalf("snapshot at %d, before the replay's end %d", snap, entries)
	}
	if f, err := c.readWithin(100 * time.Millisecond); err == nil {
		t.Fatalf("after the last write: %.120v", f) // nothing is repeated
	}
}
