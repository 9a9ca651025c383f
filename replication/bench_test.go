package replication_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/replication"
	"github.com/holdfast/holdfast/replication/replicationtest"
)

// BenchmarkEngine_Propose measures a replicated write in process: 3 engines,
// 256 groups, the in-memory pipeline (no sync delay), a perfect simulated
// network (which marshals and unmarshals every message, as a wire would).
// One writer per group proposes 64-byte payloads one after another. Reported:
// ns/op (wall per write, all writers together), cpu-us/write (process CPU,
// user+system, per write: all three nodes' work), allocs/op (per write, all
// nodes, including the network's copies).
func BenchmarkEngine_Propose(b *testing.B) {
	const groups = 256
	c, err := replicationtest.NewCluster(replicationtest.Config{
		Nodes: 3, Groups: groups,
		Engine: replication.Config{TickInterval: 100 * time.Millisecond},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 64)
	b.ReportAllocs()
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i, g := range c.GroupIDs() {
		n := b.N / groups
		if i < b.N%groups {
			n++
		}
		wg.Go(func() {
			var e *replication.Engine
			for done := 0; done < n; {
				if e == nil {
					e = c.Engine(c.Leader(g))
					if e == nil {
						time.Sleep(time.Millisecond)
						continue
					}
				}
				if _, err := e.Propose(ctx, g, payload); err != nil {
					if ctx.Err() != nil {
						mu.Lock()
						firstErr = fmt.Errorf("group %d: %w", g, err)
						mu.Unlock()
						return
					}
					e = nil // leadership moved: find the leader again
					continue
				}
				done++
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	cpu := time.Duration(ru1.Utime.Nano()-ru0.Utime.Nano()) + time.Duration(ru1.Stime.Nano()-ru0.Stime.Nano())
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/write")
}
