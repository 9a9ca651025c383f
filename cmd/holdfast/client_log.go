package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	hfclient "github.com/holdfast/holdfast/client"
)

// logCommand is `holdfast log`: an object's retained log.
func logCommand() *cobra.Command {
	cmd, o := clientGroup("log", "Append to, read and consume an object's retained log (TYPE/KEY)")
	cmd.AddCommand(logAppend(o), logRead(o), logTail(o), logBoundsCmd(o), logLoad(o), logTrim(o), logCursors(o), logLease(o), logAck(o),
		logDeadLetters(o), logConsumers(o), listCommand(o, hfclient.ListLogs, "objects that hold a log"))
	completeObjects(cmd, o, hfclient.ListLogs)
	return cmd
}

// logRecord is a record as the server sends it.
type logRecord struct {
	Offset           uint64          `json:"offset"`
	Body             json.RawMessage `json:"body"`
	DeduplicationKey string          `json:"deduplicationKey"`
	AppendedAt       int64           `json:"appendedAt"`
}

type recordPage struct {
	Records    []json.RawMessage `json:"records"`
	NextOffset uint64            `json:"nextOffset"`
	Lag        uint64            `json:"lag"`
}

type logBounds struct {
	OldestOffset uint64 `json:"oldestOffset"`
	HotOffset    uint64 `json:"hotOffset"`
	NextOffset   uint64 `json:"nextOffset"`
}

// printRecord writes a record as "OFFSET BODY", or as its JSON.
func printRecord(w io.Writer, raw json.RawMessage, asJSON bool) error {
	if asJSON {
		return printJSON(w, raw)
	}
	var r logRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("a record the server sent: %w", err)
	}
	_, err := fmt.Fprintf(w, "%d %s\n", r.Offset, compact(r.Body))
	return err
}

func logAppend(o *clientOpts) *cobra.Command {
	var keys []string
	cmd := &cobra.Command{
		Use:   "append TYPE/KEY BODY...",
		Short: "Append records (each BODY is JSON) in one batch",
		Long: `Append one record per BODY argument, atomically, and print their offsets. Each
BODY is JSON (a string in JSON quotes). --dedup-key, repeated, gives the records'
deduplication keys in order (a key still in the hot window returns the original
offset and writes nothing).`,
		Args: usageArgs(2, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			if len(keys) > len(args)-1 {
				return fmt.Errorf("%d --dedup-key for %d records", len(keys), len(args)-1)
			}
			recs := make([]map[string]any, len(args)-1)
			for i, a := range args[1:] {
				body, err := parseJSONArg("BODY", a)
				if err != nil {
					return err
				}
				recs[i] = map[string]any{"body": body}
				if i < len(keys) {
					recs[i]["deduplicationKey"] = keys[i]
				}
			}
			var r struct {
				Offsets []uint64 `json:"offsets"`
			}
			b, err := c.call(cmd.Context(), "POST", c.path("logs", ref, "append"), nil, map[string]any{"records": recs}, &r)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "offsets", joinUints(r.Offsets))
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&keys, "dedup-key", nil, "deduplication key of the next record (repeat, in order)")
	return cmd
}

func joinUints(ns []uint64) string {
	b := make([]byte, 0, 8*len(ns))
	for i, n := range ns {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendUint(b, n, 10)
	}
	return string(b)
}

func logRead(o *clientOpts) *cobra.Command {
	var from, limit uint64
	cmd := &cobra.Command{
		Use:   "read TYPE/KEY [--from N] [--limit N]",
		Short: "Print one page of records",
		Long: `Print one page of records from --from (default: the oldest readable offset), one
"OFFSET BODY" line each, then "next N lag N". --limit is capped by the type's
maxBatchSize (default 100). Reading never moves a cursor.`,
		Args: usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if !cmd.Flags().Changed("from") {
				bounds, err := c.bounds(ctx, ref)
				if err != nil {
					return err
				}
				from = bounds.OldestOffset
			}
			q := url.Values{"from": {strconv.FormatUint(from, 10)}}
			if cmd.Flags().Changed("limit") {
				q.Set("limit", strconv.FormatUint(limit, 10))
			}
			var page recordPage
			b, err := c.call(ctx, "GET", c.path("logs", ref, "records"), q, nil, &page)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			for _, r := range page.Records {
				if err := printRecord(cmd.OutOrStdout(), r, false); err != nil {
					return err
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "next %d lag %d\n", page.NextOffset, page.Lag)
			return nil
		},
	}
	cmd.Flags().Uint64Var(&from, "from", 0, "first offset to read (default: the oldest readable)")
	cmd.Flags().Uint64Var(&limit, "limit", 0, "at most this many records (default and cap: the type's maxBatchSize)")
	return cmd
}

func (c *client) bounds(ctx context.Context, ref objectRef) (logBounds, error) {
	var b logBounds
	_, err := c.call(ctx, "GET", c.path("logs", ref, "bounds"), nil, nil, &b)
	return b, err
}

func logTail(o *clientOpts) *cobra.Command {
	var (
		from     uint64
		count    int
		timeout  time.Duration
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "tail TYPE/KEY [--from N]",
		Short: "Print records as they are appended",
		Long: `Print the records from --from (default: the end of the log, so only new ones),
then keep polling every --interval for new ones, one "OFFSET BODY" line each (with
--json, one record per line). Runs until interrupted, until --count records were
printed, or for --timeout (an error if --count records did not come by then).`,
		Args: usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			sig, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx := sig
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(sig, timeout)
				defer cancel()
			}
			if !cmd.Flags().Changed("from") {
				b, err := c.bounds(ctx, ref)
				if err != nil {
					return err
				}
				from = b.NextOffset
			}
			seen := 0
			for count == 0 || seen < count {
				var page recordPage
				_, err := c.call(ctx, "GET", c.path("logs", ref, "records"), url.Values{"from": {strconv.FormatUint(from, 10)}}, nil, &page)
				if err != nil && ctx.Err() == nil {
					return err
				}
				for _, r := range page.Records {
					if count > 0 && seen >= count {
						break
					}
					if err := printRecord(cmd.OutOrStdout(), r, o.json); err != nil {
						return err
					}
					seen++
				}
				if err == nil {
					from = page.NextOffset
				}
				if len(page.Records) > 0 && err == nil {
					continue
				}
				select {
				case <-ctx.Done():
					if sig.Err() == nil && count > 0 {
						return fmt.Errorf("--timeout %v: %d of %d records came", timeout, seen, count)
					}
					return nil
				case <-time.After(interval):
				}
			}
			return nil
		},
	}
	cmd.Flags().Uint64Var(&from, "from", 0, "first offset (default: the end of the log)")
	cmd.Flags().IntVar(&count, "count", 0, "exit after this many records (0: no limit)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "stop after this long (0: no limit)")
	cmd.Flags().DurationVar(&interval, "interval", 500*time.Millisecond, "how often to poll when caught up")
	return cmd
}

func logCursors(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "cursors TYPE/KEY [CONSUMER [OFFSET]]",
		Short: "List consumer cursors, show one, or commit one",
		Long: `With no CONSUMER, list every consumer's cursor ("CONSUMER OFFSET" lines). With
CONSUMER, print its cursor (an error, HTTP 404, if it never committed). With
CONSUMER OFFSET, commit the cursor (a commit at or below the current cursor is
ignored) and print the cursor after it.`,
		Args: usageArgs(1, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(args) == 1 {
				var r struct {
					Cursors map[string]uint64 `json:"cursors"`
				}
				b, err := c.call(cmd.Context(), "GET", c.path("logs", ref, "cursors"), nil, nil, &r)
				if err != nil || o.json {
					return orPrint(out, b, err)
				}
				for _, k := range sortedKeys(r.Cursors) {
					fmt.Fprintf(out, "%s %d\n", k, r.Cursors[k])
				}
				return nil
			}
			method, body := "GET", any(nil)
			if len(args) == 3 {
				n, err := strconv.ParseUint(args[2], 10, 64)
				if err != nil {
					return fmt.Errorf("OFFSET %q: want a non-negative integer", args[2])
				}
				method, body = "PUT", map[string]uint64{"offset": n}
			}
			var r struct {
				Offset uint64 `json:"offset"`
			}
			b, err := c.call(cmd.Context(), method, c.path("logs", ref, "cursors", args[1]), nil, body, &r)
			if err != nil || o.json {
				return orPrint(out, b, err)
			}
			fmt.Fprintf(out, "%s %d\n", args[1], r.Offset)
			return nil
		},
	}
}

func logLease(o *clientOpts) *cobra.Command {
	var limit uint64
	cmd := &cobra.Command{
		Use:   "lease TYPE/KEY CONSUMER [--limit N]",
		Short: "Lease the next range of records for a consumer (types with leases)",
		Long: `Claim the consumer's next range of records and print "batch ID offsets A-B
attempt N expires TIME", then one "OFFSET BODY" line per record. Settle it with
"log ack TYPE/KEY CONSUMER ID". When nothing can be leased, print "nothing to
lease" (with --json: null). A type without leases configured gets HTTP 409.`,
		Args: usageArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var body any
			if cmd.Flags().Changed("limit") {
				body = map[string]uint64{"limit": limit}
			}
			status, b, err := c.do(cmd.Context(), "POST", c.path("logs", ref, "consumers", args[1], "lease"), nil, body)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if status == http.StatusNoContent {
				if o.json {
					_, err := fmt.Fprintln(out, "null")
					return err
				}
				_, err := fmt.Fprintln(out, "nothing to lease")
				return err
			}
			if o.json {
				return printJSON(out, b)
			}
			var l struct {
				BatchID     string            `json:"batchId"`
				FirstOffset uint64            `json:"firstOffset"`
				LastOffset  uint64            `json:"lastOffset"`
				Attempt     int               `json:"attempt"`
				ExpiresAt   int64             `json:"expiresAt"`
				Records     []json.RawMessage `json:"records"`
			}
			if err := json.Unmarshal(b, &l); err != nil {
				return fmt.Errorf("the server's lease: %w", err)
			}
			fmt.Fprintf(out, "batch %s offsets %d-%d attempt %d expires %s\n", l.BatchID, l.FirstOffset, l.LastOffset, l.Attempt, msTime(l.ExpiresAt))
			for _, r := range l.Records {
				if err := printRecord(out, r, false); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().Uint64Var(&limit, "limit", 0, "at most this many records (default: the type's maxBatchSize)")
	return cmd
}

func logAck(o *clientOpts) *cobra.Command {
	var nack bool
	cmd := &cobra.Command{
		Use:   "ack TYPE/KEY CONSUMER BATCH_ID [--nack]",
		Short: "Settle a leased range: ack it, or with --nack make it redeliverable",
		Long: `Ack a leased range and print the consumer's cursor after it ("cursor N", or
"cursor unchanged" while an earlier range is still held). With --nack the range is
redelivered by the next lease. A batch that is not held gets HTTP 409.`,
		Args: usageArgs(3, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			op := "ack"
			if nack {
				op = "nack"
			}
			var r struct {
				Cursor *uint64 `json:"cursor"`
			}
			b, err := c.call(cmd.Context(), "POST", c.path("logs", ref, "consumers", args[1], op), nil, map[string]string{"batchId": args[2]}, &r)
			out := cmd.OutOrStdout()
			switch {
			case err != nil || o.json:
				return orPrint(out, b, err)
			case nack:
				fmt.Fprintln(out, "nacked", args[2])
			case r.Cursor == nil:
				fmt.Fprintln(out, "cursor unchanged")
			default:
				fmt.Fprintln(out, "cursor", *r.Cursor)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&nack, "nack", false, "nack instead: the range is delivered again")
	return cmd
}

func logBoundsCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "bounds TYPE/KEY",
		Short: "Print the log's oldest readable, oldest hot and next offsets",
		Long: `Print "oldest N hot N next N": the oldest readable offset (cold segments
included), the oldest offset still in the node's storage, and the offset the next
append gets.`,
		Args: usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var b logBounds
			raw, err := c.call(cmd.Context(), "GET", c.path("logs", ref, "bounds"), nil, nil, &b)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), raw, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "oldest %d hot %d next %d\n", b.OldestOffset, b.HotOffset, b.NextOffset)
			return nil
		},
	}
}

func logLoad(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "load TYPE/KEY",
		Short: "Print the log's backlog: records after its slowest consumer's cursor",
		Args:  usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var l struct {
				Backlog uint64 `json:"backlog"`
			}
			raw, err := c.call(cmd.Context(), "GET", c.path("logs", ref, "load"), nil, nil, &l)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), raw, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "backlog %d\n", l.Backlog)
			return nil
		},
	}
}

func logTrim(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "trim TYPE/KEY",
		Short: "Enforce the type's retention now, oldest records first",
		Long: `Enforce the type's retention now (as the log's own alarm does), oldest records
first, and print how many records were removed from the node's storage (moved to
the cold store, when the type has one).`,
		Args: usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var t struct {
				Removed uint64 `json:"removed"`
			}
			raw, err := c.call(cmd.Context(), "POST", c.path("logs", ref, "trim"), nil, map[string]any{}, &t)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), raw, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d\n", t.Removed)
			return nil
		},
	}
}

func logDeadLetters(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "dead-letters TYPE/KEY CONSUMER",
		Short: "List a consumer's dead-lettered ranges (types with leases)",
		Long: `List the ranges that failed the type's maxAttempts deliveries to CONSUMER, one
"FIRST-LAST attempts N" line each, then their records ("OFFSET BODY").`,
		Args: usageArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var d struct {
				DeadLetters []struct {
					FirstOffset uint64            `json:"firstOffset"`
					LastOffset  uint64            `json:"lastOffset"`
					Attempts    int               `json:"attempts"`
					Records     []json.RawMessage `json:"records"`
				} `json:"deadLetters"`
			}
			raw, err := c.call(cmd.Context(), "GET", c.path("logs", ref, "consumers", args[1], "dead-letters"), nil, nil, &d)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), raw, err)
			}
			for _, l := range d.DeadLetters {
				fmt.Fprintf(cmd.OutOrStdout(), "%d-%d attempts %d\n", l.FirstOffset, l.LastOffset, l.Attempts)
				for _, r := range l.Records {
					if err := printRecord(cmd.OutOrStdout(), r, false); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
}
