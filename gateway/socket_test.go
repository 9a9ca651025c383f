package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
)

func TestSocket_ConnectChecksBeforeTheUpgrade(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	for _, q := range []string{
		"?app_key=" + testApp.Key,                   // no vsn
		"?app_key=" + testApp.Key + "&vsn=1.0.0",    // V1 frames
		"?app_key=" + testApp.Key + "&vsn=3.0.0",    // unknown
		"?app_key=" + testApp.Key + "&vsn=",         // empty
		"?app_key=pk_nobody&vsn=2.0.0",              // unknown app
		"?vsn=2.0.0",                                // no app key
		"?app_key=" + testApp.Secret + "&vsn=2.0.0", // a secret is not a key
	} {
		if got := ts.dialStatus(t, q); got != http.StatusForbidden {
			t.Errorf("connect %s: HTTP %d, want 403", q, got)
		}
	}
	if got := ts.dialStatus(t, "?app_key="+testApp.Key+"&vsn=2.0.0"); got != http.StatusSwitchingProtocols {
		t.Fatalf("a good connect got HTTP %d", got)
	}
	c := ts.dial(t)
	if got := c.conn.Subprotocol(); got != "phoenix" {
		t.Fatalf("subprotocol %q, want the offered phoenix echoed", got)
	}
}

func TestSocket_HeartbeatIsAnswered(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	c := ts.dial(t)
	ref := c.send("", "phoenix", "heartbeat", map[string]any{})
	f := c.read()
	if f.JoinRef != nil || f.Ref == nil || *f.Ref != ref || f.Topic != "phoenix" || f.Event != "phx_reply" ||
		string(f.Payload) != `{"response":{},"status":"ok"}` {
		t.Fatalf("heartbeat reply %v", f)
	}
}

func TestSocket_SilentSocketIsClosedAndHeartbeatsKeepItOpen(t *testing.T) {
	ts := newTestServerWith(t, cluster.Config{}, func(c *Config) { c.SocketIdleTimeout = time.Second })
	alive := ts.dial(t)
	silent := ts.dial(t)
	for i := 0; i < 12; i++ { // 2.4 s of heartbeats, every 200 ms
		ref := alive.send("", "phoenix", "heartbeat", map[string]any{})
		alive.expectReply("phoenix", ref, "ok")
		time.Sleep(200 * time.Millisecond)
	}
	err := silent.closed(5 * time.Second)
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("silent socket: %v, want closed with 1008", err)
	}
	ref := alive.send("", "phoenix", "heartbeat", map[string]any{})
	alive.expectReply("phoenix", ref, "ok")
}

func TestSocket_JoinErrorReasons(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	c := ts.dial(t)
	topic := topicOf("order", "o1")
	c.expectJoinError(topic, map[string]any{}, "auth required for durable object channels")
	c.expectJoinError(topic, nil, "auth required for durable object channels")
	c.expectJoinError(topic, map[string]any{"app_secret": testApp.Secret, "auth": "x"}, "exactly one of auth or app_secret is required")
	c.expectJoinError(topic, map[string]any{"app_secret": "sk_wrong"}, "invalid app_secret")
	c.expectJoinError(topic, map[string]any{"app_secret": otherApp.Secret}, "invalid app_secret")
	c.expectJoinError(topic, map[string]any{"auth": "not-a-jwt"}, "invalid token")
	for _, bad := range []string{
		"durable:" + otherApp.Key + ":order:o1", // another app's key
		"durable:pk_nobody:order:o1",
		"durable:" + testApp.Key + "::o1",
		"durable:" + testApp.Key + ":order:",
		"durable::order:o1",
		"durable:" + testApp.Key + ":order",
		"durable:" + testApp.Key,
	} {
		c.expectJoinError(bad, secretParams(), "invalid topic format")
	}
	c.expectJoinError("room:lobby", secretParams(), "unmatched topic")
	c.expectJoinError(topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": "3"}, "after_log_id must be a non-negative integer")
	c.expectJoinError(topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": -1}, "after_log_id must be a non-negative integer")
	c.expectJoinError(topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": 1.5}, "after_log_id must be a non-negative integer")
	// None of that joined anything or created the object.
	if st := ts.state("order", "o1"); st.LogID != 0 {
		t.Fatalf("log_id %d after refused joins", st.LogID)
	}
	// The socket still works.
	ref := c.join(topic, secretParams())
	c.expectReply(topic, ref, "ok")
}

func TestSocket_KeyMayContainColons(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	ts.do("PUT", "/api/v1/objects/app_test/order/a:b:c/s", map[string]any{"value": 1}, nil)
	c := ts.dial(t)
	topic := "durable:" + testApp.Key + ":order:a:b:c"
	ref := c.join(topic, secretParams())
	c.expectReply(topic, ref, "ok")
	snap := c.read()
	if snap.Event != "snapshot" || string(snap.Payload) != `{"state":{"s":1},"log_id":1}` {
		t.Fatalf("snapshot %v", snap)
	}
}

// TestSocket_JoinReplyThenSnapshotThenLiveEvents checks the order after a join
// and the exact shape of every live event.
func TestSocket_JoinReplyThenSnapshotThenLiveEvents(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	base := "/api/v1/objects/app_test/order/o1"
	ts.do("PUT", base+"/status", map[string]any{"value": "new"}, nil)
	ts.do("PUT", base+"/n", map[string]any{"value": 2}, nil)

	c := ts.dial(t)
	topic := topicOf("order", "o1")
	ref := c.join(topic, secretParams())
	resp := c.expectReply(topic, ref, "ok")
	if id, _ := resp["socket_id"].(string); id == "" {
		t.Fatalf("join reply %v has no socket_id", resp)
	}
	snap := c.read()
	if snap.Event != "snapshot" || snap.Topic != topic || snap.JoinRef == nil || *snap.JoinRef != ref {
		t.Fatalf("after the join reply: %v, want the snapshot on the join's join_ref", snap)
	}
	if string(snap.Payload) != `{"state":{"n":2,"status":"new"},"log_id":2}` {
		t.Fatalf("snapshot %s", snap.Payload)
	}

	live := func(want string) {
		t.Helper()
		f := c.read()
		if f.Topic != topic || f.JoinRef == nil || *f.JoinRef != ref || f.Ref != nil {
			t.Fatalf("live frame %v: want the join_ref %s and a null ref", f, ref)
		}
		if got := f.Event + " " + string(f.Payload); got != want {
			t.Fatalf("live event\n got %s\nwant %s", got, want)
		}
	}
	ts.do("PUT", base+"/status", map[string]any{"value": "shipped"}, nil)
	live(`change {"key":"status","value":"shipped","previous":"new","log_id":3}`)
	ts.do("POST", base+"/n/increment", map[string]any{"by": 3}, nil)
	live(`change {"key":"n","value":5,"previous":2,"log_id":4}`)
	ts.do("POST", base+"/tags/append", map[string]any{"value": "a"}, nil)
	live(`change {"key":"tags","value":["a"],"previous":null,"log_id":5}`)
	ts.do("PATCH", base, map[string]any{"status": "delivered"}, nil)
	live(`batch {"changes":[{"key":"status","value":"delivered","previous":"shipped"}],"log_id":6}`)
	ts.do("POST", base+"/transaction", []map[string]any{
		{"op": "increment", "key": "n", "by": 1}, {"op": "set", "key": "x", "value": true}, {"op": "increment", "key": "n", "by": 1},
	}, nil)
	live(`batch {"changes":[{"key":"n","value":7,"previous":5},{"key":"x","value":true,"previous":null}],"log_id":7}`)
	ts.do("DELETE", base+"/x", nil, nil)
	live(`change {"key":"x","value":null,"previous":true,"log_id":8}`)
	// Writes that change nothing send nothing and take no log_id.
	ts.do("DELETE", base+"/missing", nil, nil)
	ts.do("PATCH", base, map[string]any{}, nil)
	ts.do("DELETE", base, nil, nil)
	live(`batch {"changes":[{"key":"n","value":null,"previous":7},{"key":"status","value":null,"previous":"delivered"},{"key":"tags","value":null,"previous":["a"]}],"log_id":9}`)
	ts.do("DELETE", base, nil, nil) // a purge of an empty object is still an entry
	live(`batch {"changes":[],"log_id":10}`)
	// A refused write sends nothing.
	ts.do("POST", base+"/status/increment", map[string]any{"by": "x"}, nil)
	c.noFrame(200 * time.Millisecond)
}

func TestSocket_ReplayAfterLogIDThenSnapshot(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	base := "/api/v1/objects/app_test/order/o1"
	for i := 1; i <= 5; i++ {
		ts.do("PUT", base+"/s", map[string]any{"value": i}, nil)
	}
	ts.do("PATCH", base, map[string]any{"a": 1, "b": 2}, nil) // log_id 6, two items
	c := ts.dial(t)
	topic := topicOf("order", "o1")
	ref := c.join(topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": 3})
	c.expectReply(topic, ref, "ok")
	want := []string{
		`{"key":"s","value":4,"log_id":4}`,
		`{"key":"s","value":5,"log_id":5}`,
		`{"key":"a","value":1,"log_id":6}`,
		`{"key":"b","value":2,"log_id":6}`,
	}
	for _, w := range want {
		f := c.read()
		if f.Event != "change" || f.JoinRef == nil || *f.JoinRef != ref || string(f.Payload) != w {
			t.Fatalf("replay frame %v, want change %s on the join_ref", f, w)
		}
	}
	if f := c.read(); f.Event != "snapshot" || !strings.HasSuffix(string(f.Payload), `"log_id":6}`) {
		t.Fatalf("after the replay: %v, want the snapshot at 6", f)
	}
	// Resuming at the head replays nothing.
	c2 := ts.dial(t)
	ref = c2.join(topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": 6})
	c2.expectReply(topic, ref, "ok")
	if f := c2.read(); f.Event != "snapshot" {
		t.Fatalf("after_log_id 6: %v, want the snapshot at once", f)
	}
	// Beyond it is a log_id the object never issued (issue 26): log_truncated.
	c4 := ts.dial(t)
	ref = c4.join(topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": 60})
	c4.expectReply(topic, ref, "ok")
	if f := c4.read(); f.Event != "log_truncated" || string(f.Payload) != `{"after_log_id":60,"oldest_log_id":1}` {
		t.Fatalf("after_log_id 60: %v, want log_truncated", f)
	}
	if f := c4.read(); f.Event != "snapshot" {
		t.Fatalf("after_log_id 60: %v, want the snapshot after log_truncated", f)
	}
	// after_log_id 0 replays everything retained.
	c3 := ts.dial(t)
	ref = c3.join(topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": 0})
	c3.expectReply(topic, ref, "ok")
	for i := 0; i < 7; i++ {
		if f := c3.read(); f.Event != "change" {
			t.Fatalf("replay item %d: %v", i, f)
		}
	}
	if f := c3.read(); f.Event != "snapshot" {
		t.Fatalf("%v, want the snapshot", f)
	}
}

func TestSocket_LogTruncatedInsteadOfReplay(t *testing.T) {
	ts := newTestServer(t, cluster.Config{TypeOptions: func(string) actors.TypeOptions {
		return actors.TypeOptions{ChangeLogEntries: 3}
	}})
	base := "/api/v1/objects/app_test/order/o1"
	for i := 1; i <= 6; i++ {
		ts.do("PUT", base+"/s", map[string]any{"value": i}, nil)
	}
	c := ts.dial(t)
	topic := topicOf("order", "o1")
	ref := c.join(topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": 1})
	c.expectReply(topic, ref, "ok")
	f := c.read()
	if f.Event != "log_truncated" || f.JoinRef == nil || *f.JoinRef != ref || string(f.Payload) != `{"after_log_id":1,"oldest_log_id":4}` {
		t.Fatalf("%v, want log_truncated {after 1, oldest 4}", f)
	}
	if f := c.read(); f.Event != "snapshot" || string(f.Payload) != `{"state":{"s":6},"log_id":6}` {
		t.Fatalf("%v, want the snapshot", f)
	}
	// after_log_id 3 is just inside what is retained: a replay.
	c2 := ts.dial(t)
	ref = c2.join(topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": 3})
	c2.expectReply(topic, ref, "ok")
	for _, w := range []string{`{"key":"s","value":4,"log_id":4}`, `{"key":"s","value":5,"log_id":5}`, `{"key":"s","value":6,"log_id":6}`} {
		if f := c2.read(); f.Event != "change" || string(f.Payload) != w {
			t.Fatalf("%v, want change %s", f, w)
		}
	}
}

func TestSocket_PushesAreRefusedAndTheChannelStaysJoined(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	c := ts.dial(t)
	topic := topicOf("order", "o1")
	jr := c.joinOK(topic, secretParams())
	ref := c.send(jr, topic, "set", map[string]any{"key": "a", "value": 1})
	if r := c.expectReply(topic, ref, "error"); r["reason"] != "read-only channel" {
		t.Fatalf("push reply %v", r)
	}
	// A Phoenix binary push: kind 0, then the sizes of join_ref, ref, topic, event.
	bin := []byte{0, byte(len(jr)), 2, byte(len(topic)), 3}
	bin = append(bin, jr...)
	bin = append(bin, "77"...)
	bin = append(bin, topic...)
	bin = append(bin, "set"...)
	bin = append(bin, 1, 2, 3)
	if err := c.conn.Write(context.Background(), websocket.MessageBinary, bin); err != nil {
		t.Fatal(err)
	}
	if r := c.expectReply(topic, "77", "error"); r["reason"] != "read-only channel" {
		t.Fatalf("binary push reply %v", r)
	}
	// Malformed frames are ignored; a push on a topic never joined is unmatched.
	if err := c.conn.Write(context.Background(), websocket.MessageText, []byte(`{"not":"a frame"}`)); err != nil {
		t.Fatal(err)
	}
	ref = c.send("", "durable:"+testApp.Key+":order:other", "set", map[string]any{})
	if r := c.expectReply("durable:"+testApp.Key+":order:other", ref, "error"); r["reason"] != "unmatched topic" {
		t.Fatalf("push on an unjoined topic: %v", r)
	}
	// Still joined: live events arrive, and nothing was written by the pushes.
	r := ts.do("PUT", "/api/v1/objects/app_test/order/o1/a", map[string]any{"value": 2}, nil)
	if r.status != 200 || string(r.body) != "{\"log_id\":1}\n" {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	if f := c.read(); f.Event != "change" || !strings.Contains(string(f.Payload), `"log_id":1`) {
		t.Fatalf("%v, want the live change", f)
	}
}

func TestSocket_LeaveRepliesThenClosesAndStopsEvents(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	c := ts.dial(t)
	topic := topicOf("order", "o1")
	jr := c.joinOK(topic, secretParams())
	ref := c.send(jr, topic, "phx_leave", map[string]any{})
	c.expectReply(topic, ref, "ok")
	f := c.read()
	if f.Event != "phx_close" || f.JoinRef == nil || *f.JoinRef != jr {
		t.Fatalf("%v, want phx_close on the join_ref", f)
	}
	ts.do("PUT", "/api/v1/objects/app_test/order/o1/a", map[string]any{"value": 1}, nil)
	c.noFrame(200 * time.Millisecond)
	// A push after leaving is unmatched.
	ref = c.send(jr, topic, "set", map[string]any{})
	if r := c.expectReply(topic, ref, "error"); r["reason"] != "unmatched topic" {
		t.Fatalf("push after leave: %v", r)
	}
}

func TestSocket_SecondJoinClosesTheFirst(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	c := ts.dial(t)
	topic := topicOf("order", "o1")
	first := c.joinOK(topic, secretParams())
	second := c.join(topic, secretParams())
	f := c.read()
	if f.Event != "phx_close" || f.JoinRef == nil || *f.JoinRef != first {
		t.Fatalf("%v, want phx_close of the first join", f)
	}
	c.expectReply(topic, second, "ok")
	if f := c.read(); f.Event != "snapshot" || *f.JoinRef != second {
		t.Fatalf("%v, want the second join's snapshot", f)
	}
	ts.do("PUT", "/api/v1/objects/app_test/order/o1/a", map[string]any{"value": 1}, nil)
	if f := c.read(); f.Event != "change" || *f.JoinRef != second {
		t.Fatalf("%v, want one change on the second join", f)
	}
	c.noFrame(200 * time.Millisecond) // not twice
}

func TestSocket_SocketTopicGivesTheSocketID(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	c := ts.dial(t)
	ref := c.join("socket", nil)
	resp := c.expectReply("socket", ref, "ok")
	id, _ := resp["socket_id"].(string)
	if id == "" {
		t.Fatalf("socket join reply %v", resp)
	}
	topic := topicOf("order", "o1")
	jr := c.join(topic, secretParams())
	if resp := c.expectReply(topic, jr, "ok"); resp["socket_id"] != id {
		t.Fatalf("durable join socket_id %v, socket topic said %s", resp["socket_id"], id)
	}
	other := ts.dial(t)
	ref = other.join("socket", nil)
	if resp := other.expectReply("socket", ref, "ok"); resp["socket_id"] == id {
		t.Fatal("two sockets share an id")
	}
}

func TestSocket_AtMost100Channels(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	c := ts.dial(t)
	for i := 0; i < 100; i++ {
		topic := topicOf("order", fmt.Sprint("o", i))
		c.joinOK(topic, secretParams())
	}
	c.expectJoinError(topicOf("order", "o100"), secretParams(), "too many channels joined")
	c.expectJoinError("socket", nil, "too many channels joined")
	// Rejoining a joined topic is not a new channel.
	topic := topicOf("order", "o5")
	ref := c.join(topic, secretParams())
	if f := c.read(); f.Event != "phx_close" {
		t.Fatalf("%v, want phx_close", f)
	}
	c.expectReply(topic, ref, "ok")
	c.read()
	// Leaving one makes room.
	ref = c.send(ref, topic, "phx_leave", nil)
	c.expectReply(topic, ref, "ok")
	c.read() // phx_close
	topic = topicOf("order", "o100")
	ref = c.join(topic, secretParams())
	c.expectReply(topic, ref, "ok")
}

func TestSocket_RunEventsAreRelayedNotStored(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	base := "/api/v1/objects/app_test/thread/t1"
	ts.do("PUT", base+"/title", map[string]any{"value": "hi"}, nil)
	c := ts.dial(t)
	topic := topicOf("thread", "t1")
	jr := c.joinOK(topic, secretParams())
	r := ts.do("POST", base+"/events", map[string]any{"event": "run:start", "payload": map[string]any{"run_id": "r1"}}, nil)
	if r.status != http.StatusAccepted || string(r.body) != "{\"subscribers\":1}\n" {
		t.Fatalf("publish: %d %s", r.status, r.body)
	}
	f := c.read()
	if f.Event != "run:start" || string(f.Payload) != `{"run_id":"r1"}` || f.Ref != nil || f.JoinRef == nil || *f.JoinRef != jr {
		t.Fatalf("%v, want the relayed run:start", f)
	}
	r = ts.do("POST", base+"/events", map[string]any{"event": "run:end"}, nil)
	if f := c.read(); r.status != http.StatusAccepted || f.Event != "run:end" || string(f.Payload) != `{}` {
		t.Fatalf("run:end without payload: %d, frame %v", r.status, f)
	}
	for _, bad := range []struct {
		body   string
		status int
	}{
		{`{"event":"start"}`, 422},
		{`{"event":"run:"}`, 422},
		{`{"event":"run:has space"}`, 422},
		{`{"event":"run:` + strings.Repeat("x", 61) + `"}`, 422},
		{`{"event":"change"}`, 422},
		{`{"payload":{}}`, 400},
		{`{"event":1}`, 400},
		{`{"event":"run:x","extra":1}`, 400},
		{`not json`, 400},
	} {
		if r := ts.do("POST", base+"/events", bad.body, nil); r.status != bad.status {
			t.Errorf("publish %s: %d %s, want %d", bad.body, r.status, r.body, bad.status)
		}
	}
	if r := ts.do("POST", base+"/events", `{"event":"run:x"}`, map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": "bad"}); r.status != 401 {
		t.Errorf("publish without the secret: %d", r.status)
	}
	c.noFrame(200 * time.Millisecond)
	if st := ts.state("thread", "t1"); st.LogID != 1 {
		t.Fatalf("log_id %d: run events must not be stored", st.LogID)
	}
	r = ts.do("GET", base+"/log", nil, nil)
	var page struct{ Items []any }
	_ = json.Unmarshal(r.body, &page)
	if len(page.Items) != 1 {
		t.Fatalf("log %s", r.body)
	}
}

// TestSocket_SlowSubscriberIsClosedWithoutSlowingOthers: a socket that stops
// reading falls past its buffer and is closed; writers and a reading subscriber
// go on; the slow client resumes with after_log_id and misses nothing.
func TestSocket_SlowSubscriberIsClosedWithoutSlowingOthers(t *testing.T) {
	// Each change event carries the new and the previous 16 KiB value (32 KiB): the
	// buffer leaves the reading subscriber room for a few in flight.
	ts := newTestServerWith(t, cluster.Config{}, func(c *Config) { c.SocketBuffer = 256 << 10 })
	topic := topicOf("order", "o1")
	base := "/api/v1/objects/app_test/order/o1"

	// The slow client reads its join frames, then stops reading.
	ctx := context.Background()
	slow, _, err := websocket.Dial(ctx, ts.wsURL("?app_key="+testApp.Key+"&vsn=2.0.0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.CloseNow()
	b, _ := json.Marshal([]any{"1", "1", topic, "phx_join", secretParams()})
	if err := slow.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // reply, snapshot
		if _, _, err := slow.Read(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fast := ts.dial(t)
	jr := fast.joinOK(topic, secretParams())

	value := strings.Repeat("v", 16<<10)
	const writes = 1000 // 16 MiB of events: more than loopback's socket buffers
	for i := 1; i <= writes; i++ {
		if r := ts.do("PUT", base+"/s", map[string]any{"value": fmt.Sprint(i, value)}, nil); r.status != 200 {
			t.Fatalf("write %d: %d %s", i, r.status, r.body)
		}
		f := fast.read()
		if f.Event != "change" || !strings.HasSuffix(string(f.Payload), fmt.Sprintf(`"log_id":%d}`, i)) {
			t.Fatalf("fast subscriber, write %d: %s", i, f.Event)
		}
	}
	waitFor(t, "the slow socket to be closed", func() bool { return ts.gw.Sockets() == 1 })

	// The slow client's connection ends; it reconnects and resumes.
	var last int
	for {
		_, data, err := slow.Read(ctx)
		if err != nil {
			if s := websocket.CloseStatus(err); s != -1 && s != websocket.StatusTryAgainLater {
				t.Fatalf("slow socket closed with %v, want 1013", s)
			}
			break
		}
		var parts []json.RawMessage
		_ = json.Unmarshal(data, &parts)
		var p struct {
			LogID int `json:"log_id"`
		}
		_ = json.Unmarshal(parts[4], &p)
		if p.LogID != last+1 {
			t.Fatalf("slow client got log_id %d after %d", p.LogID, last)
		}
		last = p.LogID
	}
	if last >= writes {
		t.Fatalf("the slow client got all %d events: the test did not overflow its buffer", last)
	}
	again := ts.dial(t)
	jr = again.join(topic, map[string]any{"app_secret": testApp.Secret, "after_log_id": last})
	again.expectReply(topic, jr, "ok")
	for i := last + 1; i <= writes; i++ {
		f := again.read()
		if f.Event != "change" || !strings.HasSuffix(string(f.Payload), fmt.Sprintf(`"log_id":%d}`, i)) {
			t.Fatalf("resumed replay: %s, want log_id %d", f.Event, i)
		}
	}
	if f := again.read(); f.Event != "snapshot" {
		t.Fatalf("%v, want the snapshot", f.Event)
	}
}

// TestSocket_ClosingASocketUnsubscribes: once its last subscriber's socket is
// gone, an object passivates again.
func TestSocket_ClosingASocketUnsubscribes(t *testing.T) {
	ts := newTestServer(t, cluster.Config{IdleTimeout: 200 * time.Millisecond})
	c := ts.dial(t)
	topic := topicOf("order", "o1")
	c.joinOK(topic, secretParams())
	time.Sleep(600 * time.Millisecond)
	if n := ts.node.Stats().ActiveObjects; n != 1 {
		t.Fatalf("%d active objects: a subscribed object must stay active", n)
	}
	ts.do("PUT", "/api/v1/objects/app_test/order/o1/a", map[string]any{"value": 1}, nil)
	if f := c.read(); f.Event != "change" {
		t.Fatalf("%v", f)
	}
	c.conn.Close(websocket.StatusNormalClosure, "")
	waitFor(t, "the object to passivate", func() bool { return ts.node.Stats().ActiveObjects == 0 })
}

func TestSocket_CloseEndsEverySocket(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	c := ts.dial(t)
	topic := topicOf("order", "o1")
	c.joinOK(topic, secretParams())
	ts.gw.Close()
	if err := c.closed(10 * time.Second); websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("after Close: %v, want 1001", err)
	}
	if got := ts.dialStatus(t, "?app_key="+testApp.Key+"&vsn=2.0.0"); got == http.StatusSwitchingProtocols {
		// Accepted by HTTP, then closed at once.
		t.Log("a socket opened after Close is closed at once")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
