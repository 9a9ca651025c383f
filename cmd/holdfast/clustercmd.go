package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/config"
)

// clusterCommand is `holdfast cluster`: operator commands that read and change
// a cluster's state in etcd.
func clusterCommand() *cobra.Command {
	var (
		configFile string
		endpoints  string
		name       string
		asJSON     bool
	)
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Look at and operate a cluster of Holdfast nodes (through its etcd)",
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&configFile, "config", "", "a node's YAML configuration (its cluster section names the cluster and etcd)")
	pf.StringVar(&endpoints, "etcd", "", "etcd endpoints, comma-separated (instead of --config)")
	pf.StringVar(&name, "name", "", "the cluster's name (instead of --config)")
	target := func() ([]string, string, error) {
		if configFile != "" {
			cfg, err := config.Load(configFile, os.Getenv)
			if err != nil {
				return nil, "", err
			}
			if cfg.Cluster == nil {
				return nil, "", fmt.Errorf("%s has no cluster section", configFile)
			}
			if endpoints == "" {
				endpoints = strings.Join(cfg.Cluster.Etcd.Endpoints, ",")
			}
			if name == "" {
				name = cfg.Cluster.Name
			}
		}
		if endpoints == "" || name == "" {
			return nil, "", errors.New("name the cluster: --config FILE, or --etcd ENDPOINTS and --name NAME")
		}
		return strings.Split(endpoints, ","), name, nil
	}

	status := &cobra.Command{
		Use:   "status",
		Short: "Members, partitions, owners, epochs, and which partitions are unavailable",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			eps, name, err := target()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 15*time.Second)
			defer cancel()
			st, err := cluster.ReadStatus(ctx, eps, name)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			printStatus(cmd.OutOrStdout(), st)
			return nil
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	leave := &cobra.Command{
		Use:   "leave NODE",
		Short: "Ask a node to hand its partitions off and exit (as on SIGTERM)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			eps, name, err := target()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
			defer cancel()
			if err := cluster.RequestLeave(ctx, eps, name, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s left cluster %s\n", args[0], name)
			return nil
		},
	}

	var acceptLoss bool
	forget := &cobra.Command{
		Use:   "forget-node NODE --accept-data-loss",
		Short: "Give up a dead node's partitions: other nodes take them up empty",
		Long: `forget-node gives up the partitions of a node that is down and will not return
with its data: the controller assigns them to the live nodes, which serve them
from empty. Everything the node held is lost. It refuses while the node is live.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !acceptLoss {
				return errors.New("forget-node loses every write the node held: repeat with --accept-data-loss")
			}
			eps, name, err := target()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			n, err := cluster.ForgetNode(ctx, eps, name, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "gave up %d partitions of node %s; the live nodes take them up empty\n", n, args[0])
			return nil
		},
	}
	forget.Flags().BoolVar(&acceptLoss, "accept-data-loss", false, "confirm that the node's data is lost")

	cmd.AddCommand(status, leave, forget)
	return cmd
}

// printStatus prints a cluster's status for people.
func printStatus(w io.Writer, st *cluster.Status) {
	owned := map[string]int{}
	for _, p := range st.Parts {
		owned[p.Owner]++
	}
	fmt.Fprintf(w, "cluster %s: %d partitions, controller %s\n\n", st.Name, st.Partitions, orNone(st.Controller))
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tHTTP\tPARTITIONS\tSTATE")
	for _, n := range st.Nodes {
		state := "live"
		switch {
		case n.Client:
			state = "client"
		case n.Leaving:
			state = "leaving"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", n.ID, n.Addr, n.HTTP, owned[n.ID], state)
	}
	live := map[string]bool{}
	for _, n := range st.Nodes {
		live[n.ID] = true
	}
	for id, c := range owned {
		if id != "" && !live[id] {
			fmt.Fprintf(tw, "%s\t-\t-\t%d\tdown\n", id, c)
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tOWNER\tEPOCH\tMOVING TO\tAVAILABLE")
	for _, p := range st.Parts {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%v\n", p.Partition, orNone(p.Owner), p.Epoch, orNone(p.Target), p.Available)
	}
	tw.Flush()
	if u := st.Unavailable(); len(u) > 0 {
		fmt.Fprintf(w, "\n%d partitions unavailable: %v\n", len(u), u)
	}
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
