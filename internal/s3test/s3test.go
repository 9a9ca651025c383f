// Package s3test starts real S3 servers for tests, as separate processes on
// 127.0.0.1: MinIO (AGPL: only ever run, never imported) and versitygw. Their
// binaries come from HOLDFAST_MINIO_BIN and HOLDFAST_VERSITYGW_BIN, or from the
// cache directory scripts/test-servers.sh installs them into. A missing binary
// fails the test, unless HOLDFAST_SKIP_S3=1 says to skip it.
package s3test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

const (
	AccessKey = "holdfast-test"
	SecretKey = "holdfast-test-secret"
)

// TB is what the servers need of a test (testing.T has it); a benchmark program
// can pass its own.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	TempDir() string
	Cleanup(func())
}

// Server is one S3 server process.
type Server struct {
	t        TB
	Endpoint string // host:port
	kind     string
	bin      string
	args     []string
	env      []string
	health   string
	// listen picks fresh ports and sets Endpoint and args.
	listen func()
	cmd    *exec.Cmd
	exited chan struct{}
}

// CacheDir is where scripts/test-servers.sh installs the servers.
func CacheDir() string {
	if d := os.Getenv("HOLDFAST_TEST_BIN"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "holdfast-test-bin")
}

func binary(t TB, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	p := filepath.Join(CacheDir(), name)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if os.Getenv("HOLDFAST_SKIP_S3") == "1" {
		t.Skipf("%s not installed and HOLDFAST_SKIP_S3=1", name)
	}
	t.Fatalf("%s is not installed: run scripts/test-servers.sh (or set %s); HOLDFAST_SKIP_S3=1 skips the S3 tests", name, env)
	return ""
}

func freePort(t TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// MinIO starts a MinIO server with an empty data directory.
func MinIO(t TB) *Server {
	t.Helper()
	dir := t.TempDir()
	s := &Server{
		t: t, kind: "minio", bin: binary(t, "HOLDFAST_MINIO_BIN", "minio"),
		env:    []string{"MINIO_ROOT_USER=" + AccessKey, "MINIO_ROOT_PASSWORD=" + SecretKey, "MINIO_BROWSER=off", "MINIO_UPDATE=off"},
		health: "/minio/health/live",
	}
	s.listen = func() {
		port := freePort(t)
		s.Endpoint = "127.0.0.1:" + strconv.Itoa(port)
		s.args = []string{"server", "--quiet", "--address", s.Endpoint,
			"--console-address", "127.0.0.1:" + strconv.Itoa(freePort(t)), dir}
	}
	s.first()
	return s
}

// VersityGW starts versitygw over a posix directory, with a bucket directory made.
func VersityGW(t TB, bucket string) *Server {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, bucket), 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	s := &Server{t: t, kind: "versitygw", bin: binary(t, "HOLDFAST_VERSITYGW_BIN", "versitygw"), health: "/health"}
	s.listen = func() {
		s.Endpoint = "127.0.0.1:" + strconv.Itoa(freePort(t))
		s.args = []string{"--port", s.Endpoint, "--access", AccessKey, "--secret", SecretKey, "--health", "/health", "posix", dir}
	}
	s.first()
	return s
}

// first starts the server on fresh ports, again on others when another
// process took its port between freePort and the server's own listen (tests
// of several packages start servers at once).
func (s *Server) first() {
	s.t.Helper()
	for attempt := 1; ; attempt++ {
		s.listen()
		if !s.start() {
			return
		}
		if attempt == 5 {
			s.t.Fatalf("%s: its port was taken by another process 5 times", s.kind)
		}
	}
}

// Start restarts the process on its ports and waits until it answers.
func (s *Server) Start() {
	s.t.Helper()
	if s.start() {
		s.t.Fatalf("%s: another process took its port %s", s.kind, s.Endpoint)
	}
}

// start starts the process and waits until it answers on its port, which it
// must own: an answer from another process on the port does not count.
// portTaken says the process exited because the port was in use.
func (s *Server) start() (portTaken bool) {
	s.t.Helper()
	cmd := exec.Command(s.bin, s.args...)
	cmd.Env = append(os.Environ(), s.env...)
	log, err := os.CreateTemp(s.t.TempDir(), s.kind+"-*.log")
	if err != nil {
		s.t.Fatalf("%v", err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start %s: %v", s.kind, err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(s.exited) }()
	s.t.Cleanup(func() { s.Kill() })
	deadline := time.Now().Add(60 * time.Second)
	c := &http.Client{Timeout: time.Second}
	for {
		resp, err := c.Get("http://" + s.Endpoint + s.health)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 && listensOn(cmd.Process.Pid, s.Endpoint) && s.servesS3() {
				return false
			}
		}
		select {
		case <-s.exited:
			b, _ := os.ReadFile(log.Name())
			if strings.Contains(strings.ToLower(string(b)), "already in use") {
				return true
			}
			s.t.Fatalf("%s exited at start:\n%s", s.kind, b)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(log.Name())
			s.t.Fatalf("%s did not become healthy:\n%s", s.kind, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// servesS3 reports whether the server answers a signed S3 request. MinIO's
// health probe answers 200 before its object layer and IAM are up; a request
// in that window fails with "Server not initialized yet".
func (s *Server) servesS3() bool {
	c, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(AccessKey, SecretKey, ""), MaxRetries: 1})
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = c.ListBuckets(ctx)
	return err == nil
}

// listensOn reports whether process pid holds the listening socket of
// endpoint (127.0.0.1:port), from /proc/net/tcp and the process's descriptors.
func listensOn(pid int, endpoint string) bool {
	_, portText, _ := strings.Cut(endpoint, ":")
	port, err := strconv.Atoi(portText)
	if err != nil {
		return false
	}
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			if _, hexPort, ok := strings.Cut(f[1], ":"); ok {
				if n, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(n) == port {
					inodes["socket:["+f[9]+"]"] = true
				}
			}
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && inodes[target] {
			return true
		}
	}
	return false
}

// Kill SIGKILLs the process and waits for it to exit.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Stop freezes the process (SIGSTOP): it keeps its connections but answers
// nothing. It returns once every thread of the process is stopped: the signal
// takes effect on each thread asynchronously, and a request sent right after
// kill(2) returned was seen answered by a thread still running.
func (s *Server) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGSTOP)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if allStopped(s.cmd.Process.Pid) {
			return
		}
	}
	s.t.Helper()
	s.t.Fatalf("%s not stopped 5 s after SIGSTOP", s)
}

// allStopped tells whether every thread of process pid is in the stopped
// state ('T' in /proc/PID/task/TID/stat).
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses and may
		// hold spaces: "pid (comm) S ...".
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// Cont resumes a stopped process.
func (s *Server) Cont() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

func (s *Server) String() string { return fmt.Sprintf("%s at %s", s.kind, s.Endpoint) }
