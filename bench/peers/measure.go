package peers

import (
	"context"
	"os"
	"time"
)

// Measure runs workers goroutines repeating fn, one call in flight each, the
// way every peer's workload runs: each worker completes one operation first
// (SetupTimeout), then Warmup unmeasured, then d measured. It is for systems
// the benchmark runs in its own process that are not peers (holdfast-r3):
// disk bytes and CPU are this process's (ClientCPU and ServerCPU alike), and
// the latency percentiles cover the operations that started and completed
// within the measured interval. fn returns how many operations a call
// completed; an error fails the run.
func Measure(workers int, d time.Duration, fn func(ctx context.Context, w int) (int64, error)) (Result, error) {
	m, err := run(workers, d, os.Getpid(), fn)
	if err != nil {
		return Result{}, err
	}
	return m.Result, nil
}
