package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	hfclient "github.com/holdfast/holdfast/client"
)

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
of comma-separated changes. With --json each event is one line of JSON,
{"event": NAME, "payload": PAYLOAD} (snapshot: {"state","log_id"}; change:
{"key","value","previous","log_id"}; batch: {"changes","log_id"}).

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
			w := &watcher{c: c, ref: ref, out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr(), json: o.json, count: count}
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

// watcher prints one object's live feed (the client library's Feed, which
// rejoins across reconnections after the last log_id seen).
type watcher struct {
	c           *client
	ref         objectRef
	out, errOut io.Writer
	json        bool
	count       int // stop after this many changes; 0: never

	seen int // changes printed
}

// run follows the feed until ctx ends, count changes were seen, or the feed
// ends with an error.
func (w *watcher) run(ctx context.Context) error {
	feed := w.c.lib.Object(w.ref.typ, w.ref.key).Watch(ctx)
	defer feed.Close()
	for ev := range feed.C {
		if err := w.event(ev); err != nil {
			return err
		}
	}
	if err := feed.Err(); err != nil {
		return err
	}
	return ctx.Err()
}

// event prints a snapshot, change or batch, and the feed's losses and
// resumptions on stderr (one line each: issue 26); it returns errWatchDone
// once count changes were printed.
func (w *watcher) event(ev hfclient.Event) error {
	switch ev.Kind {
	case "lost":
		fmt.Fprintf(w.errOut, "holdfast: watch: %s\n", lostReason(ev.Err))
	case "resumed":
		fmt.Fprintf(w.errOut, "holdfast: watch: reconnected; resuming after log_id %d\n", ev.LogID)
	case "truncated":
		fmt.Fprintf(w.errOut, "holdfast: watch: changes were compacted away while disconnected (%s); the next snapshot is the current state\n", compact(ev.Payload))
	case "snapshot":
		if w.json {
			return printEvent(w.out, ev.Kind, ev.Payload)
		}
		fmt.Fprintf(w.out, "snapshot log_id %d\n", ev.LogID)
		printSlots(w.out, "  ", ev.State)
	case "change", "batch":
		if w.json {
			if err := printEvent(w.out, ev.Kind, ev.Payload); err != nil {
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

// printEvent writes one --json line: {"event": name, "payload": payload},
// the event as the channel carried it.
func printEvent(w io.Writer, name string, payload json.RawMessage) error {
	b, err := json.Marshal(struct {
		Event   string          `json:"event"`
		Payload json.RawMessage `json:"payload"`
	}{name, payload})
	if err != nil {
		return err
	}
	return printJSON(w, b)
}

// lostReason is the first line of a loss: what happened, without the
// transport's detail.
func lostReason(err error) string {
	if err == nil {
		return "the connection was lost; reconnecting"
	}
	msg := err.Error()
	if i := strings.Index(msg, "; reconnecting"); i >= 0 {
		return msg[:i+len("; reconnecting")]
	}
	return msg
}

func describeChanges(cs []hfclient.FeedChange) string {
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
