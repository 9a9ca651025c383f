package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "holdfast",
		Short:         "Holdfast: durable objects on an actor runtime",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCommand(), versionCommand(), clusterCommand(), repairCommand(), contextCommand(), appCommand())
	root.AddCommand(clientCommands()...)
	suggestUnknown(root)
	if cmd, err := root.ExecuteC(); err != nil {
		if f := cmd.Flag("json"); f != nil && f.Value.String() == "true" {
			printJSONError(os.Stderr, err)
		} else {
			fmt.Fprintln(os.Stderr, "holdfast:", err)
		}
		os.Exit(1)
	}
}

// printJSONError writes err as one JSON object (--json): a server's error body
// as the server sent it, with its HTTP status as "status"; the CLI's own
// errors as {"error": message}.
func printJSONError(w io.Writer, err error) {
	out := map[string]any{}
	var se *serverError
	if errors.As(err, &se) {
		maps.Copy(out, se.Body)
		out["status"] = se.Status
		if _, ok := out["error"]; !ok {
			out["error"] = se.Message
		}
	} else {
		out["error"] = err.Error()
	}
	b, _ := json.Marshal(out)
	fmt.Fprintf(w, "%s\n", b)
}

// suggestUnknown makes every command group below c answer an unknown
// subcommand with the ones it resembles, as cobra does for the root only:
// "holdfast object gte" suggests get. A group takes no arguments of its own.
func suggestUnknown(c *cobra.Command) {
	for _, sub := range c.Commands() {
		if sub.HasSubCommands() {
			sub.Args, sub.SuggestionsMinimumDistance = unknownSubcommand, 2
			if !sub.Runnable() { // cobra checks the arguments of runnable commands only
				sub.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
			}
			suggestUnknown(sub)
		}
	}
}

func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	return errors.New(msg + "\n\nRun '" + cmd.CommandPath() + " --help' for its commands.")
}
