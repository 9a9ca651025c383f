package peers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

// SetupTimeout bounds the time every worker of a workload gets to complete
// its first operation (connecting included) before the warm-up starts.
var SetupTimeout = 60 * time.Second

// OpTimeout bounds one operation of a workload.
var OpTimeout = 60 * time.Second

// LeaseRecords is how many records LeaseCycles puts in the log before it
// starts consuming. If consumers take them all before the measured interval
// is over, the interval ends early and Result.Note says so.
var LeaseRecords = 1_000_000

// leaseBatch is how many records one lease cycle takes at most.
const leaseBatch = 10

// errDry tells the runner that a consumer found no record left to take.
var errDry = errors.New("peers: no record left to consume")

// op is one operation of worker w; it returns how many operations it
// completed (records for Batches).
type op func(ctx context.Context, w int) (int64, error)

// measured is what the runner measured; the workloads add their notes.
type measured struct {
	Result
	total int64 // operations completed over the whole run, warm-up included
}

// run starts workers goroutines repeating fn, waits until each has completed
// one operation, runs Warmup unmeasured and then d measured, and stops them.
// Disk bytes are read from /proc/<pid>/io. The measured interval ends early
// when a worker reports errDry.
func run(workers int, d time.Duration, pid int, fn op) (measured, error) {
	return runServers(workers, d, []int{pid}, fn)
}

// runServers is run for a peer whose server is several processes (the members
// of a replicated peer): its disk bytes and server CPU are the sums over pids.
// It also measures the latency of every operation that started and completed
// within the measured interval.
func runServers(workers int, d time.Duration, pids []int, fn op) (measured, error) {
	if len(pids) == 0 {
		return measured{}, errors.New("peers: no server process to measure")
	}
	if workers < 1 {
		return measured{}, fmt.Errorf("peers: %d workers", workers)
	}
	if d <= 0 {
		return measured{}, fmt.Errorf("peers: measured duration %v", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		ops, ready atomic.Int64
		stop       atomic.Bool
		wg         sync.WaitGroup
		errc       = make(chan error, 1)
		dryc       = make(chan struct{})
		dryOnce    sync.Once
		dryAt      time.Time
		// measuring is set over the measured interval; latencies[w] is
		// worker w's, written by it alone and read after it stopped.
		measuring atomic.Bool
		latencies = make([][]time.Duration, workers)
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			for !stop.Load() {
				inside := measuring.Load()
				began := time.Now()
				n, err := fn(ctx, w)
				if inside && err == nil && measuring.Load() {
					latencies[w] = append(latencies[w], time.Since(began))
				}
				if err != nil {
					if stop.Load() {
						return
					}
					if errors.Is(err, errDry) {
						dryOnce.Do(func() { dryAt = time.Now(); close(dryc) })
						return
					}
					select {
					case errc <- fmt.Errorf("worker %d: %w", w, err):
					default:
					}
					return
				}
				ops.Add(n)
				if first {
					first = false
					ready.Add(1)
				}
			}
		}()
	}

	// finish stops the workers and waits for them, bounded.
	finish := func() error {
		stop.Store(true)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
			return nil
		case <-time.After(OpTimeout):
		}
		cancel()
		select {
		case <-done:
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("peers: workers did not stop")
		}
	}
	fail := func(err error) (measured, error) {
		if ferr := finish(); ferr != nil {
			err = errors.Join(err, ferr)
		}
		return measured{}, err
	}

	// Set-up: every worker has done one operation (and so has connected).
	setupBy := time.Now().Add(SetupTimeout)
	for ready.Load() < int64(workers) {
		select {
		case err := <-errc:
			return fail(fmt.Errorf("peers: during set-up: %w", err))
		case <-dryc:
			return fail(errors.New("peers: ran out of records during set-up"))
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(setupBy) {
			return fail(fmt.Errorf("peers: only %d of %d workers completed an operation within %v", ready.Load(), workers, SetupTimeout))
		}
	}
	// Warm-up.
	select {
	case err := <-errc:
		return fail(fmt.Errorf("peers: during warm-up: %w", err))
	case <-dryc:
		return fail(errors.New("peers: ran out of records during warm-up"))
	case <-time.After(Warmup):
	}

	// Measured interval.
	var m measured
	var notes []string
	disk0, diskErr := diskWriteBytes(pids)
	cpu0, srv0 := ProcessCPU(), pidsCPU(pids)
	ops0 := ops.Load()
	measuring.Store(true)
	t0 := time.Now()
	var t1 time.Time
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err := <-errc:
		return fail(fmt.Errorf("peers: during the measured interval: %w", err))
	case <-dryc:
		t1 = dryAt
		notes = append(notes, fmt.Sprintf("ran out of records after %v of %v: measured over that", t1.Sub(t0).Round(time.Millisecond), d))
	case <-timer.C:
		t1 = time.Now()
	}
	measuring.Store(false)
	ops1 := ops.Load()
	cpu1, srv1 := ProcessCPU(), pidsCPU(pids)
	disk1, err := diskWriteBytes(pids)
	if diskErr == nil {
		diskErr = err
	}
	if err := finish(); err != nil {
		return measured{}, err
	}
	select {
	case err := <-errc:
		return measured{}, fmt.Errorf("peers: while stopping: %w", err)
	default:
	}

	m.Ops = ops1 - ops0
	m.Elapsed = t1.Sub(t0)
	if m.Elapsed > 0 {
		m.OpsPerSec = float64(m.Ops) / m.Elapsed.Seconds()
	}
	m.ClientCPU = cpu1 - cpu0
	m.ServerCPU = srv1 - srv0
	if len(pids) == 1 && pids[0] == os.Getpid() {
		m.ServerCPU = m.ClientCPU
	}
	m.LatencyP50, m.LatencyP99 = percentiles(latencies)
	if diskErr != nil {
		notes = append(notes, "disk bytes unavailable: "+diskErr.Error())
	} else if disk1 >= disk0 {
		m.DiskBytes = disk1 - disk0
	}
	m.total = ops.Load()
	m.Note = joinNotes(notes...)
	return m, nil
}

// diskWriteBytes is DiskWriteBytes summed over pids.
func diskWriteBytes(pids []int) (uint64, error) {
	var sum uint64
	for _, pid := range pids {
		n, err := DiskWriteBytes(pid)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// pidsCPU is PIDCPU summed over pids.
func pidsCPU(pids []int) time.Duration {
	var sum time.Duration
	for _, pid := range pids {
		sum += PIDCPU(pid)
	}
	return sum
}

// percentiles returns the median and the 99th percentile (nearest rank) of
// every worker's latencies together; zeros when there are none.
func percentiles(perWorker [][]time.Duration) (p50, p99 time.Duration) {
	all := slices.Concat(perWorker...)
	if len(all) == 0 {
		return 0, 0
	}
	slices.Sort(all)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(all)))) - 1
		return all[max(0, min(i, len(all)-1))]
	}
	return rank(0.50), rank(0.99)
}

func joinNotes(notes ...string) string {
	out := ""
	for _, n := range notes {
		if n == "" {
			continue
		}
		if out != "" {
			out += "; "
		}
		out += n
	}
	return out
}

func checkCounts(what string, counts ...int) error {
	for _, c := range counts {
		if c < 1 {
			return fmt.Errorf("peers: %s: counts must be positive, got %v", what, counts)
		}
	}
	return nil
}

// keyNames returns prefix+strconv.Itoa(w mod n) for every worker w.
func keyNames(prefix string, workers, n int) []string {
	names := make([]string, workers)
	for w := range names {
		names[w] = prefix + strconv.Itoa(w%n)
	}
	return names
}

// ---------------------------------------------------------------- Redis

const redisNote = "Redis appendonly yes, appendfsync always: the AOF is fsynced (once per event-loop iteration, for all the commands of that iteration) before replies are sent; ClientCPU is the client process only, DiskBytes is redis-server's"

// Writes runs callers goroutines, caller c doing SET obj:<c mod objects>
// with the 256-byte payload, one write in flight per caller, over a pool of
// callers+8 connections. Ops counts acknowledged writes.
func (r *Redis) Writes(objects, callers int, d time.Duration) (Result, error) {
	if err := checkCounts("redis writes", objects, callers); err != nil {
		return Result{}, err
	}
	return r.sets("obj:", objects, callers, d)
}

// KVWrites is Writes under its own name for the key-value table: callers
// goroutines each doing SET kv:<c mod keys>.
func (r *Redis) KVWrites(callers, keys int, d time.Duration) (Result, error) {
	if err := checkCounts("redis kv writes", callers, keys); err != nil {
		return Result{}, err
	}
	return r.sets("kv:", keys, callers, d)
}

func (r *Redis) sets(prefix string, keys, callers int, d time.Duration) (Result, error) {
	c := r.NewClient(callers + 8)
	defer c.Close()
	names := keyNames(prefix, callers, keys)
	m, err := run(callers, d, r.PID(), func(ctx context.Context, w int) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		if err := c.Set(ctx, names[w], payload, 0).Err(); err != nil {
			return 0, fmt.Errorf("set %s: %w", names[w], err)
		}
		return 1, nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("peers: redis writes (%d keys, %d callers): %w", keys, callers, err)
	}
	m.Note = joinNotes(redisNote, m.Note)
	return m.Result, nil
}

// Increments runs callers goroutines doing INCR on keys inc:<i mod objects>
// over a pool of callers+8 connections. With pipeline 1 each caller has one
// INCR in flight (caller c on key c mod objects); with pipeline n each sends n
// INCRs at once in one pipeline (not MULTI: each stands alone, as a batch's
// operations do) on n consecutive keys, moving on by n each round. Ops counts
// increments.
func (r *Redis) Increments(objects, callers, pipeline int, d time.Duration) (Result, error) {
	if err := checkCounts("redis increments", objects, callers, pipeline); err != nil {
		return Result{}, err
	}
	c := r.NewClient(callers + 8)
	defer c.Close()
	names := keyNames("inc:", objects, objects)
	next := make([]int, callers) // each caller's next key
	for w := range next {
		next[w] = w * pipeline % objects
	}
	m, err := run(callers, d, r.PID(), func(ctx context.Context, w int) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		if pipeline == 1 {
			if err := c.Incr(ctx, names[w%objects]).Err(); err != nil {
				return 0, fmt.Errorf("incr: %w", err)
			}
			return 1, nil
		}
		first := next[w]
		next[w] = (first + callers*pipeline) % objects
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range pipeline {
				p.Incr(ctx, names[(first+i)%objects])
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("pipeline of %d incr: %w", pipeline, err)
		}
		return int64(pipeline), nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("peers: redis increments (%d keys, %d callers, pipelines of %d): %w", objects, callers, pipeline, err)
	}
	m.Note = joinNotes(redisNote, m.Note)
	return m.Result, nil
}

// Batches appends batches of batch records to the stream "log" from one
// producer: each batch is one MULTI/EXEC pipeline of batch XADDs, so it is
// atomic and fsynced before EXEC replies. Ops counts records.
func (r *Redis) Batches(batch int, d time.Duration) (Result, error) {
	m, err := r.batches(batch, d)
	return m.Result, err
}

func (r *Redis) batches(batch int, d time.Duration) (measured, error) {
	if err := checkCounts("redis batches", batch); err != nil {
		return measured{}, err
	}
	c := r.NewClient(4)
	defer c.Close()
	values := []any{"p", payload}
	m, err := run(1, d, r.PID(), func(ctx context.Context, _ int) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for range batch {
				p.XAdd(ctx, &redis.XAddArgs{Stream: "log", Values: values})
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("multi/exec of %d xadd: %w", batch, err)
		}
		return int64(batch), nil
	})
	if err != nil {
		return measured{}, fmt.Errorf("peers: redis batches of %d: %w", batch, err)
	}
	m.Note = joinNotes(redisNote, "Ops counts records", m.Note)
	return m, nil
}

// fillStream appends n payload records to stream with pipelines of 1,000
// XADDs from 4 connections.
func (r *Redis) fillStream(stream string, n int) error {
	const chunk, conns = 1000, 4
	c := r.NewClient(conns + 2)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), LoadTimeout)
	defer cancel()
	var next atomic.Int64
	errc := make(chan error, conns)
	values := []any{"p", payload}
	for range conns {
		go func() {
			for {
				start := next.Add(chunk) - chunk
				if start >= int64(n) {
					errc <- nil
					return
				}
				k := min(int64(chunk), int64(n)-start)
				_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for range k {
						p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values})
					}
					return nil
				})
				if err != nil {
					errc <- fmt.Errorf("peers: fill redis stream %s: %w", stream, err)
					return
				}
			}
		}()
	}
	var errs []error
	for range conns {
		errs = append(errs, <-errc)
	}
	return errors.Join(errs...)
}

// LeaseCycles puts LeaseRecords records in the stream "log" with the
// consumer group "g", then runs consumers goroutines, consumer i doing
// XREADGROUP GROUP g c<i> COUNT 10 STREAMS log > and then XACK of the ids it
// got. Both commands change the group's state, so both are fsynced before
// their reply. Ops counts cycles.
func (r *Redis) LeaseCycles(consumers int, d time.Duration) (Result, error) {
	if err := checkCounts("redis lease cycles", consumers); err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := r.Client()
	if admin == nil {
		return Result{}, errors.New("peers: redis lease cycles: server is not running")
	}
	if err := admin.XGroupCreateMkStream(ctx, "log", "g", "$").Err(); err != nil && !isBusyGroup(err) {
		return Result{}, fmt.Errorf("peers: redis lease cycles: create group: %w", err)
	}
	fillStart := time.Now()
	if err := r.fillStream("log", LeaseRecords); err != nil {
		return Result{}, fmt.Errorf("peers: redis lease cycles: %w", err)
	}
	fillTook := time.Since(fillStart)

	c := r.NewClient(consumers + 8)
	defer c.Close()
	names := keyNames("c", consumers, consumers)
	m, err := run(consumers, d, r.PID(), func(ctx context.Context, w int) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		streams, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: "g", Consumer: names[w], Streams: []string{"log", ">"}, Count: leaseBatch, Block: -1,
		}).Result()
		if errors.Is(err, redis.Nil) {
			return 0, errDry
		}
		if err != nil {
			return 0, fmt.Errorf("xreadgroup: %w", err)
		}
		var ids []string
		for _, s := range streams {
			for _, msg := range s.Messages {
				ids = append(ids, msg.ID)
			}
		}
		if len(ids) == 0 {
			return 0, errDry
		}
		acked, err := c.XAck(ctx, "log", "g", ids...).Result()
		if err != nil {
			return 0, fmt.Errorf("xack: %w", err)
		}
		if acked != int64(len(ids)) {
			return 0, fmt.Errorf("xack acknowledged %d of %d", acked, len(ids))
		}
		return 1, nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("peers: redis lease cycles (%d consumers): %w", consumers, err)
	}
	m.Note = joinNotes(redisNote,
		"Ops counts cycles (XREADGROUP COUNT 10 + XACK); XREADGROUP and XACK are both fsynced before replying",
		fmt.Sprintf("pre-filled %d records in %v", LeaseRecords, fillTook.Round(time.Millisecond)),
		m.Note)
	return m.Result, nil
}

func isBusyGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "BUSYGROUP")
}

// FillAndRestart appends records payload records to the stream "fill" (with
// pipelines), restarts the server and returns the seconds from launching it
// until it has loaded its data.
func (r *Redis) FillAndRestart(records int) (float64, error) {
	if err := checkCounts("redis fill and restart", records); err != nil {
		return 0, err
	}
	if err := r.fillStream("fill", records); err != nil {
		return 0, err
	}
	took, err := r.Restart()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := r.Client().XLen(ctx, "fill").Result()
	if err != nil {
		return 0, fmt.Errorf("peers: redis fill and restart: xlen: %w", err)
	}
	if n < int64(records) {
		return 0, fmt.Errorf("peers: redis fill and restart: %d records after restart, want %d", n, records)
	}
	return took.Seconds(), nil
}

// ---------------------------------------------------------------- JetStream

const jetStreamNote = "JetStream file store with SyncAlways: every stream write is fsynced before its publish ack; the server is embedded, so ClientCPU and DiskBytes cover client and server together"

// jsFor returns a JetStream context with room for maxPending async publishes.
func (j *JetStream) jsFor(maxPending int) (jetstream.JetStream, error) {
	nc := j.Conn()
	if nc == nil {
		return nil, errors.New("peers: jetstream is not running")
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(maxPending))
	if err != nil {
		return nil, fmt.Errorf("peers: jetstream client: %w", err)
	}
	return js, nil
}

func (j *JetStream) createStream(cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	js := j.JetStream()
	if js == nil {
		return nil, errors.New("peers: jetstream is not running")
	}
	cfg.Storage = jetstream.FileStorage
	cfg.Replicas = 1
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("peers: create stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// Writes runs callers goroutines, caller c publishing the payload to
// obj.<c mod objects> on the stream OBJ (subjects obj.>, file storage, one
// message kept per subject, so it holds the latest value of each object) and
// waiting for the ack. Ops counts acknowledged writes.
func (j *JetStream) Writes(objects, callers int, d time.Duration) (Result, error) {
	if err := checkCounts("jetstream writes", objects, callers); err != nil {
		return Result{}, err
	}
	if _, err := j.createStream(jetstream.StreamConfig{Name: "OBJ", Subjects: []string{"obj.>"}, MaxMsgsPerSubject: 1}); err != nil {
		return Result{}, err
	}
	js := j.JetStream()
	subjects := keyNames("obj.", callers, objects)
	m, err := run(callers, d, j.PID(), func(ctx context.Context, w int) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		if _, err := js.Publish(ctx, subjects[w], payload); err != nil {
			return 0, fmt.Errorf("publish %s: %w", subjects[w], err)
		}
		return 1, nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("peers: jetstream writes (%d objects, %d callers): %w", objects, callers, err)
	}
	m.Note = joinNotes(jetStreamNote, m.Note)
	return m.Result, nil
}

// KVWrites runs callers goroutines, caller c doing Put of k<c mod keys> in
// the key-value bucket KV (file storage, history 1).
func (j *JetStream) KVWrites(callers, keys int, d time.Duration) (Result, error) {
	if err := checkCounts("jetstream kv writes", callers, keys); err != nil {
		return Result{}, err
	}
	js := j.JetStream()
	if js == nil {
		return Result{}, errors.New("peers: jetstream is not running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "KV", History: 1, Storage: jetstream.FileStorage, Replicas: 1})
	cancel()
	if err != nil {
		return Result{}, fmt.Errorf("peers: jetstream kv writes: create bucket: %w", err)
	}
	names := keyNames("k", callers, keys)
	m, err := run(callers, d, j.PID(), func(ctx context.Context, w int) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		if _, err := kv.Put(ctx, names[w], payload); err != nil {
			return 0, fmt.Errorf("put %s: %w", names[w], err)
		}
		return 1, nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("peers: jetstream kv writes (%d callers, %d keys): %w", callers, keys, err)
	}
	m.Note = joinNotes(jetStreamNote, m.Note)
	return m.Result, nil
}

// Batches publishes batches of batch messages to the stream LOG (subject
// log) from one producer with PublishAsync, waits for every ack of a batch,
// then sends the next. Ops counts records. (JetStream's batch is not atomic:
// each message is stored, and fsynced, on its own.)
func (j *JetStream) Batches(batch int, d time.Duration) (Result, error) {
	m, err := j.batches(batch, d)
	return m.Result, err
}

func (j *JetStream) batches(batch int, d time.Duration) (measured, error) {
	if err := checkCounts("jetstream batches", batch); err != nil {
		return measured{}, err
	}
	if _, err := j.createStream(jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log"}}); err != nil {
		return measured{}, err
	}
	js, err := j.jsFor(max(2*batch, 256))
	if err != nil {
		return measured{}, err
	}
	defer js.CleanupPublisher()
	futures := make([]jetstream.PubAckFuture, batch)
	m, err := run(1, d, j.PID(), func(ctx context.Context, _ int) (int64, error) {
		for i := range futures {
			f, err := js.PublishAsync("log", payload)
			if err != nil {
				return 0, fmt.Errorf("publish async: %w", err)
			}
			futures[i] = f
		}
		timeout := time.NewTimer(OpTimeout)
		defer timeout.Stop()
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return 0, fmt.Errorf("publish ack: %w", err)
			case <-timeout.C:
				return 0, fmt.Errorf("no ack within %v", OpTimeout)
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		return int64(batch), nil
	})
	if err != nil {
		return measured{}, fmt.Errorf("peers: jetstream batches of %d: %w", batch, err)
	}
	m.Note = joinNotes(jetStreamNote, "Ops counts records", m.Note)
	return m, nil
}

// fill appends n payload messages to subject of the stream cfg quickly: it
// restarts the server with SyncAlways off, publishes asynchronously, and
// restarts it with SyncAlways on again (a clean shutdown writes everything
// out). The records on disk are the same as with SyncAlways; only filling is
// faster. It returns the time it took.
func (j *JetStream) fill(cfg jetstream.StreamConfig, subject string, n int) (time.Duration, error) {
	t0 := time.Now()
	if _, err := j.createStream(cfg); err != nil {
		return 0, err
	}
	if _, err := j.restart(false); err != nil {
		return 0, fmt.Errorf("peers: fill %s: %w", cfg.Name, err)
	}
	var (
		errMu    sync.Mutex
		failed   int
		firstErr error
	)
	nc := j.Conn()
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncTimeout(OpTimeout),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			errMu.Lock()
			defer errMu.Unlock()
			if failed++; firstErr == nil {
				firstErr = err
			}
		}))
	if err != nil {
		return 0, fmt.Errorf("peers: fill %s: %w", cfg.Name, err)
	}
	defer js.CleanupPublisher()
	// A publish waits up to OpTimeout for room among the 4,096 pending, not
	// the client's default 200 ms: on a loaded machine (CI) the acks fell
	// that far behind and the fill failed with ErrTooManyStalledMsgs.
	for i := range n {
		if _, err := js.PublishAsync(subject, payload, jetstream.WithStallWait(OpTimeout)); err != nil {
			return 0, fmt.Errorf("peers: fill %s: publish %d: %w", cfg.Name, i, err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(LoadTimeout):
		return 0, fmt.Errorf("peers: fill %s: acks not complete within %v", cfg.Name, LoadTimeout)
	}
	errMu.Lock()
	f, ferr := failed, firstErr
	errMu.Unlock()
	if f > 0 {
		return 0, fmt.Errorf("peers: fill %s: %d publishes failed, first: %w", cfg.Name, f, ferr)
	}
	if _, err := j.restart(true); err != nil {
		return 0, fmt.Errorf("peers: fill %s: %w", cfg.Name, err)
	}
	if !j.SyncAlways() {
		return 0, fmt.Errorf("peers: fill %s: SyncAlways is off after the fill", cfg.Name)
	}
	return time.Since(t0), nil
}

// LeaseCycles puts LeaseRecords records in the stream LOG (subject log),
// creates one durable pull consumer (explicit acks, no limit on pending
// acks) and runs consumers goroutines, each doing Fetch(10) and then
// DoubleAck (an ack that waits for the server's confirmation) of each
// message. Ops counts cycles.
//
// JetStream does not fsync consumer acks: the consumer's state is written by
// a background flusher after the ack is confirmed, so its ack promises less
// than Holdfast's durable ack (and Redis's XACK, fsynced before the reply).
// The fill runs with SyncAlways off and restarts the server with it on
// before consuming (see fill).
func (j *JetStream) LeaseCycles(consumers int, d time.Duration) (Result, error) {
	if err := checkCounts("jetstream lease cycles", consumers); err != nil {
		return Result{}, err
	}
	fillTook, err := j.fill(jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log"}}, "log", LeaseRecords)
	if err != nil {
		return Result{}, fmt.Errorf("peers: jetstream lease cycles: %w", err)
	}
	js := j.JetStream()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	cons, err := js.CreateOrUpdateConsumer(ctx, "LOG", jetstream.ConsumerConfig{
		Durable:       "g",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       time.Minute,
		MaxAckPending: -1,
		MaxWaiting:    max(512, 2*consumers),
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	cancel()
	if err != nil {
		return Result{}, fmt.Errorf("peers: jetstream lease cycles: create consumer: %w", err)
	}
	m, err := run(consumers, d, j.PID(), func(ctx context.Context, _ int) (int64, error) {
		batch, err := cons.Fetch(leaseBatch, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return 0, fmt.Errorf("fetch: %w", err)
		}
		ctx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		n := 0
		var ackErr error
		for msg := range batch.Messages() {
			if ackErr != nil {
				continue // drain
			}
			if err := msg.DoubleAck(ctx); err != nil {
				ackErr = fmt.Errorf("ack: %w", err)
				continue
			}
			n++
		}
		if ackErr != nil {
			return 0, ackErr
		}
		if n == 0 {
			if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
				return 0, fmt.Errorf("fetch: %w", err)
			}
			return 0, errDry
		}
		return 1, nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("peers: jetstream lease cycles (%d consumers): %w", consumers, err)
	}
	m.Note = joinNotes(jetStreamNote,
		"Ops counts cycles (Fetch(10) + DoubleAck of each); JetStream does not fsync consumer acks (consumer state is flushed asynchronously after the ack is confirmed), so its ack promises less than Holdfast's durable ack",
		fmt.Sprintf("pre-filled %d records in %v with SyncAlways off, then restarted with it on", LeaseRecords, fillTook.Round(time.Millisecond)),
		m.Note)
	return m.Result, nil
}

// FillAndRestart appends records payload messages to the stream FILL
// (subject fill; filled with SyncAlways off, see fill), restarts the server
// and returns the seconds from creating the new server until every stream
// answers stream info with its message count.
func (j *JetStream) FillAndRestart(records int) (float64, error) {
	if err := checkCounts("jetstream fill and restart", records); err != nil {
		return 0, err
	}
	if _, err := j.fill(jetstream.StreamConfig{Name: "FILL", Subjects: []string{"fill"}}, "fill", records); err != nil {
		return 0, err
	}
	took, err := j.Restart()
	if err != nil {
		return 0, err
	}
	return took.Seconds(), nil
}

// StreamAdds runs callers goroutines appending the payload, one in flight each,
// to one stream: XADD q * p <payload>. Ops counts appends.
func (r *Redis) StreamAdds(callers int, d time.Duration) (Result, error) {
	if err := checkCounts("redis stream adds", callers); err != nil {
		return Result{}, err
	}
	c := r.NewClient(callers + 8)
	defer c.Close()
	values := []any{"p", payload}
	m, err := run(callers, d, r.PID(), func(ctx context.Context, _ int) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: "q", Values: values}).Err(); err != nil {
			return 0, fmt.Errorf("xadd: %w", err)
		}
		return 1, nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("peers: redis stream adds (%d callers): %w", callers, err)
	}
	m.Note = joinNotes(redisNote, m.Note)
	return m.Result, nil
}

// StreamAdds runs callers goroutines publishing the payload, one in flight
// each, to the subject q of the stream Q, waiting for each ack.
func (j *JetStream) StreamAdds(callers int, d time.Duration) (Result, error) {
	if err := checkCounts("jetstream stream adds", callers); err != nil {
		return Result{}, err
	}
	if _, err := j.createStream(jetstream.StreamConfig{Name: "Q", Subjects: []string{"q"}}); err != nil {
		return Result{}, err
	}
	js := j.JetStream()
	m, err := run(callers, d, j.PID(), func(ctx context.Context, _ int) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		if _, err := js.Publish(ctx, "q", payload); err != nil {
			return 0, fmt.Errorf("publish: %w", err)
		}
		return 1, nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("peers: jetstream stream adds (%d callers): %w", callers, err)
	}
	m.Note = joinNotes(jetStreamNote, m.Note)
	return m.Result, nil
}
