package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// The live feed (spec/objects.md, "Live feed"): an object's channel on the
// node's websocket, Phoenix Channels v2, joined with the App Secret.

// heartbeatEvery is how often a feed sends a Phoenix heartbeat; the server
// closes a socket silent for 60s.
const heartbeatEvery = 30 * time.Second

// Event is one event of a live feed.
type Event struct {
	// Kind is "snapshot" (State and LogID: the first, and the one after a
	// "truncated"), "change" or "batch" (Changes and LogID: one write, in
	// log_id order, each once), "truncated" (the changes after the last
	// log_id seen were compacted away while the feed was lost; the next
	// snapshot is the current state), "lost" (the connection or the channel
	// was lost, Err says how; the feed rejoins after the last log_id seen),
	// "resumed" (joined again, after LogID), or an ephemeral event's name
	// (run:...) with its Payload.
	Kind    string
	LogID   uint64
	State   map[string]json.RawMessage
	Changes []FeedChange
	// Payload is the event's payload as the server sent it.
	Payload json.RawMessage
	Err     error
}

// FeedChange is one slot's change: its new value (null: deleted) and the
// previous one.
type FeedChange struct {
	Key      string          `json:"key"`
	Value    json.RawMessage `json:"value"`
	Previous json.RawMessage `json:"previous,omitempty"`
}

// Feed follows one object's live feed across reconnections: a dropped
// connection or a channel error (the object moved or restarted) is rejoined
// after the last log_id seen, so that no change is missed or delivered twice.
// Its events arrive on C, which closes when the feed ends: Close, the
// context given to Watch, or an error that a rejoin cannot repair (the first
// join refused or failing, the server closing the channel); Err says which.
type Feed struct {
	// C delivers the events; a consumer that falls far behind makes the
	// server close the socket, and the feed resumes from the last log_id.
	C <-chan Event

	c      *Client
	obj    *Object
	topic  string
	out    chan Event
	cancel context.CancelFunc
	done   chan struct{}
	err    error

	lastLogID     uint64
	synced        bool // a snapshot came: lastLogID is meaningful
	sendNextSnap  bool // deliver the next snapshot (the first, or after truncated)
	everJoined    bool
	resuming      bool // a "lost" was delivered; the next join delivers "resumed"
	refSeq        int
	heartbeatEach time.Duration
}

// Watch joins the object's live feed and follows it until ctx ends or Close.
func (o *Object) Watch(ctx context.Context) *Feed {
	ctx, cancel := context.WithCancel(ctx)
	f := &Feed{c: o.c, obj: o, topic: "durable:" + o.c.key + ":" + o.typ + ":" + o.key, out: make(chan Event, 64),
		cancel: cancel, done: make(chan struct{}), sendNextSnap: true, heartbeatEach: heartbeatEvery}
	f.C = f.out
	go func() {
		defer close(f.done)
		defer close(f.out)
		f.err = f.run(ctx)
	}()
	return f
}

// Close ends the feed and waits for its goroutine; C closes.
func (f *Feed) Close() {
	f.cancel()
	for range f.out { // drain what was on its way
	}
	<-f.done
}

// Err is why the feed ended (nil for Close or its context), once C closed.
func (f *Feed) Err() error {
	select {
	case <-f.done:
		return f.err
	default:
		return nil
	}
}

// errFeedFatal marks an error a rejoin cannot repair.
type errFeedFatal struct{ err error }

func (e *errFeedFatal) Error() string { return e.err.Error() }
func (e *errFeedFatal) Unwrap() error { return e.err }

func (f *Feed) run(ctx context.Context) error {
	backoff := 250 * time.Millisecond
	for {
		err := f.session(ctx)
		var fatal *errFeedFatal
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &fatal):
			return fatal.err
		case !f.everJoined:
			return err
		}
		if !f.lost(ctx, fmt.Errorf("the connection was lost; reconnecting: %w", err)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// emit delivers ev unless ctx ended first.
func (f *Feed) emit(ctx context.Context, ev Event) bool {
	select {
	case f.out <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// lost delivers one "lost" event per loss (later failures before the feed is
// back say nothing new).
func (f *Feed) lost(ctx context.Context, err error) bool {
	if f.resuming {
		return true
	}
	f.resuming = true
	return f.emit(ctx, Event{Kind: "lost", LogID: f.lastLogID, Err: err})
}

// wsURL is the feed's address on the node the client talks to.
func (f *Feed) wsURL() string {
	u := *f.c.base
	u.Scheme = map[string]string{"http": "ws", "https": "wss"}[u.Scheme]
	u.Path = strings.TrimSuffix(u.Path, "/") + "/socket/websocket"
	u.RawPath = ""
	u.RawQuery = url.Values{"vsn": {"2.0.0"}, "app_key": {f.c.key}}.Encode()
	return u.String()
}

// session runs one websocket connection: join, then read events.
func (f *Feed) session(ctx context.Context) error {
	conn, resp, err := websocket.Dial(ctx, f.wsURL(), &websocket.DialOptions{HTTPClient: f.c.http})
	if err != nil {
		if resp != nil && resp.StatusCode != 101 {
			b, _ := io.ReadAll(resp.Body)
			return &errFeedFatal{decodeError(resp.StatusCode, resp.Header, b)}
		}
		return fmt.Errorf("connect to %s: %w", f.c.base.Redacted(), err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(64 << 20) // a snapshot holds up to 16 MiB of state, escaped
	// The heartbeat is the session's: it ends and is waited for when the
	// session returns (before the deferred CloseNow, which runs later).
	hbCtx, stopHB := context.WithCancel(ctx)
	hbDone := make(chan struct{})
	go func() { defer close(hbDone); f.heartbeat(hbCtx, conn) }()
	defer func() { stopHB(); <-hbDone }()
	joinRef, err := f.join(ctx, conn)
	if err != nil {
		return err
	}
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			return fmt.Errorf("connection lost: %w", err)
		}
		var fr []json.RawMessage
		if json.Unmarshal(data, &fr) != nil || len(fr) != 5 {
			continue
		}
		var topic, event, ref, frameJoin string
		_ = json.Unmarshal(fr[0], &frameJoin)
		_ = json.Unmarshal(fr[2], &topic)
		_ = json.Unmarshal(fr[3], &event)
		_ = json.Unmarshal(fr[1], &ref)
		if topic != f.topic {
			continue // heartbeat replies
		}
		if frameJoin != "" && frameJoin != joinRef {
			// A frame of an earlier join of this topic: after a phx_error the
			// rejoin replaces it, and the server closes it (phx_close on the
			// old join_ref). phoenix.js ignores such frames; so does a Feed.
			continue
		}
		switch event {
		case "phx_reply":
			if ref != joinRef {
				continue
			}
			var r struct {
				Status   string `json:"status"`
				Response struct {
					Reason string `json:"reason"`
				} `json:"response"`
			}
			_ = json.Unmarshal(fr[4], &r)
			if r.Status != "ok" {
				return &errFeedFatal{fmt.Errorf("join %s/%s refused: %s", f.obj.typ, f.obj.key, r.Response.Reason)}
			}
			f.everJoined = true
			if f.resuming {
				f.resuming = false
				if !f.emit(ctx, Event{Kind: "resumed", LogID: f.lastLogID}) {
					return ctx.Err()
				}
			}
		case "phx_error": // the object dropped the subscription (it moved or restarted): join again
			if !f.lost(ctx, errors.New("the object's channel was interrupted (it moved or restarted); rejoining")) {
				return ctx.Err()
			}
			if joinRef, err = f.join(ctx, conn); err != nil {
				return err
			}
		case "phx_close":
			return &errFeedFatal{errors.New("the server closed the channel")}
		case "log_truncated":
			f.sendNextSnap = true
			if !f.emit(ctx, Event{Kind: "truncated", LogID: f.lastLogID, Payload: fr[4]}) {
				return ctx.Err()
			}
		default:
			if ev, ok := f.event(event, fr[4]); ok && !f.emit(ctx, ev) {
				return ctx.Err()
			}
		}
	}
}

// join sends a phx_join (resuming after the last log_id seen) and returns its ref.
func (f *Feed) join(ctx context.Context, conn *websocket.Conn) (string, error) {
	params := map[string]any{"app_secret": f.c.secret}
	if f.synced {
		params["after_log_id"] = f.lastLogID
	}
	f.refSeq++
	ref := strconv.Itoa(f.refSeq)
	if err := send(ctx, conn, ref, ref, f.topic, "phx_join", params); err != nil {
		return "", fmt.Errorf("join: %w", err)
	}
	return ref, nil
}

func send(ctx context.Context, conn *websocket.Conn, joinRef, ref any, topic, event string, payload any) error {
	b, err := json.Marshal([]any{joinRef, ref, topic, event, payload})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return conn.Write(wctx, websocket.MessageText, b)
}

// heartbeat keeps the socket open: [null, ref, "phoenix", "heartbeat", {}].
// Its refs are "hb-N", apart from the join refs the reader owns.
func (f *Feed) heartbeat(ctx context.Context, conn *websocket.Conn) {
	t := time.NewTicker(f.heartbeatEach)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if send(ctx, conn, nil, "hb-"+strconv.Itoa(n), "phoenix", "heartbeat", struct{}{}) != nil {
				return
			}
		}
	}
}

// event turns a snapshot, change or batch into an Event, skipping a snapshot
// of a rejoin and a change seen before a reconnection; ok is false for what
// is skipped.
func (f *Feed) event(name string, payload json.RawMessage) (Event, bool) {
	var ev struct {
		State   map[string]json.RawMessage `json:"state"`
		Changes []FeedChange               `json:"changes"`
		LogID   uint64                     `json:"log_id"`
		FeedChange
	}
	switch name {
	case "snapshot", "change", "batch":
		if err := json.Unmarshal(payload, &ev); err != nil {
			return Event{}, false // not an event of ours
		}
	default:
		return Event{Kind: name, Payload: payload}, true // ephemeral events (run:*)
	}
	switch name {
	case "snapshot":
		f.lastLogID, f.synced = ev.LogID, true
		if !f.sendNextSnap {
			return Event{}, false
		}
		f.sendNextSnap = false
		return Event{Kind: name, LogID: ev.LogID, State: ev.State, Payload: payload}, true
	default:
		if f.synced && ev.LogID <= f.lastLogID {
			return Event{}, false // seen before a reconnection
		}
		f.lastLogID = ev.LogID
		if name == "change" {
			ev.Changes = []FeedChange{ev.FeedChange}
		}
		return Event{Kind: name, LogID: ev.LogID, Changes: ev.Changes, Payload: payload}, true
	}
}
