// Command torture runs the torture check (internal/torture) against a holdfast
// server: concurrent clients, SIGKILLs and restarts at random, then a
// linearizability check of every KV object's history and the log checks. With
// -cluster N it runs a cluster of N nodes (and an etcd in this process) instead,
// with faults of one node at a time: kills and graceful leaves, and with
// -replication-factor 3 also disk wipes and raft link cuts (-faults picks).
//
//	go run ./bench/torture -runs 10 -duration 2m
//	go run ./bench/torture -cluster 3 -runs 1 -duration 60s
//	go run ./bench/torture -cluster 5 -replication-factor 3 -runs 3 -duration 2m
//	go run ./bench/torture -cluster 3 -replication-factor 3 -tags plantedraftbug -faults cut -duration 30s
//
// A failed run's directory (data, and each node's log in cluster mode) is kept;
// -keep keeps every run's.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/holdfast/holdfast/internal/torture"
)

func main() {
	var (
		bin      = flag.String("bin", "", "holdfast binary (default: build ./cmd/holdfast)")
		tags     = flag.String("tags", "", "build tags for the default binary (plantedbug: the torture's own test)")
		runs     = flag.Int("runs", 1, "runs, each on a fresh data directory")
		duration = flag.Duration("duration", 2*time.Minute, "workload time per run")
		clients  = flag.Int("clients", 16, "concurrent clients")
		objects  = flag.Int("objects", 8, "KV objects")
		logs     = flag.Int("logs", 4, "retained logs")
		killMin  = flag.Duration("kill-min", time.Second, "shortest time between kills")
		killMax  = flag.Duration("kill-max", 5*time.Second, "longest time between kills")
		seed     = flag.Int64("seed", 0, "seed of the first run (0: the time)")
		histDir  = flag.String("history-dir", "", "write each run's KV histories as JSON lines under this directory")
		nodes    = flag.Int("cluster", 0, "run a cluster of this many nodes (at least 3) instead of one server")
		rf       = flag.Int("replication-factor", 0, "with -cluster: the nodes' cluster.replicationFactor (0 or 1: one copy per partition)")
		faultsF  = flag.String("faults", "", "with -cluster: comma-separated kinds of fault among kill, leave, wipe, cut (default: kill,leave, and wipe,cut too with -replication-factor 3)")
		keepAll  = flag.Bool("keep", false, "keep every run's directory (data, and each node's log in cluster mode), not only a failed one's")
	)
	flag.Parse()
	work, err := os.MkdirTemp("", "holdfast-torture-")
	if err != nil {
		fatal(err)
	}
	var faults []string
	if *faultsF != "" {
		faults = strings.Split(*faultsF, ",")
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(work)
		}
	}()
	if *bin == "" {
		*bin = filepath.Join(work, "holdfast")
		args := []string{"build", "-o", *bin}
		if *tags != "" {
			args = append(args, "-tags", *tags)
		}
		cmd := exec.Command("go", append(args, "./cmd/holdfast")...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fatal(fmt.Errorf("build the server: %w", err))
		}
	}
	failed, kills, leaves, wipes, cuts := 0, 0, 0, 0, 0
	for i := range *runs {
		dir := filepath.Join(work, fmt.Sprintf("run%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fatal(err)
		}
		s := *seed
		if s != 0 {
			s += int64(i)
		}
		fmt.Printf("== run %d of %d\n", i+1, *runs)
		hist := ""
		if *histDir != "" {
			hist = filepath.Join(*histDir, fmt.Sprintf("run%d", i))
		}
		v, err := torture.Run(context.Background(), torture.Config{Binary: *bin, Dir: dir, Duration: *duration, Clients: *clients, HistoryDir: hist,
			Objects: *objects, Logs: *logs, KillMin: *killMin, KillMax: *killMax, Seed: s, Cluster: *nodes, ReplicationFactor: *rf, Faults: faults, Progress: os.Stdout})
		if err != nil {
			fmt.Fprintf(os.Stderr, "torture: the run's directory is kept: %s\n", dir)
			keep = true
			fatal(err)
		}
		kills += v.Kills
		leaves += v.Leaves
		wipes += v.Wipes
		cuts += v.Cuts
		if !v.OK {
			failed++
			keep = true
			fmt.Printf("the run's directory is kept: %s\n", dir)
			continue
		}
		if *keepAll {
			keep = true
			fmt.Printf("the run's directory is kept: %s\n", dir)
			continue
		}
		_ = os.RemoveAll(dir)
	}
	if *nodes > 0 {
		fmt.Printf("== %d runs, %d failed, %d kills (%d wipes), %d leaves and %d cuts in all\n", *runs, failed, kills, wipes, leaves, cuts)
	} else {
		fmt.Printf("== %d runs, %d failed, %d kills in all\n", *runs, failed, kills)
	}
	if failed > 0 {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "torture:", err)
	os.Exit(2)
}
