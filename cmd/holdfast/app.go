package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/spf13/cobra"

	"github.com/holdfast/holdfast/config"
	"github.com/holdfast/holdfast/gateway"
)

// appCommand is `holdfast app`: the apps a node serves, read locally.
func appCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "app",
		Short: "Show the apps a node serves, with their credentials (reads the node's files)",
	}
	var configFile, dataDir string
	var asJSON bool
	show := &cobra.Command{
		Use:   "show",
		Short: "Print the apps a node serves: ID, App Key and App Secret",
		Long: `Print the apps a node serves, with their App Key and App Secret: those its
configuration lists (--config), else those its data directory keeps (apps.json,
created on the first start when the configuration lists none). It reads the
node's files, so it works only where they are and for a user who may read
them; nothing over the network shows a secret.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(configFile, os.Getenv)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("data-dir") {
				cfg.DataDir = dataDir
			}
			apps := make([]gateway.App, 0, len(cfg.Apps))
			from := configFile
			for _, a := range cfg.Apps {
				apps = append(apps, gateway.App{ID: a.ID, Key: a.Key, Secret: a.Secret})
			}
			if len(apps) == 0 {
				from = gateway.AppsFile(cfg.DataDir)
				b, err := os.ReadFile(from)
				if errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("%s does not exist: no node has started on data directory %s with a configuration that lists no apps", from, cfg.DataDir)
				}
				if err != nil {
					return err
				}
				if err := json.Unmarshal(b, &apps); err != nil {
					return fmt.Errorf("%s: %w", from, err)
				}
			}
			if asJSON {
				return printValue(cmd.OutOrStdout(), apps)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "from %s:\n", from)
			for _, a := range apps {
				fmt.Fprintf(cmd.OutOrStdout(), "  App ID:     %s\n  App Key:    %s\n  App Secret: %s\n", a.ID, a.Key, a.Secret)
			}
			return nil
		},
	}
	f := show.Flags()
	f.StringVar(&configFile, "config", "", "the node's YAML configuration")
	f.StringVar(&dataDir, "data-dir", "", "the node's data directory (default: the configuration's, else ./holdfast-data)")
	f.BoolVar(&asJSON, "json", false, "print the apps as JSON")
	cmd.AddCommand(show)
	return cmd
}
