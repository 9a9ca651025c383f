// Command holdfast runs a Holdfast node (`holdfast serve`), operates a cluster
// (`holdfast cluster ...`) and talks to a node as a client (`holdfast object`,
// `log`, `queue`, `alarm`, `token`, `export`, `import`). One file per command
// group.
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
	root.AddCommand(serveCommand(), versionCommand(), clusterCommand(), repairCommand())
	root.AddCommand(clientCommands()...)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "holdfast:", err)
		os.Exit(1)
	}
}
