package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/bench/peers"
)

// The write-ahead queue's cases: enqueues (single messages from many
// producers, batches of 100), receive+ack cycles, and the latency from an
// enqueue to a push handler.

var queueBody = func() json.RawMessage {
	b, _ := json.Marshal(string(peers.Payload()))
	return b
}()

func queueRuntime(dir string, types []holdfast.TypeSpec) (*holdfast.Runtime, error) {
	return holdfast.Open(holdfast.Options{DataDir: dir, Logger: quietLogger(), Types: types, TypeOptions: func(string) holdfast.TypeOptions {
		o := defaultTypeOptions()
		o.Queue.MaxPending = 1 << 30 // the cases measure throughput, not backpressure
		o.Queue.VisibilityTimeout = time.Minute
		return o
	}})
}

// queueEnqueue runs producers goroutines on one queue, each enqueueing batch
// messages (generated ids) per call, one call in flight each. OpsPerSec counts
// messages.
func queueEnqueue(dir string, d time.Duration, producers, batch int) (result, error) {
	rt, err := queueRuntime(dir, nil)
	if err != nil {
		return result{}, err
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	q := rt.Queue("app_bench", "jobs", "q")
	in := make([]holdfast.QueueMessageIn, batch)
	for i := range in {
		in[i].Payload = queueBody
	}
	if _, err := q.Enqueue(ctx, in[0]); err != nil { // activate
		return result{}, err
	}
	before := rt.Node().Stats().Pipeline
	m := startMeter()
	iv, err := runWorkers(producers, d, func(int) (int64, error) {
		_, err := q.Enqueue(ctx, in...)
		return int64(batch), err
	})
	if err != nil {
		return result{}, err
	}
	after := rt.Node().Stats().Pipeline
	r := result{OpsPerSec: iv.perSec(), SyncsPerWrite: float64(after.Commits-before.Commits) / float64(max(1, iv.ops))}
	m.stop(&r, iv.ops)
	return r, nil
}

// queueCycles fills one queue with peers.LeaseRecords messages, then runs
// consumers goroutines that receive up to 10 and ack them, one cycle in
// flight each. OpsPerSec counts cycles.
func queueCycles(dir string, d time.Duration, consumers int) (result, error) {
	rt, err := queueRuntime(dir, nil)
	if err != nil {
		return result{}, err
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	q := rt.Queue("app_bench", "jobs", "q")
	in := make([]holdfast.QueueMessageIn, 100)
	for i := range in {
		in[i].Payload = queueBody
	}
	for n := 0; n < peers.LeaseRecords; n += len(in) {
		if _, err := q.Enqueue(ctx, in...); err != nil {
			return result{}, err
		}
	}
	commits0, m := rt.Node().Stats().Pipeline.Commits, startMeter()
	iv, err := runWorkers(consumers, d, func(int) (int64, error) {
		ds, err := q.Receive(ctx, holdfast.QueueReceive{Max: 10})
		if err != nil {
			return 0, err
		}
		if len(ds) == 0 {
			return 0, errDry
		}
		rs := make([]string, len(ds))
		for i, x := range ds {
			rs[i] = x.Receipt
		}
		if a, err := q.Ack(ctx, rs...); err != nil || a.Acked != len(rs) {
			return 0, fmt.Errorf("ack: %+v %v", a, err)
		}
		return 1, nil
	})
	return cycleResult(rt, commits0, m, iv, err)
}

// queueLatency enqueues single messages at rate per second for d, each
// carrying its send time, to a queue whose push handler notes the time from
// the enqueue call to the handler; it reports p50 and p99.
func queueLatency(dir string, d time.Duration, rate int) (result, error) {
	var mu sync.Mutex
	var lat []float64
	handled := make(chan struct{}, 1<<16)
	rt, err := queueRuntime(dir, []holdfast.TypeSpec{{Name: "pushed", Queue: []holdfast.QueueHandler{{
		Handle: func(ctx context.Context, m holdfast.QueueDelivery) (holdfast.QueueResult, error) {
			var s string
			_ = json.Unmarshal(m.Payload, &s)
			if sent, err := strconv.ParseInt(s, 10, 64); err == nil {
				mu.Lock()
				lat = append(lat, float64(time.Now().UnixNano()-sent)/1e6)
				mu.Unlock()
			}
			handled <- struct{}{}
			return holdfast.QueueResult{}, nil
		},
	}}}})
	if err != nil {
		return result{}, err
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	q := rt.Queue("app_bench", "pushed", "q")
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	sent := 0
	for end := time.Now().Add(d); time.Now().Before(end); <-tick.C {
		body, _ := json.Marshal(strconv.FormatInt(time.Now().UnixNano(), 10))
		go func() { _, _ = q.Enqueue(ctx, holdfast.QueueMessageIn{Payload: body}) }()
		sent++
	}
	for got := 0; got < sent; got++ {
		select {
		case <-handled:
		case <-time.After(30 * time.Second):
			return result{}, fmt.Errorf("%d of %d messages reached the handler", got, sent)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Float64s(lat)
	return result{QueueLatencyP50Ms: lat[len(lat)/2], QueueLatencyP99Ms: lat[len(lat)*99/100], Ops: int64(len(lat))}, nil
}
