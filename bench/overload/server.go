package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// server is one `holdfast serve` process. Its stderr goes to logFile; the
// goroutine that copies it is the server's, and exited is closed once both
// it and the process are done.
type server struct {
	cmd    *exec.Cmd
	url    string
	exited chan struct{}
	err    error // the exit status, once exited is closed

	mu          sync.Mutex
	warnings    int // log lines at WARN or ERROR, but for refusals'
	refusalLogs int // "request failed" lines of 503s and 429s
	tail        []string
}

var listenRE = regexp.MustCompile(`"holdfast listening" addr=(\S+)`)

// buildServer builds ./cmd/holdfast into dir (the run is started from the
// module's root, as `go run ./bench/overload`).
func buildServer(dir string) (string, error) {
	bin := filepath.Join(dir, "holdfast")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/holdfast")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build ./cmd/holdfast (run from the module's root): %w", err)
	}
	return bin, nil
}

// startServer starts bin on dataDir with env added, and waits until it listens.
func startServer(bin, dataDir, logFile string, env []string) (*server, error) {
	cmd := exec.Command(bin, "serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = io.Discard // the app created on first start; read from apps.json instead
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	logw, err := os.OpenFile(logFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logw.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &server{cmd: cmd, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(s.exited)
		defer logw.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			_, _ = io.WriteString(logw, line+"\n")
			s.mu.Lock()
			switch {
			case strings.Contains(line, `msg="request failed"`) && (strings.Contains(line, "status=503") || strings.Contains(line, "status=429")):
				s.refusalLogs++
			case strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR"):
				s.warnings++
			}
			if s.tail = append(s.tail, line); len(s.tail) > 100 {
				s.tail = s.tail[1:]
			}
			s.mu.Unlock()
			if m := listenRE.FindStringSubmatch(line); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		s.err = cmd.Wait()
	}()
	select {
	case a := <-addr:
		s.url = "http://" + a
		return s, nil
	case <-s.exited:
	case <-time.After(2 * time.Minute):
		s.kill()
	}
	return nil, fmt.Errorf("the server did not start (%v):\n%s", s.err, s.lastLines())
}

func (s *server) pid() int { return s.cmd.Process.Pid }

func (s *server) lastLines() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.tail, "\n")
}

func (s *server) warningCount() (warnings, refusalLogs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.warnings, s.refusalLogs
}

func (s *server) kill() {
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.exited
	}
}

// stop sends SIGTERM and waits up to timeout for a clean exit (SIGKILL after
// it). It returns how long the exit took and the exit error, if any.
func (s *server) stop(timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return 0, err
	}
	select {
	case <-s.exited:
		return time.Since(start), s.err
	case <-time.After(timeout):
		s.kill()
		return time.Since(start), fmt.Errorf("no exit %v after SIGTERM: killed", timeout)
	}
}

// readApp reads the app the server created on first start.
func readApp(dataDir string) (appCreds, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "apps.json"))
	if err != nil {
		return appCreds{}, err
	}
	var apps []appCreds
	if err := json.Unmarshal(b, &apps); err != nil || len(apps) == 0 {
		return appCreds{}, fmt.Errorf("apps.json: not a list of apps (%v)", err)
	}
	return apps[0], nil
}

type appCreds struct {
	ID     string `json:"id"`
	Key    string `json:"key"`
	Secret string `json:"secret"`
}

// sample is one reading of the server's memory.
type sample struct {
	At time.Duration // since the start of the run
	procStatus
	Live, HeapInuse, Active float64 // from /metrics; -1 when the scrape failed
}

// sampler reads the server's /proc status every interval and its /metrics
// every scrapeEvery, on two goroutines of its own (a slow scrape must not
// leave a gap in the RSS samples), until ctx is done; run returns then.
type sampler struct {
	pid         int
	url         string
	start       time.Time
	interval    time.Duration
	scrapeEvery time.Duration
	client      *http.Client

	mu         sync.Mutex
	samples    []sample
	latest     sample // Live, HeapInuse and Active of the last scrape
	procErrs   int
	scrapeErrs int
}

var sampledMetrics = map[string]bool{
	"holdfast_memory_live_bytes":         true,
	"holdfast_memory_budget_bytes":       true,
	"holdfast_memory_refusals_total":     true,
	"holdfast_memory_passivations_total": true,
	"holdfast_objects_active":            true,
	"go_memstats_heap_inuse_bytes":       true,
}

func (sm *sampler) run(ctx context.Context) {
	sm.latest = sample{Live: -1, HeapInuse: -1, Active: -1}
	var wg sync.WaitGroup
	wg.Go(func() { sm.scrapeLoop(ctx) })
	sm.procLoop(ctx)
	wg.Wait()
}

func (sm *sampler) procLoop(ctx context.Context) {
	t := time.NewTicker(sm.interval)
	defer t.Stop()
	for {
		ps, err := readProcStatus(sm.pid)
		sm.mu.Lock()
		if err == nil {
			s := sm.latest
			s.At, s.procStatus = time.Since(sm.start), ps
			sm.samples = append(sm.samples, s)
		} else {
			sm.procErrs++
		}
		sm.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (sm *sampler) scrapeLoop(ctx context.Context) {
	t := time.NewTicker(sm.scrapeEvery)
	defer t.Stop()
	for {
		m, err := scrape(ctx, sm.client, sm.url)
		sm.mu.Lock()
		if err == nil {
			sm.latest.Live, sm.latest.HeapInuse, sm.latest.Active = m["holdfast_memory_live_bytes"], m["go_memstats_heap_inuse_bytes"], m["holdfast_objects_active"]
		} else if ctx.Err() == nil {
			sm.scrapeErrs++
		}
		sm.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// taken is the samples so far, and how many /proc reads and scrapes failed.
func (sm *sampler) taken() ([]sample, int, int) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return slices.Clone(sm.samples), sm.procErrs, sm.scrapeErrs
}

func readProcStatus(pid int) (procStatus, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return procStatus{}, err
	}
	defer f.Close()
	return parseProcStatus(f)
}

// scrape reads the metrics the run reports from GET /metrics.
func scrape(ctx context.Context, c *http.Client, url string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		return nil, errors.New("GET /metrics: " + resp.Status)
	}
	return parseMetrics(bytes.NewReader(b), sampledMetrics)
}
