package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, _ := buildVersion()
			fmt.Fprintf(cmd.OutOrStdout(), "holdfast %s (%s, %s/%s)\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}

// buildVersion returns the version (the -ldflags one, else the module's
// when built from a module version, else "dev") and the VCS revision the
// binary was built from ("" when Go recorded none).
func buildVersion() (v, revision string) {
	v = version
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v, ""
	}
	if v == "dev" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		v = info.Main.Version
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			revision = s.Value
		}
	}
	return v, revision
}
