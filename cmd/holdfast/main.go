// Command holdfast runs a Holdfast node (`holdfast serve`) and, later, talks to one
// as a client. One file per subcommand.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "holdfast",
		Short:         "Holdfast: durable objects on an actor runtime",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCommand(), versionCommand(), clusterCommand())
	root.AddCommand(clientCommands()...)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "holdfast:", err)
		os.Exit(1)
	}
}
