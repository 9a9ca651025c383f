package main

import (
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/holdfast/holdfast/actors"
)

// memoryLimitPercent is the share of the memory budget that `holdfast serve`
// gives the Go runtime as its memory limit: above the 75% at which the node
// refuses new work (docs/decisions.md, "Memory budget"), so that the GC
// collects harder before the heap in use (live plus garbage) nears the budget.
const memoryLimitPercent = 85

// memoryLimit returns the Go memory limit for a node with the configured
// budget (0: the default), and false when GOMEMLIMIT is set: the operator's
// limit stands.
func memoryLimit(budget int64, getenv func(string) string) (int64, bool) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, false
	}
	if budget == 0 {
		budget = actors.DefaultMemoryBudget()
	}
	return budget / 100 * memoryLimitPercent, true
}

// setMemoryLimit sets the Go runtime's memory limit from the budget.
func setMemoryLimit(budget int64, log *slog.Logger) {
	if limit, ok := memoryLimit(budget, os.Getenv); ok {
		debug.SetMemoryLimit(limit)
		log.Info("go memory limit set from the memory budget", "limit_bytes", limit)
	}
}
