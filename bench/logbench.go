package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast"
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
	var records atomic.Int64
	var failed atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			l := ls[p%logs]
			in := make([]holdfast.LogInput, batch)
			for i := range in {
				in[i].Body = recordBody
			}
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := l.Append(ctx, in...); err != nil {
					failed.Store(err)
					return
				}
				records.Add(int64(batch))
			}
		}(p)
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		return result{}, err
	}
	after := rt.Node().Stats().Pipeline
	return result{
		OpsPerSec:     float64(records.Load()) / elapsed.Seconds(),
		SyncsPerWrite: float64(after.Commits-before.Commits) / float64(after.Writes-before.Writes),
	}, nil
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
