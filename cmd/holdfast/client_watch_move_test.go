package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	hfclient "github.com/holdfast/holdfast/client"
)

// fakeFeed is one scripted Phoenix socket: each step either reads a frame
// (checked by want) or writes one.
type feedStep struct {
	read  func(t *testing.T, f []json.RawMessage) // nil: write
	write []any
}

// serveFeed runs steps on the first websocket accepted, then holds the
// connection open until the test ends.
func serveFeed(t *testing.T, steps []feedStep) *httptest.Server {
	t.Helper()
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		defer conn.CloseNow()
		ctx := r.Context()
		for _, s := range steps {
			if s.read == nil {
				b, _ := json.Marshal(s.write)
				if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
					t.Errorf("write %s: %v", b, err)
					return
				}
				continue
			}
			for {
				_, b, err := conn.Read(ctx)
				if err != nil {
					t.Errorf("read: %v", err)
					return
				}
				var f []json.RawMessage
				if json.Unmarshal(b, &f) != nil || len(f) != 5 {
					t.Errorf("frame %s", b)
					return
				}
				if strings.Contains(string(f[3]), "heartbeat") {
					continue
				}
				s.read(t, f)
				break
			}
		}
		select {
		case <-done:
		case <-ctx.Done():
		}
	}))
	t.Cleanup(func() { close(done); srv.Close() })
	return srv
}

// When an object's partition moves, the server sends phx_error on the join;
// watch joins again, and the server closes the old join with phx_close on its
// join_ref. That frame belongs to a join watch has left: it is ignored (as
// phoenix.js does), and watch goes on. It used to exit with "the server closed
// the channel" (issue 26). Stderr has one line for the interruption and one
// for the resumption, and no Go error chain.
func TestWatch_IgnoresFramesOfAStaleJoinAcrossAMove(t *testing.T) {
	const topic = "durable:pk_k:order:o1"
	joinWith := func(ref string, after any) feedStep {
		return feedStep{read: func(t *testing.T, f []json.RawMessage) {
			var jr, ev string
			var p map[string]any
			_ = json.Unmarshal(f[0], &jr)
			_ = json.Unmarshal(f[3], &ev)
			_ = json.Unmarshal(f[4], &p)
			if jr != ref || ev != "phx_join" || p["after_log_id"] != after {
				t.Errorf("got %s %s %v, want phx_join with join_ref %s and after_log_id %v", jr, ev, p, ref, after)
			}
		}}
	}
	w := func(frame ...any) feedStep { return feedStep{write: frame} }
	srv := serveFeed(t, []feedStep{
		joinWith("1", nil),
		w("1", "1", topic, "phx_reply", map[string]any{"status": "ok", "response": map[string]any{}}),
		w("1", nil, topic, "snapshot", map[string]any{"state": map[string]any{"a": 1}, "log_id": 1}),
		w("1", nil, topic, "change", map[string]any{"key": "a", "value": 2, "previous": 1, "log_id": 2}),
		// The partition moved: the object drops the subscription.
		w("1", "1", topic, "phx_error", map[string]any{}),
		joinWith("2", float64(2)),
		// The rejoin replaces the old join, which the server closes.
		w("1", "1", topic, "phx_close", map[string]any{}),
		w("2", "2", topic, "phx_reply", map[string]any{"status": "ok", "response": map[string]any{}}),
		w("2", nil, topic, "snapshot", map[string]any{"state": map[string]any{"a": 2}, "log_id": 2}),
		w("2", nil, topic, "change", map[string]any{"key": "a", "value": 3, "previous": 2, "log_id": 3}),
	})
	base, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	lib, err := hfclient.New(srv.URL, "pk_k", "sk_s")
	if err != nil {
		t.Fatal(err)
	}
	wt := &watcher{c: &client{lib: lib, base: base, key: "pk_k", secret: "sk_s"}, ref: objectRef{typ: "order", key: "o1"},
		out: &out, errOut: &errOut, count: 2}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := wt.run(ctx); !errors.Is(err, errWatchDone) {
		t.Fatalf("watch ended with %v, want --count changes seen\nstdout: %s\nstderr: %s", err, out.String(), errOut.String())
	}
	if want := "snapshot log_id 1\n  a = 1\n2 a = 2\n3 a = 3\n"; out.String() != want {
		t.Fatalf("stdout %q, want %q", out.String(), want)
	}
	if want := "holdfast: watch: the object's channel was interrupted (it moved or restarted); rejoining\n" +
		"holdfast: watch: reconnected; resuming after log_id 2\n"; errOut.String() != want {
		t.Fatalf("stderr %q, want %q", errOut.String(), want)
	}
}
