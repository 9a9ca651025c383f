package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/bench/peers"
)

// recordBody is a 256-byte JSON record body.
var recordBody = json.RawMessage(`"` + strings.Repeat("r", 254) + `"`)

// logAppends runs producers goroutines, each appending batches of batch records
// to log (i mod logs), one batch in flight each, for d. OpsPerSec is records/s.
func logAppends(dir string, d time.Duration, logs, producers, batch int) (result, error) {
	rt, err := holdfast.Open(holdfast.Options{DataDir: dir, Logger: quietLogger(), TypeOptions: func(string) holdfast.TypeOptions {
		o := defaultTypeOptions()
		o.Log.MaxBatchSize = max(batch, 100)
		return o
	}})
	if err != nil {
		return result{}, err
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	ls := make([]*holdfast.Log, logs)
	for i := range ls {
		ls[i] = rt.Log("app_bench", "stream", fmt.Sprintf("log-%d", i))
		if _, err := ls[i].Append(ctx, holdfast.LogInput{Body: recordBody}); err != nil { // activate
			return result{}, err
		}
	}
	before := rt.Node().Stats().Pipeline
	in := make([]holdfast.LogInput, batch)
	for i := range in {
		in[i].Body = recordBody
	}
	m := startMeter()
	iv, err := runWorkers(producers, d, func(p int) (int64, error) {
		_, err := ls[p%logs].Append(ctx, in...)
		return int64(batch), err
	})
	if err != nil {
		return result{}, err
	}
	after := rt.Node().Stats().Pipeline
	r := result{
		OpsPerSec:     iv.perSec(),
		SyncsPerWrite: float64(after.Commits-before.Commits) / float64(after.Writes-before.Writes),
	}
	m.stop(&r, iv.ops)
	return r, nil
}

func defaultTypeOptions() holdfast.TypeOptions {
	o := holdfast.TypeOptions{ChangeLogEntries: 10000}
	o.Log.MaxBatchSize = 100
	return o
}

// logLarge fills one log with n records (batches of 1,000), then measures a full
// sequential read (pages of 1,000) three times and the time from opening the
// data directory to the log's first read, five times; it reports the medians.
func logLarge(dir string, n int) (result, error) {
	opts := holdfast.Options{DataDir: dir, Logger: quietLogger(), TypeOptions: func(string) holdfast.TypeOptions {
		o := defaultTypeOptions()
		o.Log.MaxBatchSize = 1000
		return o
	}}
	rt, err := holdfast.Open(opts)
	if err != nil {
		return result{}, err
	}
	ctx := context.Background()
	l := rt.Log("app_bench", "stream", "big")
	in := make([]holdfast.LogInput, 1000)
	for i := range in {
		in[i].Body = recordBody
	}
	fillStart := time.Now()
	for written := 0; written < n; written += len(in) {
		if _, err := l.Append(ctx, in[:min(len(in), n-written)]...); err != nil {
			return result{}, err
		}
	}
	fill := time.Since(fillStart)
	var reads []float64
	for pass := 0; pass < 3; pass++ {
		start := time.Now()
		var from uint64
		got := 0
		for {
			page, err := l.Read(ctx, from, 1000)
			if err != nil {
				return result{}, err
			}
			if len(page.Records) == 0 {
				break
			}
			got += len(page.Records)
			from = page.NextOffset
		}
		if got != n {
			return result{}, fmt.Errorf("read %d records of %d", got, n)
		}
		reads = append(reads, float64(got)/time.Since(start).Seconds())
	}
	if err := rt.Close(ctx); err != nil {
		return result{}, err
	}
	var starts []float64
	for i := 0; i < 5; i++ {
		start := time.Now()
		rt, err := holdfast.Open(opts)
		if err != nil {
			return result{}, err
		}
		page, err := rt.Log("app_bench", "stream", "big").Read(ctx, uint64(n-1), 1)
		if err != nil || len(page.Records) != 1 {
			return result{}, fmt.Errorf("first read after start: %v", err)
		}
		starts = append(starts, time.Since(start).Seconds())
		if err := rt.Close(ctx); err != nil {
			return result{}, err
		}
	}
	sort.Float64s(reads)
	sort.Float64s(starts)
	return result{
		LogRecords:        n,
		FillRecordsPerSec: float64(n) / fill.Seconds(),
		ReadRecordsPerSec: reads[len(reads)/2],
		StartSeconds:      starts[len(starts)/2],
	}, nil
}

// leaseCycles runs pollers goroutines that lease (up to 10 records) and ack, on
// one consumer of one log, for d. OpsPerSec is lease+ack cycles per second.
func leaseCycles(dir string, d time.Duration, pollers int) (result, error) {
	rt, err := holdfast.Open(holdfast.Options{DataDir: dir, Logger: quietLogger(), TypeOptions: func(string) holdfast.TypeOptions {
		o := defaultTypeOptions()
		o.Log.MaxBatchSize = 100 // a producer's appends of 100; leases ask for 10
		o.Log.Leases = &holdfast.LeaseOptions{MaxParallelism: pollers, LeaseDuration: 30 * time.Second}
		return o
	}})
	if err != nil {
		return result{}, err
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	l := rt.Log("app_bench", "jobs", "q")
	in := make([]holdfast.LogInput, 100)
	for i := range in {
		in[i].Body = recordBody
	}
	// As many records as the peers' lease case puts in its log.
	for n := 0; n < peers.LeaseRecords; n += len(in) {
		if _, err := l.Append(ctx, in...); err != nil {
			return result{}, err
		}
	}
	commits0, m := rt.Node().Stats().Pipeline.Commits, startMeter()
	iv, err := runWorkers(pollers, d, func(int) (int64, error) {
		lease, err := l.Lease(ctx, "workers", 10)
		if err != nil {
			return 0, err
		}
		if lease == nil {
			// Every poller holds at most one range, so fewer than
			// maxParallelism are held: nothing is left to lease.
			return 0, errDry
		}
		_, err = l.Ack(ctx, "workers", lease.BatchID)
		return 1, err
	})
	return cycleResult(rt, commits0, m, iv, err)
}

// redeliveryDelay leases ranges of 100 ms and lets them expire while a poller
// asks for a lease every millisecond; it reports the p99 of the time from a
// range's expiry to its redelivery.
func redeliveryDelay(dir string, trials int) (result, error) {
	rt, err := holdfast.Open(holdfast.Options{DataDir: dir, Logger: quietLogger(), TypeOptions: func(string) holdfast.TypeOptions {
		o := defaultTypeOptions()
		o.Log.Leases = &holdfast.LeaseOptions{MaxParallelism: 1, LeaseDuration: 100 * time.Millisecond}
		return o
	}})
	if err != nil {
		return result{}, err
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	l := rt.Log("app_bench", "jobs", "redeliver")
	if _, err := l.Append(ctx, holdfast.LogInput{Body: recordBody}); err != nil {
		return result{}, err
	}
	var delays []float64
	held, err := l.Lease(ctx, "w", 1)
	if err != nil || held == nil {
		return result{}, fmt.Errorf("lease: %v", err)
	}
	for len(delays) < trials {
		time.Sleep(time.Millisecond)
		again, err := l.Lease(ctx, "w", 1)
		if err != nil {
			return result{}, err
		}
		if again != nil { // the expired range, redelivered; it expires in turn
			delays = append(delays, float64(time.Now().UnixMilli()-held.ExpiresAt))
			held = again
		}
	}
	sort.Float64s(delays)
	return result{RedeliveryP99Ms: delays[len(delays)*99/100], RedeliveryP50Ms: delays[len(delays)/2]}, nil
}
