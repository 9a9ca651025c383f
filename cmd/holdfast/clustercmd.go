package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
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

	var partitions bool
	status := &cobra.Command{
		Use:   "status",
		Short: "Nodes and their state, and how many partitions are served, unavailable or refused",
		Long: `status shows every node (live, leaving, unreachable, refused, down) and counts the
partitions served, unavailable and refused. A node is unreachable as soon as a live
node's router gets no answer from it (its partitions then get 503 there), before etcd
drops its registration. --partitions lists every partition; --json prints the same
as JSON with camelCase keys.`,
		Args: cobra.NoArgs,
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
			if !partitions {
				st.Parts = nil
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
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON (camelCase keys)")
	status.Flags().BoolVar(&partitions, "partitions", false, "list every partition: owner, epoch, move, state")

	var (
		noWait  bool
		timeout time.Duration
	)
	leave := &cobra.Command{
		Use:   "leave NODE",
		Short: "Ask a node to hand its partitions off and exit (as on SIGTERM), and wait until it did",
		Long: `leave asks a node to hand its partitions off to the others and exit, as on SIGTERM.
It waits, printing progress on stderr, until every partition was handed off and the
node's process exited (its addresses refuse connections), or --timeout passed;
--no-wait returns once the request is recorded.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return errors.New("--timeout must be positive")
			}
			eps, name, err := target()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			progress := func(line string) { fmt.Fprintln(cmd.ErrOrStderr(), line) }
			if err := cluster.RequestLeave(ctx, eps, name, args[0], !noWait, progress); err != nil {
				return err
			}
			if noWait {
				fmt.Fprintf(cmd.OutOrStdout(), "asked node %s to leave cluster %s\n", args[0], name)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s left cluster %s\n", args[0], name)
			return nil
		},
	}
	leave.Flags().BoolVar(&noWait, "no-wait", false, "return once the request is recorded, without waiting for the node to leave")
	leave.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "how long to wait for the handoffs and the node's exit")

	var acceptLoss bool
	forget := &cobra.Command{
		Use:   "forget-node NODE --accept-data-loss",
		Short: "Give up a dead node's partitions: other nodes take them up empty",
		Long: `forget-node gives up the partitions of a node that is down and will not return
with its data: the controller assigns them to the live nodes, which serve them
from empty. Everything the node held is lost. It refuses while the node is live,
unless the node refuses its partitions (its data directory is not the one they
were served from, see cluster status): then those are given up, and the node
stays as a new, empty member that gets its share of partitions.`,
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

	var acceptRecoverLoss bool
	recoverCmd := &cobra.Command{
		Use:   "recover-partition P --accept-data-loss",
		Short: "Serve a partition that lost its majority from its best surviving replica",
		Long: `recover-partition serves partition P again when a majority of its replicas is
gone for good (their nodes' disks are lost, or they will not return): the live
replica whose log goes furthest becomes the partition's only replica, and the
cluster then adds replicas back up to cluster.replicationFactor. Writes that only
the lost replicas held are lost; every object's log_id goes on above any value it
had, so a reader resuming from before the loss gets log_truncated. It refuses
while a majority of the partition's replicas is live (the partition then serves
by itself), and while no live replica has reported its log.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := strconv.ParseUint(args[0], 10, 32)
			if err != nil {
				return fmt.Errorf("partition %q: a partition number (holdfast cluster status --partitions lists them)", args[0])
			}
			if !acceptRecoverLoss {
				return errors.New("recover-partition loses the writes only the lost replicas held: repeat with --accept-data-loss")
			}
			eps, name, err := target()
			if err != nil {
				return err
			}
			res, err := cluster.RecoverPartition(cmd.Context(), eps, name, uint32(p))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "partition %d restarts from node %s (replica %d, log up to index %d of term %d) as new replica %d; gave up the replicas on %s; the cluster adds replicas back\n",
				res.Partition, res.Node, res.From, res.LastIndex, res.LastTerm, res.Replica, orNone(strings.Join(res.Lost, ", ")))
			return nil
		},
	}
	recoverCmd.Flags().BoolVar(&acceptRecoverLoss, "accept-data-loss", false, "confirm that writes only the lost replicas held are lost")

	cmd.AddCommand(status, leave, forget, recoverCmd)
	return cmd
}

// printStatus prints a cluster's status for people: a summary, the nodes, and
// the partitions if st has them (--partitions).
func printStatus(w io.Writer, st *cluster.Status) {
	if st.ReplicationFactor > 1 {
		printReplicatedStatus(w, st)
		return
	}
	fmt.Fprintf(w, "cluster %s: %d partitions: %d served, %d unavailable, %d refused", st.Name, st.Partitions, st.Served, st.Unavailable, st.Refused)
	if st.Moving > 0 {
		fmt.Fprintf(w, " (%d moving)", st.Moving)
	}
	fmt.Fprintf(w, "; controller %s\n\n", orNone(st.Controller))
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tPARTITIONS\tSERVED\tUNAVAILABLE\tREFUSED\tADDRESS\tHTTP")
	for _, n := range st.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", n.ID, n.State, n.Owned, n.Served, n.Unavailable, n.Refused, orNone(n.Addr), orNone(n.HTTP))
	}
	tw.Flush()
	printReasons(w, st)
	if len(st.Parts) == 0 {
		if u := st.Unavailable + st.Refused; u > 0 {
			fmt.Fprintf(w, "\n%d partitions not served (--partitions lists them)\n", u)
		}
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tOWNER\tEPOCH\tMOVING TO\tSTATE\tREASON")
	for _, p := range st.Parts {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\n", p.Partition, orNone(p.Owner), p.Epoch, orNone(p.Target), p.State, orNone(p.Reason))
	}
	tw.Flush()
}

// printReplicatedStatus is printStatus for a replicated cluster: replicas
// instead of owners.
func printReplicatedStatus(w io.Writer, st *cluster.Status) {
	fmt.Fprintf(w, "cluster %s: %d partitions of %d replicas: %d served, %d unavailable, %d under-replicated; controller %s\n\n",
		st.Name, st.Partitions, st.ReplicationFactor, st.Served, st.Unavailable, st.UnderReplicated, orNone(st.Controller))
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tREPLICAS\tLEADS\tADDRESS\tRAFT\tHTTP")
	for _, n := range st.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", n.ID, n.State, n.Owned, n.Served, orNone(n.Addr), orNone(n.Raft), orNone(n.HTTP))
	}
	tw.Flush()
	printReasons(w, st)
	if len(st.Parts) == 0 {
		if st.Unavailable > 0 {
			fmt.Fprintf(w, "\n%d partitions not served (--partitions lists them)\n", st.Unavailable)
		}
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tLEADER\tTERM\tREPLICAS (node:state:lag)\tSTATE\tREASON")
	for _, p := range st.Parts {
		var reps []string
		for _, r := range p.Replicas {
			reps = append(reps, fmt.Sprintf("%s:%s:%d", r.Node, r.State, r.Lag))
		}
		state := p.State
		if p.UnderReplicated {
			state += ",under-replicated"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\n", p.Partition, orNone(p.Leader), p.Term, orNone(strings.Join(reps, " ")), state, orNone(p.Reason))
	}
	tw.Flush()
}

// printReasons prints why each node that has a reason is in its state.
func printReasons(w io.Writer, st *cluster.Status) {
	first := true
	for _, n := range st.Nodes {
		if n.Reason == "" {
			continue
		}
		if first {
			fmt.Fprintln(w)
			first = false
		}
		fmt.Fprintf(w, "node %s is %s: %s\n", n.ID, n.State, n.Reason)
	}
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
