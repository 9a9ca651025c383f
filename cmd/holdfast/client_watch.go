package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
)

// heartbeatEvery is how often watch sends a Phoenix heartbeat; the server
// closes a socket silent for 60s.
const heartbeatEvery = 30 * time.Second

func objectWatch(o *clientOpts) *cobra.Command {
	var (
		count   int
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "watch TYPE/KEY",
		Short: "Follow an object's live feed and print each change",
		Long: `Join the object's channel on the websocket feed (with the App Secret), print its
snapshot, then one line per change as it commits: "LOG_ID SLOT = VALUE", or
"LOG_ID SLOT deleted"; a multi-slot write (patch, transaction, purge) is one line
of comma-separated changes. With --json each event's payload is printed as one
line of JSON (snapshot: {"state","log_id"}; change: {"key","value","previous",
"log_id"}; batch: {"changes","log_id"}).

A dropped connection or a channel error is rejoined after the last log_id seen,
so no change is missed or printed twice. Runs until interrupted (Ctrl-C), until
--count changes were printed, or for --timeout (an error if --count changes did
not come by then).`,
		Args: usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			if count < 0 {
				return errors.New("--count cannot be negative")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			runCtx := ctx
			if timeout > 0 {
				var cancel context.CancelFunc
				runCtx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			w := &watcher{c: c, ref: ref, out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr(), json: o.json, count: count,
				topic: "durable:" + c.key + ":" + ref.typ + ":" + ref.key}
			err = w.run(runCtx)
			switch {
			case errors.Is(err, errWatchDone):
				return nil
			case err != nil && runCtx.Err() == nil:
				return err
			case ctx.Err() != nil: // interrupted
				return nil
			case runCtx.Err() != nil && count > 0:
				return fmt.Errorf("--timeout %v: %d of %d changes came", timeout, w.seen, count)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&count, "count", 0, "exit after this many changes (0: no limit)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "stop watching after this long (0: no limit)")
	return cmd
}

var errWatchDone = errors.New("watch: --count changes seen")

// watcher follows one object's channel across reconnections.
type watcher struct {
	c           *client
	ref         objectRef
	topic       string
	out, errOut io.Writer
	json        bool
	count       int // stop after this many changes; 0: never

	seen          int    // changes printed
	lastLogID     uint64 // the last log_id seen (snapshot or change)
	synced        bool   // a snapshot was received: lastLogID is meaningful
	printNextSnap bool   // print the next snapshot (the first, or after log_truncated)
	everJoined    bool
	refSeq        int // the last frame ref sent
	// resuming is set when the feed was lost after a join (a dropped
	// connection or a phx_error): one line said so, and the next successful
	// join prints one line saying it is back. Nothing in between (issue 26).
	resuming bool
}

// fatalWatchError ends watch without reconnecting.
type fatalWatchError struct{ err error }

func (e *fatalWatchError) Error() string { return e.err.Error() }
func (e *fatalWatchError) Unwrap() error { return e.err }

// run follows the feed until ctx ends, count changes were seen, or a fatal
// error. A lost connection is retried with backoff once a join succeeded.
func (w *watcher) run(ctx context.Context) error {
	w.printNextSnap = true
	backoff := 250 * time.Millisecond
	for {
		err := w.session(ctx)
		var fatal *fatalWatchError
		if errors.Is(err, errWatchDone) || errors.As(err, &fatal) || ctx.Err() != nil {
			return err
		}
		if !w.everJoined {
			return err
		}
		w.lost("the connection was lost; reconnecting")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// wsURL is the feed's address on the node the client talks to.
func (w *watcher) wsURL() string {
	u := *w.c.base
	u.Scheme = map[string]string{"http": "ws", "https": "wss"}[u.Scheme]
	u.Path = strings.TrimSuffix(u.Path, "/") + "/socket/websocket"
	u.RawPath = ""
	u.RawQuery = url.Values{"vsn": {"2.0.0"}, "app_key": {w.c.key}}.Encode()
	return u.String()
}

// session runs one websocket connection: join, then read events.
func (w *watcher) session(ctx context.Context) error {
	conn, resp, err := websocket.Dial(ctx, w.wsURL(), nil)
	if err != nil {
		if resp != nil && resp.StatusCode != 101 {
			b, _ := io.ReadAll(resp.Body)
			return &fatalWatchError{decodeServerError(resp.StatusCode, resp.Header, b)}
		}
		return fmt.Errorf("connect to %s: %w", w.c.base.Redacted(), err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(64 << 20) // a snapshot holds up to 16 MiB of state, escaped
	// The heartbeat is the session's: it ends and is waited for when the
	// session returns (before the deferred CloseNow, which runs later).
	hbCtx, stopHB := context.WithCancel(ctx)
	hbDone := make(chan struct{})
	go func() { defer close(hbDone); w.heartbeat(hbCtx, conn) }()
	defer func() { stopHB(); <-hbDone }()
	joinRef, err := w.join(ctx, conn)
	if err != nil {
		return err
	}
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			return fmt.Errorf("connection lost: %w", err)
		}
		var f []json.RawMessage
		if json.Unmarshal(data, &f) != nil || len(f) != 5 {
			continue
		}
		var topic, event, ref, frameJoin string
		_ = json.Unmarshal(f[0], &frameJoin)
		_ = json.Unmarshal(f[2], &topic)
		_ = json.Unmarshal(f[3], &event)
		_ = json.Unmarshal(f[1], &ref)
		if topic != w.topic {
			continue // heartbeat replies
		}
		if frameJoin != "" && frameJoin != joinRef {
			// A frame of an earlier join of this topic: after a phx_error the
			// rejoin replaces it, and the server closes it (phx_close on the
			// old join_ref). phoenix.js ignores such frames; so does watch.
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
			_ = json.Unmarshal(f[4], &r)
			if r.Status != "ok" {
				return &fatalWatchError{fmt.Errorf("join %s/%s refused: %s", w.ref.typ, w.ref.key, r.Response.Reason)}
			}
			w.everJoined = true
			if w.resuming {
				w.resuming = false
				fmt.Fprintf(w.errOut, "holdfast: watch: reconnected; resuming after log_id %d\n", w.lastLogID)
			}
		case "phx_error": // the object dropped the subscription (it moved or restarted): join again
			w.lost("the object's channel was interrupted (it moved or restarted); rejoining")
			if joinRef, err = w.join(ctx, conn); err != nil {
				return err
			}
		case "phx_close":
			return &fatalWatchError{errors.New("the server closed the channel")}
		case "log_truncated":
			fmt.Fprintf(w.errOut, "holdfast: watch: changes were compacted away while disconnected (%s); the next snapshot is the current state\n", compact(f[4]))
			w.printNextSnap = true
		default:
			if err := w.event(event, f[4]); err != nil {
				return err
			}
		}
	}
}

// lost says once that the feed was lost and is being resumed; later failures
// before the feed is back print nothing (their causes change nothing for the
// user, and a server down for a minute would fill the screen).
func (w *watcher) lost(what string) {
	if !w.resuming {
		w.resuming = true
		fmt.Fprintf(w.errOut, "holdfast: watch: %s\n", what)
	}
}

// join sends a phx_join (resuming after the last log_id seen) and returns its ref.
func (w *watcher) join(ctx context.Context, conn *websocket.Conn) (string, error) {
	params := map[string]any{"app_secret": w.c.secret}
	if w.synced {
		params["after_log_id"] = w.lastLogID
	}
	ref := w.nextRef()
	if err := w.send(ctx, conn, ref, ref, w.topic, "phx_join", params); err != nil {
		return "", fmt.Errorf("join: %w", err)
	}
	return ref, nil
}

func (w *watcher) nextRef() string {
	w.refSeq++
	return strconv.Itoa(w.refSeq)
}

func (w *watcher) send(ctx context.Context, conn *websocket.Conn, joinRef, ref any, topic, event string, payload any) error {
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
func (w *watcher) heartbeat(ctx context.Context, conn *websocket.Conn) {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if w.send(ctx, conn, nil, "hb-"+strconv.Itoa(n), "phoenix", "heartbeat", struct{}{}) != nil {
				return
			}
		}
	}
}

type feedChange struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

// event prints a snapshot, change or batch; it returns errWatchDone once count
// changes were printed.
func (w *watcher) event(name string, payload json.RawMessage) error {
	var ev struct {
		State   map[string]json.RawMessage `json:"state"`
		Changes []feedChange               `json:"changes"`
		LogID   uint64                     `json:"log_id"`
		feedChange
	}
	if err := json.Unmarshal(payload, &ev); err != nil {
		return nil // not an event of ours (a future kind): skip
	}
	switch name {
	case "snapshot":
		w.lastLogID, w.synced = ev.LogID, true
		if !w.printNextSnap {
			return nil
		}
		w.printNextSnap = false
		if w.json {
			return printJSON(w.out, payload)
		}
		fmt.Fprintf(w.out, "snapshot log_id %d\n", ev.LogID)
		printSlots(w.out, "  ", ev.State)
		return nil
	case "change", "batch":
		if w.synced && ev.LogID <= w.lastLogID {
			return nil // seen before a reconnection
		}
		w.lastLogID = ev.LogID
		if name == "change" {
			ev.Changes = []feedChange{ev.feedChange}
		}
		if w.json {
			if err := printJSON(w.out, payload); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(w.out, "%d %s\n", ev.LogID, describeChanges(ev.Changes))
		}
		w.seen++
		if w.count > 0 && w.seen >= w.count {
			return errWatchDone
		}
	}
	return nil // other events (run:*) are not changes
}

func describeChanges(cs []feedChange) string {
	if len(cs) == 0 {
		return "(no changes)"
	}
	parts := make([]string, len(cs))
	for i, c := range cs {
		if len(c.Value) == 0 || string(c.Value) == "null" {
			parts[i] = c.Key + " deleted"
		} else {
			parts[i] = c.Key + " = " + compact(c.Value)
		}
	}
	return strings.Join(parts, ", ")
}
