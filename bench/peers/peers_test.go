package peers

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

const testDuration = 300 * time.Millisecond

func skipIfShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a server and runs workloads; skipped with -short")
	}
}

func startTestRedis(t *testing.T) *Redis {
	t.Helper()
	skipIfShort(t)
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (apt-get install -y redis-server)")
	}
	r, err := StartRedis(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return r
}

func startTestJetStream(t *testing.T) *JetStream {
	t.Helper()
	skipIfShort(t)
	j, err := StartJetStream(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := j.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return j
}

func withLeaseRecords(t *testing.T, n int) {
	t.Helper()
	old := LeaseRecords
	LeaseRecords = n
	t.Cleanup(func() { LeaseRecords = old })
}

func checkResult(t *testing.T, name string, res Result, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	perOp := 0.0
	if res.Ops > 0 {
		perOp = float64(res.DiskBytes) / float64(res.Ops*PayloadSize)
	}
	t.Logf("%-28s %10.0f ops/s  ops=%-7d disk/payload=%6.1f  cpu=%v  elapsed=%v  note: %s",
		name, res.OpsPerSec, res.Ops, perOp, res.ClientCPU.Round(time.Millisecond), res.Elapsed.Round(time.Millisecond), res.Note)
	if res.Ops <= 0 || res.OpsPerSec <= 0 {
		t.Fatalf("%s: no operations measured: %+v", name, res)
	}
	if res.Elapsed <= 0 || res.Elapsed > time.Minute {
		t.Fatalf("%s: measured interval %v", name, res.Elapsed)
	}
}

func TestRedisDurabilitySettings(t *testing.T) {
	r := startTestRedis(t)
	ctx := context.Background()
	for _, want := range [][2]string{{"appendfsync", "always"}, {"appendonly", "yes"}, {"save", ""}} {
		got, err := r.Client().ConfigGet(ctx, want[0]).Result()
		if err != nil {
			t.Fatalf("config get %s: %v", want[0], err)
		}
		if got[want[0]] != want[1] {
			t.Errorf("config %s = %q, want %q", want[0], got[want[0]], want[1])
		}
	}
	// Still so after a restart.
	if _, err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	got, err := r.Client().ConfigGet(ctx, "appendfsync").Result()
	if err != nil || got["appendfsync"] != "always" {
		t.Errorf("after restart: appendfsync = %q, %v", got["appendfsync"], err)
	}
}

func TestRedisWorkloads(t *testing.T) {
	r := startTestRedis(t)
	withLeaseRecords(t, 50_000)
	ctx := context.Background()
	c := r.Client()

	res, err := r.Writes(1, 1, testDuration)
	checkResult(t, "redis writes 1/1", res, err)
	res, err = r.Writes(100, 100, testDuration)
	checkResult(t, "redis writes 100/100", res, err)
	res, err = r.Writes(1, 16, testDuration)
	checkResult(t, "redis writes 1 object/16", res, err)
	if got, err := c.Get(ctx, "obj:99").Bytes(); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("obj:99 = %q, %v", got, err)
	}

	res, err = r.KVWrites(8, 4, testDuration)
	checkResult(t, "redis kv writes 8/4", res, err)
	if got, err := c.Get(ctx, "kv:3").Bytes(); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("kv:3 = %q, %v", got, err)
	}

	res, err = r.StreamAdds(8, testDuration)
	checkResult(t, "redis stream adds 8", res, err)
	if n, err := c.XLen(ctx, "q").Result(); err != nil || n < res.Ops {
		t.Fatalf("xlen q = %d, %v; acknowledged at least %d", n, err, res.Ops)
	}

	m, err := r.batches(100, testDuration)
	checkResult(t, "redis batches of 100", m.Result, err)
	if n, err := c.XLen(ctx, "log").Result(); err != nil || n != m.total {
		t.Fatalf("xlen log = %d, %v; acknowledged %d", n, err, m.total)
	}

	logBefore, _ := c.XLen(ctx, "log").Result()
	res, err = r.LeaseCycles(4, testDuration)
	checkResult(t, "redis lease cycles 4", res, err)
	pending, err := c.XPending(ctx, "log", "g").Result()
	if err != nil {
		t.Fatal(err)
	}
	if pending.Count > 0 {
		t.Errorf("%d records leased but not acknowledged", pending.Count)
	}

	secs, err := r.FillAndRestart(20_000)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("redis restart with 20000 records: %.3fs", secs)
	c = r.Client()
	if n, err := c.XLen(ctx, "log").Result(); err != nil || n != logBefore+int64(LeaseRecords) {
		t.Fatalf("after restart xlen log = %d, %v, want %d", n, err, logBefore+int64(LeaseRecords))
	}
	if got, err := c.Get(ctx, "obj:0").Bytes(); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("after restart obj:0 = %q, %v", got, err)
	}
}

func TestRunEndsWhenRecordsRunOut(t *testing.T) {
	var calls atomic.Int64
	res, err := run(2, 5*time.Second, os.Getpid(), func(ctx context.Context, w int) (int64, error) {
		time.Sleep(time.Millisecond)
		if calls.Add(1) > 1000 { // about 0.5s with two workers
			return 0, errDry
		}
		return 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Elapsed >= 5*time.Second || res.Ops <= 0 || !strings.Contains(res.Note, "ran out of records") {
		t.Fatalf("did not end when the records ran out: %+v", res)
	}
	if _, err := run(2, time.Second, os.Getpid(), func(ctx context.Context, w int) (int64, error) {
		return 0, errors.New("boom")
	}); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("error of a worker not returned: %v", err)
	}
}

func TestJetStreamDurabilitySettings(t *testing.T) {
	j := startTestJetStream(t)
	check := func(when string) {
		t.Helper()
		if o := j.Options(); !o.SyncAlways || !o.JetStream {
			t.Errorf("%s: options SyncAlways=%v JetStream=%v", when, o.SyncAlways, o.JetStream)
		}
		cfg := j.Server().JetStreamConfig()
		if cfg == nil || !cfg.SyncAlways {
			t.Fatalf("%s: server's JetStream config %+v: SyncAlways off", when, cfg)
		}
		if !j.SyncAlways() {
			t.Fatalf("%s: SyncAlways() false", when)
		}
	}
	check("start")
	s, err := j.createStream(jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log"}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Storage != jetstream.FileStorage || info.Config.PersistMode != jetstream.DefaultPersistMode {
		t.Errorf("stream storage %v persist mode %v: want file storage, default (synchronous) persist mode", info.Config.Storage, info.Config.PersistMode)
	}
	// A fast fill turns SyncAlways off and on again.
	if _, err := j.fill(jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log"}}, "log", 100); err != nil {
		t.Fatal(err)
	}
	check("after a fill")
	if _, err := j.Restart(); err != nil {
		t.Fatal(err)
	}
	check("after a restart")
}

func TestJetStreamWorkloads(t *testing.T) {
	j := startTestJetStream(t)
	withLeaseRecords(t, 50_000)
	ctx := context.Background()

	res, err := j.Writes(1, 1, testDuration)
	checkResult(t, "jetstream writes 1/1", res, err)
	res, err = j.Writes(100, 100, testDuration)
	checkResult(t, "jetstream writes 100/100", res, err)
	res, err = j.Writes(1, 16, testDuration)
	checkResult(t, "jetstream writes 1 object/16", res, err)
	js := j.JetStream()
	info, err := js.Stream(ctx, "OBJ")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := info.GetLastMsgForSubject(ctx, "obj.99")
	if err != nil || !bytes.Equal(msg.Data, payload) {
		t.Fatalf("obj.99: %v", err)
	}
	if si, err := info.Info(ctx); err != nil || si.State.Msgs != 100 {
		t.Fatalf("OBJ holds %d messages (%v), want 100: one per object", si.State.Msgs, err)
	}

	res, err = j.KVWrites(8, 4, testDuration)
	checkResult(t, "jetstream kv writes 8/4", res, err)
	kv, err := js.KeyValue(ctx, "KV")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "k3"); err != nil || !bytes.Equal(e.Value(), payload) {
		t.Fatalf("k3: %v", err)
	}

	res, err = j.StreamAdds(8, testDuration)
	checkResult(t, "jetstream stream adds 8", res, err)
	if c, err := j.streamCounts(ctx); err != nil || c["Q"] < uint64(res.Ops) {
		t.Fatalf("Q holds %d messages (%v), acknowledged at least %d", c["Q"], err, res.Ops)
	}

	m, err := j.batches(100, testDuration)
	checkResult(t, "jetstream batches of 100", m.Result, err)
	counts, err := j.streamCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts["LOG"] != uint64(m.total) {
		t.Fatalf("LOG holds %d messages, acknowledged %d", counts["LOG"], m.total)
	}

	res, err = j.LeaseCycles(4, testDuration)
	checkResult(t, "jetstream lease cycles 4", res, err)

	secs, err := j.FillAndRestart(20_000)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("jetstream restart with 20000 records: %.3fs", secs)
	after, err := j.streamCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after["FILL"] != 20_000 || after["LOG"] != counts["LOG"]+uint64(LeaseRecords) {
		t.Fatalf("after restart: %v; before the lease and fill: %v", after, counts)
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	skipIfShort(t)
	before := runtime.NumGoroutine()
	j, err := StartJetStream(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Writes(4, 8, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("redis-server"); err == nil {
		r, err := StartRedis(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Writes(4, 8, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after Close:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDiskWriteBytesAndCPU(t *testing.T) {
	if _, err := DiskWriteBytes(0); err == nil {
		t.Error("pid 0: want an error")
	}
	if _, err := DiskWriteBytes(1 << 30); err == nil {
		t.Error("missing pid: want an error")
	}
	if cpu := ProcessCPU(); cpu <= 0 {
		t.Errorf("ProcessCPU = %v", cpu)
	}
	if len(Payload()) != PayloadSize {
		t.Errorf("payload of %d bytes", len(Payload()))
	}
}

// PIDCPU reads a process's CPU time from /proc: this process's, after burning
// some, is close to what getrusage says.
func TestPIDCPU(t *testing.T) {
	start := ProcessCPU()
	x := 0
	for ProcessCPU()-start < 200*time.Millisecond {
		for i := range 1_000_000 {
			x += i
		}
	}
	_ = x
	self, proc := ProcessCPU(), PIDCPU(os.Getpid())
	if proc < 150*time.Millisecond || proc > self+50*time.Millisecond {
		t.Fatalf("PIDCPU %v, getrusage %v", proc, self)
	}
	if PIDCPU(-1) != 0 {
		t.Fatal("PIDCPU of no process should be 0")
	}
}
