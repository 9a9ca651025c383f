// Command torture runs the torture check (internal/torture) against a holdfast
// server: concurrent clients, SIGKILLs and restarts at random, then a
// linearizability check of every KV object's history and the log checks.
//
//	go run ./bench/torture -runs 10 -duration 2m
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	)
	flag.Parse()
	work, err := os.MkdirTemp("", "holdfast-torture-")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(work)
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
	failed, kills := 0, 0
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
			Objects: *objects, Logs: *logs, KillMin: *killMin, KillMax: *killMax, Seed: s, Progress: os.Stdout})
		if err != nil {
			fatal(err)
		}
		kills += v.Kills
		if !v.OK {
			failed++
		}
		_ = os.RemoveAll(dir)
	}
	fmt.Printf("== %d runs, %d failed, %d kills in all\n", *runs, failed, kills)
	if failed > 0 {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "torture:", err)
	os.Exit(2)
}
