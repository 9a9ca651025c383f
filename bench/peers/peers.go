// Package peers runs the two systems that Holdfast's benchmark compares itself
// with, Redis and NATS JetStream, configured for the same durability as
// Holdfast: every write reaches the disk (fsync) before it is acknowledged.
//
// Redis runs as a child process (Debian's redis-server) with
// appendonly yes and appendfsync always. JetStream runs embedded in this
// process (github.com/nats-io/nats-server/v2) with a file store and
// SyncAlways (the sync_interval: always setting). Clients talk to both over
// TCP on 127.0.0.1.
//
// The workloads (Writes, KVWrites, Batches, LeaseCycles, FillAndRestart) are
// methods of both peers; each runs for an unmeasured warm-up (Warmup) and then
// for a measured duration, and returns a Result with throughput, the bytes the
// server process wrote to disk, and the CPU time of this process.
package peers

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PayloadSize is the size in bytes of every value and record the workloads
// write.
const PayloadSize = 256

// payload is the constant value written by every workload.
var payload = func() []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, PayloadSize)
	for i := range b {
		b[i] = alphabet[(i*7+3)%len(alphabet)]
	}
	return b
}()

// Payload returns a copy of the 256-byte value that every workload writes.
func Payload() []byte { return bytes.Clone(payload) }

// Warmup is the unmeasured time every workload runs before its measured
// interval starts.
var Warmup = 300 * time.Millisecond

// Result is what one workload measured over its measured interval (after the
// warm-up).
type Result struct {
	// OpsPerSec is Ops divided by Elapsed.
	OpsPerSec float64 `json:"opsPerSec"`
	// Ops counts the operations completed (acknowledged) in the measured
	// interval: writes, records (Batches) or lease cycles (LeaseCycles).
	Ops int64 `json:"ops"`
	// DiskBytes is the growth of write_bytes in /proc/<pid>/io of the server
	// process over the measured interval (for embedded JetStream, this
	// process). Divide by Ops*PayloadSize for bytes written per payload byte.
	DiskBytes uint64 `json:"diskBytes"`
	// ClientCPU is the user+system CPU time of this process over the measured
	// interval. For Redis that is the client only; for embedded JetStream it
	// includes the server.
	ClientCPU time.Duration `json:"clientCPU"`
	// ServerCPU is the user+system CPU time of the server process over the
	// measured interval (for embedded JetStream, this process: ClientCPU).
	ServerCPU time.Duration `json:"serverCPU"`
	// Elapsed is the length of the measured interval.
	Elapsed time.Duration `json:"elapsed"`
	// LatencyP50 and LatencyP99 are the median and 99th percentile of the
	// time one operation took, over the operations that started and
	// completed within the measured interval (a batch or a cycle is one).
	LatencyP50 time.Duration `json:"latencyP50,omitempty"`
	LatencyP99 time.Duration `json:"latencyP99,omitempty"`
	// Note says what the figures mean beyond their names, when it matters.
	Note string `json:"note,omitempty"`
}

// Peer is what both peers offer, so that a driver can run the same case
// against either of them.
type Peer interface {
	// Name is "redis" or "jetstream".
	Name() string
	// PID is the process that runs the server (this process for JetStream).
	PID() int
	// Writes runs callers goroutines, caller c writing object c mod objects,
	// one write in flight per caller.
	Writes(objects, callers int, d time.Duration) (Result, error)
	// StreamAdds runs callers goroutines appending to one stream, one append
	// in flight each.
	StreamAdds(callers int, d time.Duration) (Result, error)
	// KVWrites is Writes through the peer's key-value API.
	KVWrites(callers, keys int, d time.Duration) (Result, error)
	// Batches appends atomic batches of batch records to one log from one
	// producer; Ops counts records.
	Batches(batch int, d time.Duration) (Result, error)
	// LeaseCycles runs consumers goroutines taking up to 10 records and
	// acknowledging them; Ops counts cycles.
	LeaseCycles(consumers int, d time.Duration) (Result, error)
	// FillAndRestart fills a log with records records, restarts the server
	// and returns the seconds until the data is served again.
	FillAndRestart(records int) (float64, error)
	// Restart stops and starts the server on the same data and returns the
	// time until it serves the data again.
	Restart() (time.Duration, error)
	// Close stops the server and every client.
	Close() error
}

var (
	_ Peer = (*Redis)(nil)
	_ Peer = (*JetStream)(nil)
)

// Start starts the peer called name with its data in dir: "redis",
// "jetstream", or a replicated peer (writes only): "etcd3" (three etcd
// member processes), "etcd1" (one), "jetstream-r3" (three embedded JetStream
// servers, streams with three replicas).
func Start(name, dir string) (Peer, error) {
	switch name {
	case "redis":
		return StartRedis(dir)
	case "jetstream":
		return StartJetStream(dir)
	case "etcd3":
		return StartEtcd(dir, 3)
	case "etcd1":
		return StartEtcd(dir, 1)
	case "jetstream-r3":
		return StartJetStreamCluster(dir, 3)
	default:
		return nil, fmt.Errorf("peers: unknown peer %q (want redis, jetstream, etcd3, etcd1 or jetstream-r3)", name)
	}
}

// DiskWriteBytes returns write_bytes from /proc/<pid>/io: the bytes the
// process caused to be sent to the storage layer (page-granular, counted when
// pages are dirtied).
func DiskWriteBytes(pid int) (uint64, error) {
	path := "/proc/" + strconv.Itoa(pid) + "/io"
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("peers: disk write bytes: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "write_bytes:")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(rest), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("peers: parse write_bytes in %s: %w", path, err)
		}
		return n, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("peers: read %s: %w", path, err)
	}
	return 0, fmt.Errorf("peers: no write_bytes in %s", path)
}

// ProcessCPU returns the user plus system CPU time this process has used
// (getrusage RUSAGE_SELF), or 0 if it cannot be read.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// PIDCPU returns the user plus system CPU time of process pid, from
// /proc/<pid>/stat, or 0 if it cannot be read.
func PIDCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; the fields after it do not.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0
	}
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("peers: find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("peers: find a free port: %w", err)
	}
	return port, nil
}
