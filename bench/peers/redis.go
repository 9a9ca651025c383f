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

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// StartTimeout bounds how long a peer may take to start answering after it
// was started.
var StartTimeout = 10 * time.Second

// LoadTimeout bounds how long a peer may take, once started, to load its data
// and serve it (a restart on a large log).
var LoadTimeout = 5 * time.Minute

// StopTimeout is how long Close and Restart wait for a peer to stop on its
// own before they kill it.
var StopTimeout = 5 * time.Second

// Redis is a redis-server child process that persists every write with
// appendonly yes and appendfsync always, so a command is fsynced to the
// append-only file before its reply is sent.
type Redis struct {
	bin  string
	dir  string
	port int

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has been waited for
	waitErr error         // cmd.Wait's error, set before exited is closed
	output  *lockedBuffer // the child's stdout and stderr
	admin   *redis.Client
}

// lockedBuffer is a bytes.Buffer safe for the writer goroutine of os/exec and
// a reader.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 64<<10 { // keep it small: only the start matters
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// StartRedis starts Debian's redis-server (looked up in PATH) with its data in
// dir, on a free port of 127.0.0.1, and waits until it answers.
func StartRedis(dir string) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("peers: redis-server is not installed (install it with: apt-get install -y redis-server): %w", err)
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("peers: redis dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("peers: redis dir: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &Redis{bin: bin, dir: dir, port: port}
	if _, err := r.start(); err != nil {
		return nil, err
	}
	slog.Debug("redis started", "addr", r.Addr(), "pid", r.PID(), "dir", dir)
	return r, nil
}

// Name returns "redis".
func (r *Redis) Name() string { return "redis" }

// Addr returns the host:port the server listens on.
func (r *Redis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// Dir returns the server's data directory.
func (r *Redis) Dir() string { return r.dir }

// PID returns the process id of the running redis-server, or 0 when it is
// not running.
func (r *Redis) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || r.cmd.Process == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

// Client returns a small client for checks and administration; it is closed
// by Close and replaced by Restart.
func (r *Redis) Client() *redis.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.admin
}

// NewClient returns a new client of the server with a pool of poolSize
// connections. The caller closes it.
func (r *Redis) NewClient(poolSize int) *redis.Client {
	return r.newClient(poolSize, 3)
}

func (r *Redis) newClient(poolSize, maxRetries int) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                     r.Addr(),
		PoolSize:                 poolSize,
		MaxActiveConns:           poolSize,
		PoolTimeout:              30 * time.Second,
		DialTimeout:              10 * time.Second,
		ReadTimeout:              30 * time.Second,
		WriteTimeout:             30 * time.Second,
		MaxRetries:               maxRetries,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// args is the command line: durable (appendonly, fsync always), no RDB
// snapshots, in the foreground, on 127.0.0.1 only.
func (r *Redis) args() []string {
	return []string{
		"--port", strconv.Itoa(r.port),
		"--bind", "127.0.0.1",
		"--dir", r.dir,
		"--appendonly", "yes",
		"--appendfsync", "always",
		"--save", "",
		"--daemonize", "no",
		"--protected-mode", "no",
		"--logfile", filepath.Join(r.dir, "redis.log"),
		// Room for the 10,000-caller case (Redis lowers it if the file
		// limit does not allow it).
		"--maxclients", "19000",
		"--tcp-backlog", "4096",
	}
}

// start launches the process and returns the time from launch until it
// serves its data.
func (r *Redis) start() (time.Duration, error) {
	cmd := exec.Command(r.bin, r.args()...)
	cmd.Dir = r.dir
	out := &lockedBuffer{}
	cmd.Stdout = out
	cmd.Stderr = out
	// If this process dies, the server goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("peers: start redis-server: %w", err)
	}
	exited := make(chan struct{})
	r.mu.Lock()
	r.cmd, r.exited, r.output, r.waitErr = cmd, exited, out, nil
	r.mu.Unlock()
	go func() {
		err := cmd.Wait()
		r.mu.Lock()
		r.waitErr = err
		r.mu.Unlock()
		close(exited)
	}()

	probe := r.newClient(1, -1)
	defer probe.Close()
	answerBy := t0.Add(StartTimeout)
	loadedBy := t0.Add(StartTimeout + LoadTimeout)
	answered := false
	var lastErr error
	for {
		select {
		case <-exited:
			return 0, fmt.Errorf("peers: redis-server exited while starting: %v; output: %q; log: %s", r.exitErr(), out.String(), r.logTail())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := probe.DBSize(ctx).Err()
		cancel()
		if err == nil {
			elapsed := time.Since(t0)
			admin := r.newClient(4, 3)
			r.mu.Lock()
			r.admin = admin
			r.mu.Unlock()
			return elapsed, nil
		}
		lastErr = err
		if strings.HasPrefix(err.Error(), "LOADING") {
			answered = true
		}
		now := time.Now()
		if (!answered && now.After(answerBy)) || now.After(loadedBy) {
			_ = r.stop()
			return 0, fmt.Errorf("peers: redis-server on %s not ready after %v: %w; log: %s", r.Addr(), now.Sub(t0).Round(time.Millisecond), lastErr, r.logTail())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (r *Redis) exitErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waitErr
}

// logTail returns the last lines of redis.log, for error messages.
func (r *Redis) logTail() string {
	b, err := os.ReadFile(filepath.Join(r.dir, "redis.log"))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// stop sends SIGTERM (Redis fsyncs the append-only file and exits), waits up
// to StopTimeout, then kills it.
func (r *Redis) stop() error {
	r.mu.Lock()
	cmd, exited, admin := r.cmd, r.exited, r.admin
	r.admin = nil
	r.mu.Unlock()
	if admin != nil {
		_ = admin.Close()
	}
	if cmd == nil {
		return nil
	}
	select {
	case <-exited:
		return nil
	default:
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("peers: stop redis-server: %w", err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(StopTimeout):
	}
	slog.Warn("redis-server did not stop on SIGTERM, killing it", "pid", cmd.Process.Pid, "after", StopTimeout)
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("peers: kill redis-server: %w", err)
	}
	select {
	case <-exited:
		return fmt.Errorf("peers: redis-server did not stop within %v and was killed", StopTimeout)
	case <-time.After(StopTimeout):
		return fmt.Errorf("peers: redis-server pid %d did not exit after SIGKILL", cmd.Process.Pid)
	}
}

// Close stops the server: SIGTERM, then SIGKILL if it has not exited after
// StopTimeout.
func (r *Redis) Close() error {
	return r.stop()
}

// Restart stops the server and starts it again on the same directory and
// port. It returns the time from launching the new process until it answers
// and has loaded its data (DBSIZE succeeds instead of a LOADING error), and
// checks that it has as many keys as before.
func (r *Redis) Restart() (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin := r.Client()
	if admin == nil {
		return 0, errors.New("peers: redis restart: server is not running")
	}
	keys, err := admin.DBSize(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("peers: redis restart: dbsize before: %w", err)
	}
	if err := r.stop(); err != nil {
		return 0, fmt.Errorf("peers: redis restart: %w", err)
	}
	took, err := r.start()
	if err != nil {
		return 0, fmt.Errorf("peers: redis restart: %w", err)
	}
	after, err := r.Client().DBSize(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("peers: redis restart: dbsize after: %w", err)
	}
	if after != keys {
		return 0, fmt.Errorf("peers: redis restart: %d keys before, %d after", keys, after)
	}
	slog.Debug("redis restarted", "took", took, "keys", keys)
	return took, nil
}
