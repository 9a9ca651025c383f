package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdModule is the etcd server's main package, built from the module cache
// (it is a dependency of this module, so its version is go.mod's).
const etcdModule = "go.etcd.io/etcd/server/v3"

// EtcdClusterTimeout bounds how long the members of an etcd cluster may take
// to elect a leader and accept a put after they were launched.
var EtcdClusterTimeout = 30 * time.Second

// etcdBuildTimeout bounds building the etcd binary (seconds when the build
// cache has this module's dependencies, as after building Holdfast).
var etcdBuildTimeout = 5 * time.Minute

// etcdBinMu serializes the builds of this process.
var etcdBinMu sync.Mutex

// BinCacheDir is where test and benchmark servers are cached:
// $HOLDFAST_TEST_BIN, or ~/.cache/holdfast-test-bin (as internal/s3test).
func BinCacheDir() string {
	if d := os.Getenv("HOLDFAST_TEST_BIN"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "holdfast-test-bin")
	}
	return filepath.Join(home, ".cache", "holdfast-test-bin")
}

// EtcdBinary returns the path of an etcd server binary of the version this
// module requires: $HOLDFAST_ETCD_BIN when set, else etcd-<version> in
// BinCacheDir, built there first with `go build go.etcd.io/etcd/server/v3`
// (which needs the go command and the working directory inside this module).
func EtcdBinary() (string, error) {
	if p := os.Getenv("HOLDFAST_ETCD_BIN"); p != "" {
		return p, nil
	}
	etcdBinMu.Lock()
	defer etcdBinMu.Unlock()
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("peers: building etcd needs the go command: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdBuildTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, goBin, "list", "-m", "-f", "{{.Version}}", etcdModule).Output()
	if err != nil {
		return "", fmt.Errorf("peers: find etcd's version (run from inside the holdfast module): go list -m %s: %w", etcdModule, exitDetail(err))
	}
	version := strings.TrimSpace(string(out))
	bin := filepath.Join(BinCacheDir(), "etcd-"+version)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(BinCacheDir(), 0o755); err != nil {
		return "", fmt.Errorf("peers: etcd binary cache: %w", err)
	}
	// Built under a temporary name and renamed: another process building
	// at the same time never runs a half-written file.
	tmp, err := os.CreateTemp(BinCacheDir(), "etcd-build-*")
	if err != nil {
		return "", fmt.Errorf("peers: etcd binary cache: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	t0 := time.Now()
	build := exec.CommandContext(ctx, goBin, "build", "-o", tmp.Name(), etcdModule)
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("peers: build etcd %s: %w: %s", version, err, bytes.TrimSpace(out))
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", fmt.Errorf("peers: etcd binary cache: %w", err)
	}
	slog.Info("built etcd", "version", version, "path", bin, "took", time.Since(t0).Round(time.Millisecond))
	return bin, nil
}

func exitDetail(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return err
}

// Etcd is an etcd cluster of one or more member processes on 127.0.0.1, each
// with its own data directory and etcd's default durability: a member fsyncs
// its write-ahead log before it acknowledges a raft entry, so a put is on the
// disks of a majority of members before it is acknowledged.
type Etcd struct {
	bin       string
	dir       string
	members   []*etcdMember
	endpoints []string
	admin     *clientv3.Client
}

// etcdMember is one member's process.
type etcdMember struct {
	name       string
	dir        string
	clientURL  string
	peerURL    string
	cmd        *exec.Cmd
	exited     chan struct{} // closed when cmd has been waited for
	output     *lockedBuffer
	waitErrMu  sync.Mutex
	waitErr    error
	clientPort int
}

var _ Peer = (*Etcd)(nil)

// StartEtcd builds (or finds) the etcd binary, starts members member
// processes under dir (dir/m0, dir/m1...) as one cluster, and waits until it
// has a leader and accepts a put.
func StartEtcd(dir string, members int) (*Etcd, error) {
	if members < 1 {
		return nil, fmt.Errorf("peers: etcd with %d members", members)
	}
	bin, err := EtcdBinary()
	if err != nil {
		return nil, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("peers: etcd dir: %w", err)
	}
	// Ports are picked free and then bound by the members: another process
	// may take one in between, so a failed start is tried again on fresh
	// ports (in fresh directories).
	var lastErr error
	for attempt := range 3 {
		e := &Etcd{bin: bin, dir: filepath.Join(dir, fmt.Sprintf("try%d", attempt))}
		if err := e.start(members); err != nil {
			lastErr = err
			_ = os.RemoveAll(e.dir)
			slog.Debug("etcd cluster did not start", "attempt", attempt, "err", err)
			continue
		}
		slog.Debug("etcd started", "members", members, "endpoints", e.endpoints, "dir", e.dir)
		return e, nil
	}
	return nil, lastErr
}

func (e *Etcd) start(n int) error {
	var initial []string
	for i := range n {
		cport, err := freePort()
		if err != nil {
			return err
		}
		pport, err := freePort()
		if err != nil {
			return err
		}
		m := &etcdMember{
			name:       "m" + strconv.Itoa(i),
			dir:        filepath.Join(e.dir, "m"+strconv.Itoa(i)),
			clientURL:  "http://127.0.0.1:" + strconv.Itoa(cport),
			peerURL:    "http://127.0.0.1:" + strconv.Itoa(pport),
			clientPort: cport,
		}
		if err := os.MkdirAll(m.dir, 0o700); err != nil {
			return fmt.Errorf("peers: etcd dir: %w", err)
		}
		e.members = append(e.members, m)
		e.endpoints = append(e.endpoints, "127.0.0.1:"+strconv.Itoa(cport))
		initial = append(initial, m.name+"="+m.peerURL)
	}
	for _, m := range e.members {
		if err := m.launch(e.bin, strings.Join(initial, ",")); err != nil {
			_ = e.Close()
			return err
		}
	}
	if err := e.waitReady(); err != nil {
		_ = e.Close()
		return err
	}
	return nil
}

// launch starts the member's process: the cluster's members named in
// initial, default durability, quiet logs.
func (m *etcdMember) launch(bin, initial string) error {
	cmd := exec.Command(bin,
		"--name", m.name,
		"--data-dir", m.dir,
		"--listen-client-urls", m.clientURL,
		"--advertise-client-urls", m.clientURL,
		"--listen-peer-urls", m.peerURL,
		"--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster", initial,
		"--initial-cluster-state", "new",
		"--initial-cluster-token", "holdfast-bench",
		"--log-level", "error",
	)
	cmd.Dir = m.dir
	m.output = &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = m.output, m.output
	// If this process dies, the member goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("peers: start etcd member %s: %w", m.name, err)
	}
	m.cmd, m.exited = cmd, make(chan struct{})
	go func() {
		err := cmd.Wait()
		m.waitErrMu.Lock()
		m.waitErr = err
		m.waitErrMu.Unlock()
		close(m.exited)
	}()
	return nil
}

// waitReady waits until every member reports the same leader and a put
// through all endpoints succeeds.
func (e *Etcd) waitReady() error {
	cli, err := e.NewClient()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(EtcdClusterTimeout)
	var lastErr error
	for {
		for _, m := range e.members {
			select {
			case <-m.exited:
				cli.Close()
				return fmt.Errorf("peers: etcd member %s exited while starting: %v; output: %s", m.name, m.exitErr(), m.output.String())
			default:
			}
		}
		if lastErr = e.ready(cli); lastErr == nil {
			e.admin = cli
			return nil
		}
		if time.Now().After(deadline) {
			cli.Close()
			return fmt.Errorf("peers: etcd cluster of %d not ready within %v: %w", len(e.members), EtcdClusterTimeout, lastErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *Etcd) ready(cli *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var leader uint64
	for _, ep := range e.endpoints {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			return fmt.Errorf("status of %s: %w", ep, err)
		}
		if st.Leader == 0 || (leader != 0 && st.Leader != leader) {
			return fmt.Errorf("%s sees leader %x (others %x)", ep, st.Leader, leader)
		}
		leader = st.Leader
	}
	_, err := cli.Put(ctx, "holdfast-bench/ready", "1")
	return err
}

func (m *etcdMember) exitErr() error {
	m.waitErrMu.Lock()
	defer m.waitErrMu.Unlock()
	return m.waitErr
}

// NewClient returns a client of every member (etcd's client balances its
// requests over them; a member that is not the leader forwards a put to
// it). The caller closes it.
func (e *Etcd) NewClient() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   e.endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("peers: etcd client: %w", err)
	}
	return cli, nil
}

// Name returns "etcd3" for three members ("etcd<n>" for n).
func (e *Etcd) Name() string { return "etcd" + strconv.Itoa(len(e.members)) }

// Endpoints returns the members' client addresses (host:port).
func (e *Etcd) Endpoints() []string { return append([]string(nil), e.endpoints...) }

// PIDs returns the members' process ids.
func (e *Etcd) PIDs() []int {
	pids := make([]int, len(e.members))
	for i, m := range e.members {
		pids[i] = m.cmd.Process.Pid
	}
	return pids
}

// PID returns the first member's process id (PIDs has them all).
func (e *Etcd) PID() int { return e.PIDs()[0] }

// Client returns a client for checks; Close closes it.
func (e *Etcd) Client() *clientv3.Client { return e.admin }

// etcdNote is the note of etcd's results; its parts are separated by "; "
// (the report splits notes there).
const etcdNote = "etcd %s, %d member process(es) on 127.0.0.1 with etcd's default durability: each member fsyncs its write-ahead log before it acknowledges a raft entry, so a put is on a majority's disks when acknowledged; the callers share min(callers, 100) clients, each balancing its requests over all members (a member that is not the leader forwards a put to it); ClientCPU is the client process, ServerCPU and DiskBytes are the members' summed"

// Writes runs callers goroutines, caller c putting the payload at
// obj/<c mod objects>, one put in flight each. Like etcd's own benchmark
// tool (--conns, --clients), the callers share min(callers, 100) clients
// (gRPC connections), callers spread over them evenly.
func (e *Etcd) Writes(objects, callers int, d time.Duration) (Result, error) {
	if err := checkCounts("etcd writes", objects, callers); err != nil {
		return Result{}, err
	}
	return e.puts("obj/", objects, callers, d)
}

// KVWrites is Writes under its own name: callers goroutines putting
// kv/<c mod keys>.
func (e *Etcd) KVWrites(callers, keys int, d time.Duration) (Result, error) {
	if err := checkCounts("etcd kv writes", callers, keys); err != nil {
		return Result{}, err
	}
	return e.puts("kv/", keys, callers, d)
}

func (e *Etcd) puts(prefix string, keys, callers int, d time.Duration) (Result, error) {
	clients := make([]*clientv3.Client, min(callers, 100))
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}()
	for i := range clients {
		c, err := e.NewClient()
		if err != nil {
			return Result{}, err
		}
		clients[i] = c
	}
	names := keyNames(prefix, callers, keys)
	value := string(payload)
	m, err := runServers(callers, d, e.PIDs(), func(ctx context.Context, w int) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		if _, err := clients[w%len(clients)].Put(ctx, names[w], value); err != nil {
			return 0, fmt.Errorf("put %s: %w", names[w], err)
		}
		return 1, nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("peers: %s writes (%d keys, %d callers): %w", e.Name(), keys, callers, err)
	}
	m.Note = joinNotes(fmt.Sprintf(etcdNote, strings.TrimPrefix(etcdVersion(e.bin), "v"), len(e.members)), m.Note)
	return m.Result, nil
}

// etcdVersion is the version in the binary's name.
func etcdVersion(bin string) string {
	v, ok := strings.CutPrefix(filepath.Base(bin), "etcd-")
	if !ok {
		return "(" + filepath.Base(bin) + ")"
	}
	return v
}

// errNotMeasured answers the workloads a replicated peer does not run.
func errNotMeasured(peer, workload string) error {
	return fmt.Errorf("peers: %s: %s is not measured on this peer (only writes)", peer, workload)
}

// StreamAdds is not measured on etcd.
func (e *Etcd) StreamAdds(int, time.Duration) (Result, error) {
	return Result{}, errNotMeasured(e.Name(), "stream adds")
}

// Batches is not measured on etcd.
func (e *Etcd) Batches(int, time.Duration) (Result, error) {
	return Result{}, errNotMeasured(e.Name(), "batches")
}

// LeaseCycles is not measured on etcd.
func (e *Etcd) LeaseCycles(int, time.Duration) (Result, error) {
	return Result{}, errNotMeasured(e.Name(), "lease cycles")
}

// FillAndRestart is not measured on etcd.
func (e *Etcd) FillAndRestart(int) (float64, error) {
	return 0, errNotMeasured(e.Name(), "restart")
}

// Restart is not measured on etcd.
func (e *Etcd) Restart() (time.Duration, error) {
	return 0, errNotMeasured(e.Name(), "restart")
}

// Close closes the client and stops the members one after the other:
// SIGTERM, then SIGKILL if it has not exited after StopTimeout. One at a time
// because a leader that stops hands its leadership to a member it is
// connected to and waits for that: a member stopping at the same time would
// keep it waiting until etcd's request timeout.
func (e *Etcd) Close() error {
	if e.admin != nil {
		_ = e.admin.Close()
		e.admin = nil
	}
	var errs []error
	for _, m := range e.members {
		if err := m.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *etcdMember) stop() error {
	if m.cmd == nil {
		return nil
	}
	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("peers: stop etcd member %s: %w", m.name, err)
	}
	select {
	case <-m.exited:
		return nil
	case <-time.After(StopTimeout):
	}
	slog.Warn("etcd member did not stop on SIGTERM, killing it", "member", m.name, "pid", m.cmd.Process.Pid, "after", StopTimeout)
	_ = m.cmd.Process.Kill()
	select {
	case <-m.exited:
		return nil
	case <-time.After(StopTimeout):
		return fmt.Errorf("peers: etcd member %s (pid %d) did not exit after SIGKILL", m.name, m.cmd.Process.Pid)
	}
}
