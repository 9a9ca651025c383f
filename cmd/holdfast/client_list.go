package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	hfclient "github.com/holdfast/holdfast/client"
)

// listCommand is `holdfast {object,log,queue} ls TYPE`: the keys of a
// type's objects (of those that hold a log, a queue), from every partition
// and every node, one per line in byte order, paged through to the end.
func listCommand(o *clientOpts, kind hfclient.ListKind, what string) *cobra.Command {
	var prefix, after string
	var limit int
	use, minArgs, types := "ls TYPE", 1, ""
	if kind == hfclient.ListObjects {
		// Without a TYPE, the app's types (as nats stream ls lists streams).
		use, minArgs, types = "ls [TYPE]", 0, `
Without TYPE, list the app's types that hold data, the same way.`
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: "List the keys of a type's " + what,
		Long: `List the keys of the type's ` + what + `, one per line, in byte order, from every
partition (and every node of a cluster). --prefix keeps the keys that start with
it, --after starts after a key, --limit stops after that many keys (0: all).
With --json: {"keys":[...]} and, when --limit stopped it, "next" (the --after of
the rest).` + types,
		Args: usageArgs(minArgs, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 {
				return fmt.Errorf("--limit %d: want 0 (all) or more", limit)
			}
			if len(args) == 1 && strings.Contains(args[0], "/") {
				return fmt.Errorf("%q: name a type, without a key (holdfast %s ls order)", args[0], cmd.Parent().Name())
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			if len(args) == 0 { // the app's types
				names, next, err := pageThrough(cmd, o, prefix, after, limit, func(opts hfclient.ListOptions) ([]string, string, error) {
					page, err := c.lib.Types(cmd.Context(), opts)
					if err != nil {
						return nil, "", err
					}
					return page.Types, page.Next, nil
				})
				if err != nil || !o.json {
					return err
				}
				return printValue(cmd.OutOrStdout(), hfclient.TypePage{Types: names, Next: next})
			}
			keys, next, err := pageThrough(cmd, o, prefix, after, limit, func(opts hfclient.ListOptions) ([]string, string, error) {
				page, err := c.lib.List(cmd.Context(), kind, args[0], opts)
				if err != nil {
					return nil, "", err
				}
				return page.Keys, page.Next, nil
			})
			if err != nil || !o.json {
				return err
			}
			return printValue(cmd.OutOrStdout(), hfclient.KeyPage{Keys: keys, Next: next})
		},
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "only keys that start with this")
	cmd.Flags().StringVar(&after, "after", "", "only keys after this one (byte order)")
	cmd.Flags().IntVar(&limit, "limit", 0, "stop after this many keys (0: all)")
	return cmd
}

// pageThrough pages through a listing from after (fetch gets one page),
// printing each name on its own line unless --json, up to limit names (0:
// all). It returns the names, and next (the --after of the rest) when limit
// stopped it before the end.
func pageThrough(cmd *cobra.Command, o *clientOpts, prefix, after string, limit int,
	fetch func(hfclient.ListOptions) ([]string, string, error)) ([]string, string, error) {
	names := []string{}
	opts := hfclient.ListOptions{Prefix: prefix, After: after, Limit: hfPage(limit)}
	for {
		page, next, err := fetch(opts)
		if err != nil {
			return nil, "", err
		}
		for _, n := range page {
			if limit > 0 && len(names) == limit {
				return names, names[len(names)-1], nil
			}
			names = append(names, n)
			if !o.json {
				fmt.Fprintln(cmd.OutOrStdout(), n)
			}
		}
		if next == "" {
			return names, "", nil
		}
		if limit > 0 && len(names) == limit {
			return names, names[len(names)-1], nil
		}
		opts.After = next
	}
}

// hfPage is the page size to ask for: the server's largest, or less when
// fewer keys are wanted.
func hfPage(limit int) int {
	if limit > 0 && limit < 1000 {
		return limit
	}
	return 1000
}

// logConsumers is `holdfast log consumers TYPE/KEY`: every consumer that
// committed a cursor, with its cursor and backlog (records after it).
func logConsumers(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "consumers TYPE/KEY",
		Short: "List a log's consumers, their cursors and backlogs",
		Long: `List the consumers of a log that committed a cursor (by hand, or by acking a
lease): "CONSUMER CURSOR BACKLOG" lines, where BACKLOG is the records from the
cursor to the log's end. With --json: {"consumers":[{"name","cursor","backlog"}],
"nextOffset":N}.`,
		Args: usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var cur struct {
				Cursors map[string]uint64 `json:"cursors"`
			}
			if _, err := c.call(cmd.Context(), "GET", c.path("logs", ref, "cursors"), nil, nil, &cur); err != nil {
				return err
			}
			var bounds logBounds
			if _, err := c.call(cmd.Context(), "GET", c.path("logs", ref, "bounds"), nil, nil, &bounds); err != nil {
				return err
			}
			type consumer struct {
				Name    string `json:"name"`
				Cursor  uint64 `json:"cursor"`
				Backlog uint64 `json:"backlog"`
			}
			list := []consumer{}
			for _, name := range sortedKeys(cur.Cursors) {
				at := cur.Cursors[name]
				list = append(list, consumer{Name: name, Cursor: at, Backlog: bounds.NextOffset - min(at, bounds.NextOffset)})
			}
			out := cmd.OutOrStdout()
			if o.json {
				return printValue(out, map[string]any{"consumers": list, "nextOffset": bounds.NextOffset})
			}
			if len(list) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no consumer committed a cursor on this log")
				return nil
			}
			w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CONSUMER\tCURSOR\tBACKLOG")
			for _, c := range list {
				fmt.Fprintf(w, "%s\t%d\t%d\n", c.Name, c.Cursor, c.Backlog)
			}
			return w.Flush()
		},
	}
}

// completeObjects sets, on every subcommand of group whose first argument is
// TYPE/KEY or TYPE, a completion of that argument from the server: the
// app's types (GET /api/v1/objects/{app}), then, after "TYPE/", the type's
// keys of the listing kind (the objects that hold a log for `log`, ...).
// It is silent when the server cannot be asked (no credentials, down):
// completion never prints errors into a shell.
func completeObjects(group *cobra.Command, o *clientOpts, kind hfclient.ListKind) {
	group.ValidArgsFunction = cobra.NoFileCompletions
	for _, sub := range append([]*cobra.Command{group}, group.Commands()...) {
		args := strings.Fields(sub.Use)
		if len(args) < 2 || (args[1] != "TYPE/KEY" && args[1] != "TYPE" && args[1] != "[TYPE]") {
			continue
		}
		keys := args[1] == "TYPE/KEY"
		sub.ValidArgsFunction = func(cmd *cobra.Command, done []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if len(done) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return completeObjectArg(cmd, o, kind, keys, toComplete)
		}
	}
}

// completeObjectArg completes a TYPE/KEY (keys) or TYPE argument.
func completeObjectArg(cmd *cobra.Command, o *clientOpts, kind hfclient.ListKind, keys bool, toComplete string) ([]string, cobra.ShellCompDirective) {
	c, err := o.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
	defer cancel()
	if typ, prefix, ok := strings.Cut(toComplete, "/"); ok && keys {
		page, err := c.lib.List(ctx, kind, typ, hfclient.ListOptions{Prefix: prefix, Limit: 200})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		out := make([]string, len(page.Keys))
		for i, k := range page.Keys {
			out[i] = typ + "/" + k
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
	page, err := c.lib.Types(ctx, hfclient.ListOptions{Prefix: toComplete, Limit: 200})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	if !keys {
		return page.Types, cobra.ShellCompDirectiveNoFileComp
	}
	out := make([]string, len(page.Types))
	for i, t := range page.Types {
		out[i] = t + "/"
	}
	return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
}
