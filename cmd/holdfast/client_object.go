package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	hfclient "github.com/holdfast/holdfast/client"
)

const valueRule = `A VALUE is JSON: 42, true, {"a": 1}, and a string in JSON quotes ('"shipped"').
With --string the argument is sent as a string as it is (shipped).`

// objectCommand is `holdfast object`: an object's KV state.
func objectCommand() *cobra.Command {
	cmd, o := clientGroup("object", "Read, write and watch an object's KV state (TYPE/KEY)")
	cmd.AddCommand(objectGet(o), objectSet(o), objectIncrement(o), objectAppend(o), objectPatch(o), objectTransaction(o),
		objectDelete(o), objectChanges(o), objectWatch(o), listCommand(o, hfclient.ListObjects, "objects (those that hold any state)"))
	completeObjects(cmd, o, hfclient.ListObjects)
	return cmd
}

func objectGet(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "get TYPE/KEY [SLOT]",
		Short: "Print an object's state, or one slot's value",
		Long: `Print an object's state: its log_id, then one "slot = value" line per slot,
or with SLOT that slot's value as JSON (a missing slot is an error, HTTP 404).`,
		Args: usageArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(args) == 2 {
				var v struct{ Value json.RawMessage }
				b, err := c.call(cmd.Context(), "GET", c.path("objects", ref, args[1]), nil, nil, &v)
				if err != nil {
					return err
				}
				if o.json {
					return printJSON(out, b)
				}
				return printJSON(out, v.Value)
			}
			var st struct {
				State map[string]json.RawMessage `json:"state"`
				LogID uint64                     `json:"log_id"`
			}
			b, err := c.call(cmd.Context(), "GET", c.path("objects", ref), nil, nil, &st)
			if err != nil || o.json {
				return orPrint(out, b, err)
			}
			fmt.Fprintf(out, "log_id %d\n", st.LogID)
			printSlots(out, "", st.State)
			return nil
		},
	}
}

// printSlots writes one "slot = value" line per slot, in order.
func printSlots(w io.Writer, indent string, state map[string]json.RawMessage) {
	for _, k := range sortedKeys(state) {
		fmt.Fprintf(w, "%s%s = %s\n", indent, k, compact(state[k]))
	}
}

func objectSet(o *clientOpts) *cobra.Command {
	return slotValueCommand(o, "set", "Set one slot", "Set one slot and print the object's new log_id.", "PUT", "")
}

// slotValueCommand is a command that writes VALUE to one slot (set, append)
// with method, on the slot's path and then suffix, and prints the new log_id.
func slotValueCommand(o *clientOpts, verb, short, long, method, suffix string) *cobra.Command {
	var asString bool
	cmd := &cobra.Command{
		Use:   verb + " TYPE/KEY SLOT VALUE",
		Short: short,
		Long:  long + "\n\n" + valueRule,
		Args:  usageArgs(3, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			v, err := valueArg(args[2], asString)
			if err != nil {
				return err
			}
			path := c.path("objects", ref, args[1])
			if suffix != "" {
				path = c.path("objects", ref, args[1], suffix)
			}
			b, err := c.call(cmd.Context(), method, path, nil, map[string]json.RawMessage{"value": v}, nil)
			return o.printLogID(cmd.OutOrStdout(), b, err)
		},
	}
	cmd.Flags().BoolVar(&asString, "string", false, "send VALUE as a string, not as JSON")
	return cmd
}

func objectIncrement(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "increment TYPE/KEY SLOT [BY]",
		Short: "Add BY (default 1) to a number slot and print its new value",
		Long: `Add BY (a JSON number, default 1) to a slot holding a number (an absent slot
counts as 0), and print the slot's new value and the object's new log_id.`,
		Args: usageArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			body := map[string]json.RawMessage{}
			if len(args) == 3 {
				var n json.Number
				if err := json.Unmarshal([]byte(args[2]), &n); err != nil {
					return fmt.Errorf("BY %q is not a number", args[2])
				}
				body["by"] = json.RawMessage(args[2])
			}
			b, err := c.call(cmd.Context(), "POST", c.path("objects", ref, args[1], "increment"), nil, body, nil)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			var r struct {
				LogID uint64          `json:"log_id"`
				Value json.RawMessage `json:"value"`
			}
			if err := json.Unmarshal(b, &r); err != nil {
				return errors.New("the server's reply has no value")
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s log_id %d\n", compact(r.Value), r.LogID)
			return nil
		},
	}
}

func objectAppend(o *clientOpts) *cobra.Command {
	return slotValueCommand(o, "append", "Append VALUE to a list slot",
		"Append VALUE to the list a slot holds (an absent slot starts one) and print the\nobject's new log_id.", "POST", "append")
}

func objectTransaction(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "transaction TYPE/KEY OPS",
		Short: "Apply several ops (set, delete, increment, append) as one write, all or none",
		Long: `Apply OPS, a JSON array of ops, as one write: all of them or none. Each op is
{"op": "set", "key": SLOT, "value": V}, {"op": "delete", "key": SLOT},
{"op": "increment", "key": SLOT, "by": N} or {"op": "append", "key": SLOT, "value": V}.
OPS "-" reads the array from standard input. Prints the object's new log_id.

  holdfast object transaction order/o1 '[{"op":"set","key":"status","value":"paid"},{"op":"increment","key":"n"}]'`,
		Args: usageArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			raw := []byte(args[1])
			if args[1] == "-" {
				if raw, err = io.ReadAll(cmd.InOrStdin()); err != nil {
					return err
				}
			}
			var ops []json.RawMessage
			if err := json.Unmarshal(raw, &ops); err != nil {
				return fmt.Errorf("OPS is not a JSON array of ops: %v", err)
			}
			b, err := c.call(cmd.Context(), "POST", c.path("objects", ref, "transaction"), nil, ops, nil)
			return o.printLogID(cmd.OutOrStdout(), b, err)
		},
	}
}

func objectChanges(o *clientOpts) *cobra.Command {
	var (
		after uint64
		limit int
	)
	cmd := &cobra.Command{
		Use:   "log TYPE/KEY",
		Short: "Print the object's change log: one changed slot a line",
		Long: `Print the object's change log after log_id --after, one changed slot a line:
"LOG_ID SLOT VALUE" (VALUE null: the slot was deleted). A log that no longer holds
that far back says so (410 log_truncated).`,
		Args: usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			q := url.Values{"after": {strconv.FormatUint(after, 10)}}
			if cmd.Flags().Changed("limit") {
				q.Set("limit", strconv.Itoa(limit))
			}
			var r struct {
				Items []hfclient.Change `json:"items"`
			}
			b, err := c.call(cmd.Context(), "GET", c.path("objects", ref, "log"), q, nil, &r)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			for _, it := range r.Items {
				fmt.Fprintf(cmd.OutOrStdout(), "%d %s %s\n", it.LogID, it.Key, compact(it.Value))
			}
			return nil
		},
	}
	cmd.Flags().Uint64Var(&after, "after", 0, "print the entries after this log_id")
	cmd.Flags().IntVar(&limit, "limit", 1000, "at most this many entries")
	return cmd
}

func objectPatch(o *clientOpts) *cobra.Command {
	var asString bool
	cmd := &cobra.Command{
		Use:   "patch TYPE/KEY (SLOT=VALUE ... | JSON-OBJECT)",
		Short: "Change several slots in one write",
		Long: `Change several slots in one write (one log entry) and print the new log_id.
Name the changes as SLOT=VALUE arguments or as one JSON object; a null value
deletes that slot.

` + valueRule,
		Args: usageArgs(2, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			body, err := patchBody(args[1:], asString)
			if err != nil {
				return err
			}
			b, err := c.call(cmd.Context(), "PATCH", c.path("objects", ref), nil, body, nil)
			return o.printLogID(cmd.OutOrStdout(), b, err)
		},
	}
	cmd.Flags().BoolVar(&asString, "string", false, "send each VALUE as a string, not as JSON")
	return cmd
}

// patchBody builds a PATCH body from SLOT=VALUE pairs or one JSON object.
func patchBody(args []string, asString bool) (json.RawMessage, error) {
	if len(args) == 1 && strings.HasPrefix(strings.TrimSpace(args[0]), "{") {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(args[0]), &m); err != nil {
			return nil, fmt.Errorf("%q is not a JSON object of slots: %v", args[0], err)
		}
		return json.RawMessage(args[0]), nil
	}
	m := make(map[string]json.RawMessage, len(args))
	for _, a := range args {
		slot, val, ok := strings.Cut(a, "=")
		if !ok || slot == "" {
			return nil, fmt.Errorf("%q: want SLOT=VALUE", a)
		}
		v, err := valueArg(val, asString)
		if err != nil {
			return nil, fmt.Errorf("slot %s: %w", slot, err)
		}
		m[slot] = v
	}
	return json.Marshal(m)
}

func objectDelete(o *clientOpts) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "delete TYPE/KEY (SLOT | --all)",
		Short: "Delete a slot, or with --all purge the whole object",
		Long: `Delete one slot and print the log_id (deleting a missing slot writes nothing),
or with --all purge the object: every slot and its change log.`,
		Args: usageArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) == 2) {
				return fmt.Errorf("usage: %s: name a SLOT, or --all to purge the object", cmd.UseLine())
			}
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			if all {
				if _, err := c.call(cmd.Context(), "DELETE", c.path("objects", ref), nil, nil, nil); err != nil {
					return err
				}
				if o.json {
					return printValue(cmd.OutOrStdout(), map[string]bool{"purged": true})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "purged %s/%s\n", ref.typ, ref.key)
				return nil
			}
			b, err := c.call(cmd.Context(), "DELETE", c.path("objects", ref, args[1]), nil, nil, nil)
			return o.printLogID(cmd.OutOrStdout(), b, err)
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "purge the whole object")
	return cmd
}

// object returns the client and the object named by arg.
func (o *clientOpts) object(arg string) (*client, objectRef, error) {
	ref, err := parseObjectRef(arg)
	if err != nil {
		return nil, ref, err
	}
	c, err := o.client()
	return c, ref, err
}

// printLogID prints a write's reply: "log_id N", or the JSON.
func (o *clientOpts) printLogID(w io.Writer, b []byte, err error) error {
	if err != nil || o.json {
		return orPrint(w, b, err)
	}
	var r struct {
		LogID uint64 `json:"log_id"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return errors.New("the server's reply has no log_id")
	}
	fmt.Fprintf(w, "log_id %d\n", r.LogID)
	return nil
}

// orPrint returns err, or prints b as JSON.
func orPrint(w io.Writer, b []byte, err error) error {
	if err != nil {
		return err
	}
	return printJSON(w, b)
}

// valueArg reads a VALUE argument (valueRule).
func valueArg(s string, asString bool) (json.RawMessage, error) {
	if asString {
		return json.Marshal(s)
	}
	return parseJSONArg("VALUE", s)
}

// compact returns raw JSON on one line.
func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}
