package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"

	hfclient "github.com/holdfast/holdfast/client"
	"github.com/spf13/cobra"
)

// alarmCommand is `holdfast alarm`: an object's durable named alarms.
func alarmCommand() *cobra.Command {
	cmd, o := clientGroup("alarm", "Schedule, read and delete an object's durable alarms (TYPE/KEY)")
	cmd.AddCommand(alarmSet(o), alarmGet(o), alarmList(o), alarmDelete(o))
	completeObjects(cmd, o, hfclient.ListObjects)
	return cmd
}

type alarmInfo struct {
	Name      string          `json:"name"`
	At        int64           `json:"at"`
	Action    json.RawMessage `json:"action"`
	Status    string          `json:"status"`
	Attempt   int             `json:"attempt"`
	LastError string          `json:"lastError"`
}

func (a alarmInfo) print(w io.Writer) {
	fmt.Fprintf(w, "%s %s at %s attempt %d", a.Name, a.Status, msTime(a.At), a.Attempt)
	if len(a.Action) > 0 {
		fmt.Fprintf(w, " action %s", compact(a.Action))
	}
	if a.LastError != "" {
		fmt.Fprintf(w, " last error: %s", a.LastError)
	}
	fmt.Fprintln(w)
}

func alarmSet(o *clientOpts) *cobra.Command {
	var (
		at     string
		in     time.Duration
		action string
	)
	cmd := &cobra.Command{
		Use:   "set TYPE/KEY NAME (--at TIME | --in DURATION) --action JSON",
		Short: "Schedule an alarm (replacing the name's pending one)",
		Long: `Schedule the alarm NAME and print "NAME at TIME generation N". --at is an RFC 3339
time or unix milliseconds; --in is a duration from now. --action is the JSON
action run when it fires:
  {"kind": "trim"}                                   run the object's log trim
  {"kind": "enqueue", "topic": "t", "payload": ...}  put a message on its queue`,
		Args: usageArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (at == "") == (in == 0) {
				return fmt.Errorf("usage: %s: give --at or --in", cmd.UseLine())
			}
			ms, err := alarmTime(at, in)
			if err != nil {
				return err
			}
			body := map[string]any{"at": ms}
			if action != "" {
				a, err := parseJSONArg("--action", action)
				if err != nil {
					return err
				}
				body["action"] = a
			}
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var r struct {
				Name       string `json:"name"`
				At         int64  `json:"at"`
				Generation uint64 `json:"generation"`
			}
			b, err := c.call(cmd.Context(), "PUT", c.path("alarms", ref, args[1]), nil, body, &r)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s at %s generation %d\n", r.Name, msTime(r.At), r.Generation)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&at, "at", "", "when: RFC 3339 (2030-01-02T15:04:05Z) or unix milliseconds")
	f.DurationVar(&in, "in", 0, "when: this long from now")
	f.StringVar(&action, "action", "", `what it does, as JSON: {"kind":"trim"} or {"kind":"enqueue","topic":...,"payload":...}`)
	return cmd
}

// alarmTime turns --at or --in into unix milliseconds.
func alarmTime(at string, in time.Duration) (int64, error) {
	if at == "" {
		return time.Now().Add(in).UnixMilli(), nil
	}
	if ms, err := strconv.ParseInt(at, 10, 64); err == nil {
		return ms, nil
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return 0, errors.New("--at " + strconv.Quote(at) + ": want RFC 3339 (2030-01-02T15:04:05Z) or unix milliseconds")
	}
	return t.UnixMilli(), nil
}

func alarmGet(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "get TYPE/KEY NAME",
		Short: "Show an alarm (HTTP 404 if the name has none)",
		Args:  usageArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var a alarmInfo
			b, err := c.call(cmd.Context(), "GET", c.path("alarms", ref, args[1]), nil, nil, &a)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			a.print(cmd.OutOrStdout())
			return nil
		},
	}
}

func alarmList(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "list TYPE/KEY",
		Short: "List the object's alarms, soonest first",
		Long: `List every alarm of the object, soonest first, following the server's pages
(each one at most 1,000 alarms or about 1 MiB). With --json, one {"alarms":[...]}
document holding them all.`,
		Args: usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var all []json.RawMessage // --json: kept as the server wrote them
			q := url.Values{}
			for {
				var r struct {
					Alarms []json.RawMessage `json:"alarms"`
					Next   string            `json:"next"`
				}
				if _, err := c.call(cmd.Context(), "GET", c.path("alarms", ref)+"/", q, nil, &r); err != nil {
					return err
				}
				for _, raw := range r.Alarms {
					if o.json {
						all = append(all, raw)
						continue
					}
					var a alarmInfo
					if err := json.Unmarshal(raw, &a); err != nil {
						return fmt.Errorf("the server's reply is not what was expected: %w", err)
					}
					a.print(cmd.OutOrStdout())
				}
				if r.Next == "" {
					break
				}
				q.Set("after", r.Next)
			}
			if o.json {
				return printValue(cmd.OutOrStdout(), map[string][]json.RawMessage{"alarms": append([]json.RawMessage{}, all...)})
			}
			return nil
		},
	}
}

func alarmDelete(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "delete TYPE/KEY NAME",
		Short: "Delete an alarm, pending or failed (HTTP 404 if none)",
		Args:  usageArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			if _, err := c.call(cmd.Context(), "DELETE", c.path("alarms", ref, args[1]), nil, nil, nil); err != nil {
				return err
			}
			if o.json {
				return printValue(cmd.OutOrStdout(), map[string]string{"deleted": args[1]})
			}
			fmt.Fprintln(cmd.OutOrStdout(), "deleted", args[1])
			return nil
		},
	}
}
