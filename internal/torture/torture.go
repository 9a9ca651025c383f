// Package torture runs many concurrent clients against a Holdfast server that is
// SIGKILLed and restarted at random (or against a cluster of several server
// processes, whose nodes are SIGKILLed and restarted or stopped gracefully and
// started again: cluster.go), records every call with its outcome, and checks
// the history: each KV object's operations must be linearizable
// (github.com/anishathalye/porcupine, with log_id in every reply), and each
// retained log must hold every acknowledged offset with its record, contiguous
// offsets, every key once, and cursors that never go back.
//
// Run's goroutine owns the servers (start, faults, stop); the clients only
// read the list of URLs to send to.
package torture

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/holdfast/holdfast/internal/ownership"
)

// Config configures a run.
type Config struct {
	// Binary is the holdfast binary to run. Required.
	Binary string
	// Dir holds the server's data and configuration. Required.
	Dir string
	// Duration of the workload (kills included). Zero means 2 minutes.
	Duration time.Duration
	// Clients, KV objects and logs; zero means 16, 8 and 4.
	Clients, Objects, Logs int
	// KillMin and KillMax bound the time between kills (between faults of any
	// kind in cluster mode); zero means 1s and 5s.
	KillMin, KillMax time.Duration
	// Cluster is the number of nodes of a cluster to run instead of one server:
	// an etcd in this process and Cluster `holdfast serve` processes, each with
	// its own data; faults (Faults) hit one node at a time. Zero means one
	// server; otherwise at least 3.
	Cluster int
	// Faults, in cluster mode, are the kinds of fault to inject (FaultKill,
	// FaultLeave, FaultWipe, FaultCut), each picked with its own weight
	// (faultWeights). Empty means kill and leave, and with a replication
	// factor of 3 or more also wipe and cut. A wipe needs a replication factor
	// of 3 or more, a cut 2 or more.
	Faults []string
	// order, a test knob, are the first faults' kinds, in order; Faults picks
	// the later ones.
	order []string
	// ReplicationFactor, in cluster mode, is the nodes' cluster.replicationFactor
	// (zero: 1, one copy per partition). Above 1 the nodes share a cold
	// directory and each has its raft port, reached through a proxy of the
	// torture's (linkProxy) that cuts links.
	ReplicationFactor int
	// Seed of the random choices; zero means the time.
	Seed int64
	// CheckTimeout bounds the linearizability check of one object; zero means 60s.
	CheckTimeout time.Duration
	// HistoryDir, when set, receives each KV object's history as JSON lines
	// (kv<i>.jsonl) before it is checked.
	HistoryDir string
	// Progress receives a line per kill and the verdict; nil means io.Discard.
	Progress io.Writer
}

// Verdict is the outcome of a run.
type Verdict struct {
	OK       bool
	Seed     int64
	Nodes    int // cluster mode: the number of nodes; 0 for one server
	Kills    int // SIGKILLs (of one node in cluster mode), and the last one (of every node at once) counted once
	Leaves   int // cluster mode: graceful stops (SIGTERM: hand off, exit 0) during the workload
	Wipes    int // cluster mode: kills whose node came back on an empty data directory (counted in Kills too)
	Cuts     int // cluster mode: raft link cuts
	Ops      int // operations with a known outcome
	Unknown  int // writes whose outcome is unknown (cut off by a kill; in a cluster also a 503)
	Failures []string
	// FailingHistory is the smallest failing KV history found, when one object's
	// history is not linearizable.
	FailingHistory string
}

func (v *Verdict) String() string {
	var b bytes.Buffer
	status := "PASS"
	if !v.OK {
		status = "FAIL"
	}
	if v.Nodes > 0 {
		fmt.Fprintf(&b, "%s: seed %d, %d nodes, %d kills (%d wipes), %d leaves, %d cuts, %d operations, %d with unknown outcome\n",
			status, v.Seed, v.Nodes, v.Kills, v.Wipes, v.Leaves, v.Cuts, v.Ops, v.Unknown)
	} else {
		fmt.Fprintf(&b, "%s: seed %d, %d kills, %d operations, %d with unknown outcome\n", status, v.Seed, v.Kills, v.Ops, v.Unknown)
	}
	for _, f := range v.Failures {
		fmt.Fprintf(&b, "  - %s\n", f)
	}
	if v.FailingHistory != "" {
		fmt.Fprintf(&b, "smallest failing history:\n%s", v.FailingHistory)
	}
	return b.String()
}

const (
	appKey    = "pk_torture"
	appSecret = "sk_torture_secret_0123456789"
	app       = "app_torture"
)

type run struct {
	cfg   Config
	start time.Time
	urls  atomic.Pointer[[]string] // the servers to send to; each call picks one at random
	down  atomic.Bool              // one server: it is down, the clients wait
	http  *http.Client
	// own checks, in cluster mode, that no two nodes served a partition at once
	// (from the X-Holdfast-Served-By header of every reply); nil with one server.
	own *ownership.Checker

	// Run's goroutine only.
	kills, leaves, wipes, cuts int

	mu       sync.Mutex
	killedAt []int64                 // r.now() once each killed server had exited
	kv       [][]porcupine.Operation // per object
	kvLog    [][]changeLogItem       // per object: its change log after the last restart
	logs     []*logRecord
	failures []string
	ops      int
	unknown  int
}

// logRecord is what the clients learned about one log.
type logRecord struct {
	acked    map[string]uint64 // dedup key -> acknowledged offset
	seen     map[uint64]string // offset -> key, as reads returned it
	maxAcked int64             // highest acknowledged offset, -1 if none
	commits  []commitOp        // acknowledged cursor commits
}

type commitOp struct {
	call, ret int64
	offset    uint64 // asked for
	cursor    uint64 // the reply
}

func (r *run) now() int64 { return time.Since(r.start).Nanoseconds() }

// since is the run's time in seconds, for progress lines.
func (r *run) since() float64 { return time.Since(r.start).Seconds() }

// The kinds of fault of a cluster run (Config.Faults).
const (
	FaultKill  = "kill"
	FaultLeave = "leave"
	FaultWipe  = "wipe"
	FaultCut   = "cut"
)

// faultWeights are the odds of each kind of fault among those configured.
var faultWeights = map[string]int{FaultKill: 35, FaultLeave: 15, FaultWipe: 20, FaultCut: 30}

// faults validates cfg.Faults and fills in its default.
func faults(cfg Config) ([]string, error) {
	if cfg.Cluster == 0 {
		if len(cfg.Faults) > 0 {
			return nil, errors.New("torture: Faults are for a cluster; one server is only killed")
		}
		return nil, nil
	}
	rf := max(cfg.ReplicationFactor, 1)
	if len(cfg.Faults) == 0 {
		if rf >= 3 {
			return []string{FaultKill, FaultLeave, FaultWipe, FaultCut}, nil
		}
		return []string{FaultKill, FaultLeave}, nil
	}
	for _, f := range cfg.Faults {
		switch {
		case faultWeights[f] == 0:
			return nil, fmt.Errorf("torture: fault %q: kill, leave, wipe or cut", f)
		case f == FaultWipe && rf < 3:
			return nil, fmt.Errorf("torture: wipes need a replication factor of 3 or more (not %d): with fewer replicas a wiped node's data is gone", rf)
		case f == FaultCut && rf < 2:
			return nil, errors.New("torture: cuts need a replication factor of 2 or more (raft traffic to cut)")
		}
	}
	return cfg.Faults, nil
}

// pickFault picks one of kinds by faultWeights.
func pickFault(kinds []string, rng *rand.Rand) string {
	total := 0
	for _, k := range kinds {
		total += faultWeights[k]
	}
	n := rng.Intn(total)
	for _, k := range kinds {
		if n -= faultWeights[k]; n < 0 {
			return k
		}
	}
	return kinds[len(kinds)-1]
}

func (r *run) fail(format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.failures) < 50 {
		r.failures = append(r.failures, fmt.Sprintf(format, a...))
	}
}

// Run runs the workload and checks it.
func Run(ctx context.Context, cfg Config) (*Verdict, error) {
	if cfg.Binary == "" || cfg.Dir == "" {
		return nil, errors.New("torture: Binary and Dir are required")
	}
	if cfg.Cluster != 0 && cfg.Cluster < 3 {
		return nil, fmt.Errorf("torture: a cluster of %d nodes: at least 3 (2 stay running through every fault)", cfg.Cluster)
	}
	fs, err := faults(cfg)
	if err != nil {
		return nil, err
	}
	cfg.Faults = fs
	if cfg.Duration <= 0 {
		cfg.Duration = 2 * time.Minute
	}
	cfg.Clients, cfg.Objects, cfg.Logs = orDefault(cfg.Clients, 16), orDefault(cfg.Objects, 8), orDefault(cfg.Logs, 4)
	if cfg.KillMin <= 0 {
		cfg.KillMin = time.Second
	}
	if cfg.KillMax < cfg.KillMin {
		cfg.KillMax = max(cfg.KillMin, 5*time.Second)
	}
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano()
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = 60 * time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	// A cluster's request for a partition being handed off waits up to 5 s at
	// the node: the client waits longer, to see its 503.
	timeout := 5 * time.Second
	if cfg.Cluster > 0 {
		timeout = 10 * time.Second
	}
	r := &run{cfg: cfg, start: time.Now(), http: &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		kv: make([][]porcupine.Operation, cfg.Objects), kvLog: make([][]changeLogItem, cfg.Objects)}
	for range cfg.Logs {
		r.logs = append(r.logs, &logRecord{acked: map[string]uint64{}, seen: map[uint64]string{}, maxAcked: -1})
	}
	var t target = &single{r: r}
	if cfg.Cluster > 0 {
		r.own = ownership.New()
		t = &clusterTarget{r: r}
	}
	if err := t.start(ctx); err != nil {
		t.close()
		return nil, err
	}
	defer t.close()

	rng := rand.New(rand.NewSource(cfg.Seed))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range cfg.Clients {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			r.client(c, rand.New(rand.NewSource(seed)), stop)
		}(rng.Int63())
	}
	deadline := time.Now().Add(cfg.Duration)
	for {
		wait := cfg.KillMin + time.Duration(rng.Int63n(int64(cfg.KillMax-cfg.KillMin)+1))
		if time.Now().Add(wait).After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			close(stop)
			wg.Wait()
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		if err := t.fault(ctx, rng); err != nil {
			close(stop)
			wg.Wait()
			return nil, err
		}
	}
	time.Sleep(time.Until(deadline))
	close(stop)
	wg.Wait()
	// A last kill of every server and a restart, then the final reads.
	if err := t.settle(ctx); err != nil {
		return nil, err
	}
	r.finalChecks()
	if err := t.finish(ctx); err != nil {
		return nil, err
	}
	v := &Verdict{Seed: cfg.Seed, Nodes: cfg.Cluster, Kills: r.kills, Leaves: r.leaves, Wipes: r.wipes, Cuts: r.cuts, Ops: r.ops, Unknown: r.unknown}
	checkStart := time.Now()
	found, never := 0, 0
	for i, h := range r.kv {
		before := len(h)
		h, wrong := resolveUnknown(h, r.kvLog[i])
		for _, w := range wrong {
			r.fail("object kv%d: %s", i, w)
		}
		never += before - len(h)
		for _, op := range h {
			if op.Output.(kvOutput).Found {
				found++
			}
		}
		t.boundUnknown(h)
		if cfg.HistoryDir != "" {
			if err := dumpHistory(filepath.Join(cfg.HistoryDir, fmt.Sprintf("kv%d.jsonl", i)), h); err != nil {
				return nil, err
			}
		}
		switch checkKV(h, cfg.CheckTimeout) {
		case porcupine.Illegal:
			r.fail("object kv%d: its %d operations are not linearizable", i, len(h))
			if v.FailingHistory == "" {
				v.FailingHistory = fmt.Sprintf("object kv%d:\n%s", i, smallestFailing(h))
			}
		case porcupine.Unknown:
			r.fail("object kv%d: the linearizability check of %d operations timed out", i, len(h))
		}
	}
	fmt.Fprintf(cfg.Progress, "checked %d objects' histories in %.1fs (of their writes of unknown outcome, %d were found in the change log, %d never took effect)\n",
		len(r.kv), time.Since(checkStart).Seconds(), found, never)
	if r.own != nil {
		if err := r.own.Verify(); err != nil {
			r.fail("ownership: %v", err)
		}
	}
	v.Failures = r.failures
	v.OK = len(v.Failures) == 0
	fmt.Fprint(cfg.Progress, v.String())
	return v, nil
}

// target is what the clients run against: one server or a cluster. Its methods
// are called from Run's goroutine only.
type target interface {
	// start starts the server(s) and stores their URLs in r.urls.
	start(ctx context.Context) error
	// fault injects one fault and returns once it is over (a killed server is
	// back) or under way (a node that left is started again by a later fault).
	fault(ctx context.Context, rng *rand.Rand) error
	// settle, once the clients stopped, kills every server at once and starts
	// them again for the final reads.
	settle(ctx context.Context) error
	// finish stops the servers after the final reads (failures go to r.fail).
	finish(ctx context.Context) error
	// boundUnknown gives each unknown write of a history its latest possible
	// effect (its Return).
	boundUnknown(h []porcupine.Operation)
	// close kills whatever still runs.
	close()
}

// single is one server, SIGKILLed and restarted; the clients wait while it is down.
type single struct {
	r       *run
	srv     *server
	cfgFile string
	dataDir string
}

func (s *single) start(ctx context.Context) error {
	cfg := s.r.cfg
	s.cfgFile = filepath.Join(cfg.Dir, "holdfast.yaml")
	conf := appsYAML + typesYAML
	if err := os.WriteFile(s.cfgFile, []byte(conf), 0o644); err != nil {
		return err
	}
	s.dataDir = filepath.Join(cfg.Dir, "data")
	return s.restart(ctx)
}

func (s *single) restart(ctx context.Context) error {
	srv, err := s.r.startServer(ctx, s.dataDir, s.cfgFile, "", nil)
	if err != nil {
		return err
	}
	s.srv = srv
	s.r.urls.Store(&[]string{srv.url})
	return nil
}

func (s *single) fault(ctx context.Context, rng *rand.Rand) error {
	s.r.down.Store(true)
	s.r.kill(s.srv)
	s.r.kills++
	fmt.Fprintf(s.r.cfg.Progress, "kill %d at %.1fs\n", s.r.kills, time.Since(s.r.start).Seconds())
	time.Sleep(time.Duration(rng.Intn(200)) * time.Millisecond)
	if err := s.restart(ctx); err != nil {
		return err
	}
	s.r.down.Store(false)
	return nil
}

func (s *single) settle(ctx context.Context) error {
	s.r.kill(s.srv)
	s.r.kills++
	return s.restart(ctx)
}

func (s *single) finish(context.Context) error { return nil }

func (s *single) boundUnknown(h []porcupine.Operation) { boundUnknown(h, s.r.killedAt) }

func (s *single) close() {
	if s.srv != nil {
		s.srv.kill()
	}
}

// The server's configuration: the app the clients use and the log type.
const (
	appsYAML  = "apps:\n  - {id: " + app + ", key: " + appKey + ", secret: " + appSecret + "}\n"
	typesYAML = "types:\n  events:\n    log: {maxBatchSize: 100}\n  reg:\n    objects: {changeLogEntries: 100000000}\n"
)

// kill SIGKILLs the server and notes when it had exited: no request it
// received can take effect after that.
func (r *run) kill(srv *server) {
	srv.kill()
	r.mu.Lock()
	r.killedAt = append(r.killedAt, r.now())
	r.mu.Unlock()
}

// boundUnknown gives each operation of unknown outcome (found in the change log
// or not) its latest possible effect: the first kill that ended after the
// client saw the error. The server that received the request may still have
// been running it (a client time-out) but not beyond its own death, and a
// request that saw its connection reset was on a server that was dead by then
// or died at the kill noted just after (the kill is noted a moment after the
// process exits, so the bound may be one kill late, which is loose but never
// wrong). Without the bound an unknown write overlaps every later operation
// and the check's search explodes.
func boundUnknown(h []porcupine.Operation, killedAt []int64) {
	for i := range h {
		// A write found in the change log (resolveUnknown) is bounded the
		// same way: the log says where it falls in the order, not when.
		if o := h[i].Output.(kvOutput); !o.Unknown && !o.Found {
			continue
		}
		seen := h[i].Return
		j := sort.Search(len(killedAt), func(j int) bool { return killedAt[j] > seen })
		if j == len(killedAt) {
			h[i].Return = unknownReturn
		} else {
			h[i].Return = killedAt[j]
		}
	}
}

// dumpHistory writes h as JSON lines (times in ns from the run's start), for a
// look at a failure by other means.
func dumpHistory(path string, h []porcupine.Operation) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, op := range h {
		if err := enc.Encode(map[string]any{"client": op.ClientId, "call": op.Call, "return": op.Return, "in": op.Input, "out": op.Output}); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func orDefault(v, d int) int {
	if v <= 0 {
		return d
	}
	return v
}

// server is one holdfast process.
type server struct {
	cmd    *exec.Cmd
	url    string        // its HTTP address
	exited chan struct{} // closed once it exited; err is then its exit status
	err    error

	mu   sync.Mutex
	tail []string       // its last stderr lines
	logw io.WriteCloser // its stderr and the torture's notes, or nil
}

func (s *server) kill() {
	select {
	case <-s.exited:
	default:
		s.note("SIGKILL")
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.exited
	}
}

// note adds a timestamped line of the torture's own to the server's log.
func (s *server) note(format string, a ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logw != nil {
		fmt.Fprintf(s.logw, "torture: %s %s\n", time.Now().UTC().Format("2006-01-02T15:04:05.000Z"), fmt.Sprintf(format, a...))
	}
}

// lastLines is the end of the server's stderr.
func (s *server) lastLines() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.tail, "\n")
}

// tailLines is how many of a server's last stderr lines are kept for errors.
const tailLines = 200

var listenRE = regexp.MustCompile(`"holdfast listening" addr=(\S+)`)

// startServer starts holdfast serve and waits until it listens. Its stderr is
// appended to logFile unless that is empty; env is added to the environment.
func (r *run) startServer(ctx context.Context, dataDir, cfgFile, logFile string, env []string) (*server, error) {
	cmd := exec.CommandContext(ctx, r.cfg.Binary, "serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--config", cfgFile)
	// A binary built with the plantedbug tag (the torture's own test) refuses
	// to serve without this; every other binary ignores it.
	cmd.Env = append(append(os.Environ(), "HOLDFAST_ALLOW_PLANTED_BUG=1"), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, exited: make(chan struct{})}
	if logFile != "" {
		if s.logw, err = os.OpenFile(logFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err != nil {
			return nil, err
		}
	}
	s.note("start")
	if err := cmd.Start(); err != nil {
		if s.logw != nil {
			s.logw.Close()
		}
		return nil, fmt.Errorf("start %s: %w", r.cfg.Binary, err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			if s.logw != nil {
				_, _ = io.WriteString(s.logw, line+"\n")
			}
			if s.tail = append(s.tail, line); len(s.tail) > 2*tailLines {
				s.tail = append(s.tail[:0], s.tail[len(s.tail)-tailLines:]...)
			}
			s.mu.Unlock()
			if m := listenRE.FindStringSubmatch(line); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr) // a line too long for the scanner
		s.note("stderr closed")
		s.err = cmd.Wait()
		s.note("the process exited: %v", s.err)
		s.mu.Lock()
		if s.logw != nil {
			s.logw.Close()
			s.logw = nil
		}
		s.mu.Unlock()
		close(s.exited)
	}()
	select {
	case a := <-addr:
		s.url = "http://" + a
		return s, nil
	case <-s.exited:
	case <-time.After(30 * time.Second):
		s.kill()
	}
	return nil, fmt.Errorf("torture: the server did not start:\n%s", s.lastLines())
}

// outcome classifies a call: ok (a 2xx reply), unknown (it may have happened),
// or not sent (the server refused the connection: it did not happen).
type outcome int

const (
	ok outcome = iota
	unknown
	notSent
	refused // a 4xx: a definite refusal
)

func (r *run) call(method, path string, body any, out any) (outcome, int) {
	outc, status, _ := r.callRetry(method, path, body, out)
	return outc, status
}

// callRetry is call that also returns a 503's Retry-After.
func (r *run) callRetry(method, path string, body any, out any) (outcome, int, time.Duration) {
	urls := *r.urls.Load()
	u := urls[rand.Intn(len(urls))]
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u+path, rd)
	if err != nil {
		return notSent, 0, 0
	}
	req.Header.Set("X-App-Key", appKey)
	req.Header.Set("X-App-Secret", appSecret)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := r.http.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return notSent, 0, 0
		}
		return unknown, 0, 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	r.recordServed(resp.Header.Get("X-Holdfast-Served-By"), start)
	switch {
	case err != nil || resp.StatusCode >= 500:
		var after time.Duration
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			after = time.Duration(s) * time.Second
		}
		return unknown, resp.StatusCode, after
	case resp.StatusCode >= 400:
		return refused, resp.StatusCode, 0
	}
	if out != nil && len(b) > 0 {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		if err := d.Decode(out); err != nil {
			r.fail("%s %s: reply %q: %v", method, path, b, err)
			return unknown, resp.StatusCode, 0
		}
	}
	return ok, resp.StatusCode, 0
}

func (r *run) client(c int, rng *rand.Rand, stop chan struct{}) {
	var retry []string // keys of an append whose outcome is unknown, to send again
	var retryLog int
	seq := 0
	// In cluster mode, an object or log that answered 503 is left alone until
	// its Retry-After, as a real client would (the partitions of a killed node
	// answer 503 until it is back): that keeps the count of unknown writes, each
	// of which the check must place anywhere until the end (clusterTarget),
	// within what the check can search, and the load on the other partitions up.
	avoid := map[string]time.Time{}
	busy := func(target string) bool {
		until, ok := avoid[target]
		if ok && time.Now().After(until) {
			delete(avoid, target)
			return false
		}
		return ok
	}
	backOff := func(target string, after time.Duration) {
		if r.own != nil && after > 0 {
			avoid[target] = time.Now().Add(after)
		}
	}
	for {
		select {
		case <-stop:
			return
		default:
		}
		if r.down.Load() {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		time.Sleep(time.Duration(rng.Intn(2000)) * time.Microsecond)
		if rng.Intn(100) < 60 {
			obj := rng.Intn(r.cfg.Objects)
			target := fmt.Sprintf("kv%d", obj)
			if busy(target) {
				continue
			}
			backOff(target, r.kvOp(c, obj, rng))
			continue
		}
		l := rng.Intn(len(r.logs))
		switch p := rng.Intn(100); {
		case p < 50 || retry != nil:
			keys := retry
			if keys == nil {
				for range 1 + rng.Intn(3) {
					keys = append(keys, fmt.Sprintf("c%d-%d", c, seq))
					seq++
				}
			} else {
				l = retryLog
			}
			target := fmt.Sprintf("log%d", l)
			if busy(target) {
				retry, retryLog = keys, l
				continue
			}
			done, after := r.appendOp(l, keys)
			if done {
				retry = nil
			} else {
				retry, retryLog = keys, l
			}
			backOff(target, after)
		case p < 85:
			target := fmt.Sprintf("log%d", l)
			if !busy(target) {
				backOff(target, r.readOp(l, rng))
			}
		default:
			target := fmt.Sprintf("log%d", l)
			if !busy(target) {
				backOff(target, r.commitOp(l))
			}
		}
	}
}

// kvOp runs one operation on object obj; it returns a 503's Retry-After.
func (r *run) kvOp(c, obj int, rng *rand.Rand) time.Duration {
	base := fmt.Sprintf("/api/v1/objects/%s/reg/kv%d", app, obj)
	var in kvInput
	var outc outcome
	var status int
	var after time.Duration
	var out kvOutput
	call := r.now()
	switch p := rng.Intn(100); {
	case p < 35:
		in = kvInput{Op: "set", Value: fmt.Sprintf("v%d-%d", c, rng.Intn(1e9))}
		var rep struct {
			LogID json.Number `json:"log_id"`
		}
		outc, status, after = r.callRetry("PUT", base+"/a", map[string]any{"value": in.Value}, &rep)
		out.LogID = num(rep.LogID)
	case p < 60:
		// An amount from a million makes the write recognisable in the change
		// log (resolveUnknown), as the set's random value does.
		in = kvInput{Op: "incr", By: int64(1 + rng.Intn(1e6))}
		var rep struct {
			LogID json.Number `json:"log_id"`
			Value json.Number `json:"value"`
		}
		outc, status, after = r.callRetry("POST", base+"/n/increment", map[string]any{"by": in.By}, &rep)
		out.LogID, out.N = num(rep.LogID), int64(num(rep.Value))
	default:
		in = kvInput{Op: "get"}
		var rep stateReply
		outc, status, after = r.callRetry("GET", base, nil, &rep)
		out = rep.output()
	}
	ret := r.now()
	op := porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret}
	switch outc {
	case notSent:
		return after
	case refused:
		r.fail("kv%d %s: refused with %d", obj, in.Op, status)
		return after
	case unknown:
		if in.Op == "get" {
			return after // a read with no reply changed nothing
		}
		// Return stays the time the client saw the error; the target's
		// boundUnknown moves it to its latest possible effect before the check.
		op.Output = kvOutput{Unknown: true}
	}
	r.mu.Lock()
	r.kv[obj] = append(r.kv[obj], op)
	if outc == unknown {
		r.unknown++
	} else {
		r.ops++
	}
	r.mu.Unlock()
	return after
}

// stateReply is GET /objects/...: the object's slots and log_id.
type stateReply struct {
	State map[string]json.RawMessage `json:"state"`
	LogID json.Number                `json:"log_id"`
}

func (rep stateReply) output() kvOutput {
	out := kvOutput{LogID: num(rep.LogID)}
	if v, has := rep.State["a"]; has {
		out.HasA = true
		_ = json.Unmarshal(v, &out.A)
	}
	if v, has := rep.State["n"]; has {
		var n json.Number
		_ = json.Unmarshal(v, &n)
		out.N = int64(num(n))
	}
	return out
}

// recordPage is GET /logs/.../records.
type recordPage struct {
	Records []struct {
		Offset           uint64          `json:"offset"`
		Body             json.RawMessage `json:"body"`
		DeduplicationKey string          `json:"deduplicationKey"`
	} `json:"records"`
	NextOffset uint64 `json:"nextOffset"`
}

func num(n json.Number) uint64 {
	v, _ := n.Int64()
	return uint64(v)
}

func logPath(l int) string { return fmt.Sprintf("/api/v1/logs/%s/events/log%d", app, l) }

// appendOp appends one record per key; true once its outcome is known. It
// also returns a 503's Retry-After.
func (r *run) appendOp(l int, keys []string) (bool, time.Duration) {
	recs := make([]map[string]any, len(keys))
	for i, k := range keys {
		recs[i] = map[string]any{"body": map[string]any{"k": k}, "deduplicationKey": k}
	}
	var rep struct {
		Offsets []uint64 `json:"offsets"`
	}
	outc, status, after := r.callRetry("POST", logPath(l)+"/append", map[string]any{"records": recs}, &rep)
	switch outc {
	case notSent:
		return false, after
	case unknown:
		r.mu.Lock()
		r.unknown++
		r.mu.Unlock()
		return false, after
	case refused:
		r.fail("log%d append: refused with %d", l, status)
		return true, after
	}
	if len(rep.Offsets) != len(keys) {
		r.fail("log%d append of %d records returned %d offsets", l, len(keys), len(rep.Offsets))
		return true, after
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops++
	lr := r.logs[l]
	for i, k := range keys {
		if prev, dup := lr.acked[k]; dup && prev != rep.Offsets[i] {
			r.failures = append(r.failures, fmt.Sprintf("log%d key %s acknowledged at offset %d, then at %d", l, k, prev, rep.Offsets[i]))
		}
		lr.acked[k] = rep.Offsets[i]
		lr.maxAcked = max(lr.maxAcked, int64(rep.Offsets[i]))
	}
	return true, after
}

// readOp reads log l from a random offset; it returns a 503's Retry-After.
func (r *run) readOp(l int, rng *rand.Rand) time.Duration {
	r.mu.Lock()
	top := r.logs[l].maxAcked
	r.mu.Unlock()
	from := uint64(0)
	if top >= 0 {
		from = uint64(rng.Int63n(top + 2))
	}
	var rep recordPage
	outc, status, after := r.callRetry("GET", fmt.Sprintf("%s/records?from=%d&limit=50", logPath(l), from), nil, &rep)
	if outc == refused {
		r.fail("log%d read from %d: refused with %d", l, from, status)
	}
	if outc != ok {
		return after
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops++
	lr := r.logs[l]
	for i, rec := range rep.Records {
		if rec.Offset != from+uint64(i) {
			r.failures = append(r.failures, fmt.Sprintf("log%d read from %d: record %d has offset %d", l, from, i, rec.Offset))
			return after
		}
		var body struct{ K string }
		if json.Unmarshal(rec.Body, &body) != nil || body.K != rec.DeduplicationKey {
			r.failures = append(r.failures, fmt.Sprintf("log%d offset %d: body %s under key %s", l, rec.Offset, rec.Body, rec.DeduplicationKey))
		}
		if prev, seen := lr.seen[rec.Offset]; seen && prev != rec.DeduplicationKey {
			r.failures = append(r.failures, fmt.Sprintf("log%d offset %d read as %s, then as %s", l, rec.Offset, prev, rec.DeduplicationKey))
		}
		lr.seen[rec.Offset] = rec.DeduplicationKey
	}
	return after
}

// commitOp commits log l's cursor; it returns a 503's Retry-After.
func (r *run) commitOp(l int) time.Duration {
	r.mu.Lock()
	top := r.logs[l].maxAcked
	r.mu.Unlock()
	if top < 0 {
		return 0
	}
	to := uint64(top + 1) // an acknowledged offset exists below it
	var rep struct {
		Offset uint64 `json:"offset"`
	}
	call := r.now()
	outc, status, after := r.callRetry("PUT", logPath(l)+"/cursors/c", map[string]any{"offset": to}, &rep)
	ret := r.now()
	if outc == refused {
		r.fail("log%d commit %d: refused with %d", l, to, status)
	}
	if outc != ok {
		return after
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops++
	r.logs[l].commits = append(r.logs[l].commits, commitOp{call: call, ret: ret, offset: to, cursor: rep.Offset})
	return after
}

// callFinal is a GET of the final reads. A server may answer 503 for a moment
// after the last restart (in a cluster, a node takes another for down for 2 s
// after their connection broke), so it tries again for up to 10 s.
func (r *run) callFinal(method, path string, out any) (outcome, int) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		outc, status := r.call(method, path, nil, out)
		if outc == ok || outc == refused || time.Now().After(deadline) {
			return outc, status
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// finalChecks reads every object and log once the server is back for good.
func (r *run) finalChecks() {
	for obj := range r.cfg.Objects {
		r.kvFinalGet(obj)
		r.kvLog[obj] = r.kvFinalLog(obj)
	}
	for l, lr := range r.logs {
		var all []string // key by offset
		whole := true
		for from := uint64(0); ; {
			var rep recordPage
			if outc, status := r.callFinal("GET", fmt.Sprintf("%s/records?from=%d&limit=100", logPath(l), from), &rep); outc != ok {
				r.fail("log%d final read from %d: %d (the records it did not read are not checked)", l, from, status)
				whole = false
				break
			}
			for i, rec := range rep.Records {
				if rec.Offset != from+uint64(i) {
					r.fail("log%d final read: offset %d where %d was expected (offsets not contiguous)", l, rec.Offset, from+uint64(i))
				}
				var body struct{ K string }
				if json.Unmarshal(rec.Body, &body) != nil || body.K != rec.DeduplicationKey {
					r.fail("log%d offset %d: body %s under key %s", l, rec.Offset, rec.Body, rec.DeduplicationKey)
				}
				all = append(all, rec.DeduplicationKey)
			}
			if len(rep.Records) == 0 {
				break
			}
			from = rep.NextOffset
		}
		at := map[string]uint64{}
		for off, k := range all {
			if prev, dup := at[k]; dup {
				r.fail("log%d key %s at offsets %d and %d", l, k, prev, off)
			}
			at[k] = uint64(off)
		}
		if !whole {
			continue
		}
		keys := make([]string, 0, len(lr.acked))
		for k := range lr.acked {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		lost := 0
		for _, k := range keys {
			off := lr.acked[k]
			if off >= uint64(len(all)) || all[off] != k {
				if lost++; lost <= 5 {
					r.fail("log%d: acknowledged key %s at offset %d is not there after the last restart", l, k, off)
				}
			}
		}
		if lost > 5 {
			r.fail("log%d: %d acknowledged records lost in all", l, lost)
		}
		for off, k := range lr.seen {
			if off >= uint64(len(all)) || all[off] != k {
				r.fail("log%d: offset %d was read as %s, and is not that after the last restart", l, off, k)
				break
			}
		}
		r.checkCursor(l, lr)
	}
}

func (r *run) kvFinalGet(obj int) {
	var rep stateReply
	call := r.now()
	outc, status := r.callFinal("GET", fmt.Sprintf("/api/v1/objects/%s/reg/kv%d", app, obj), &rep)
	if outc != ok {
		r.fail("kv%d final read: %d", obj, status)
		return
	}
	r.kv[obj] = append(r.kv[obj], porcupine.Operation{ClientId: r.cfg.Clients, Input: kvInput{Op: "get"}, Call: call, Output: rep.output(), Return: r.now()})
}

// replyOf GETs path once more and returns its reply's body (for a failure's
// message: why the server refused).
func (r *run) replyOf(path string) string {
	urls := *r.urls.Load()
	req, err := http.NewRequest("GET", urls[rand.Intn(len(urls))]+path, nil)
	if err != nil {
		return err.Error()
	}
	req.Header.Set("X-App-Key", appKey)
	req.Header.Set("X-App-Secret", appSecret)
	resp, err := r.http.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	return fmt.Sprintf("(again: %d %s, served by %s)", resp.StatusCode, bytes.TrimSpace(b), resp.Header.Get("X-Holdfast-Served-By"))
}

// kvFinalLog reads object obj's whole change log (nil if it could not).
func (r *run) kvFinalLog(obj int) []changeLogItem {
	all := []changeLogItem{}
	for {
		var page struct {
			Items []changeLogItem `json:"items"`
		}
		path := fmt.Sprintf("/api/v1/objects/%s/reg/kv%d/log?after=%d&limit=10000", app, obj, uint64(len(all)))
		if outc, status := r.callFinal("GET", path, &page); outc != ok {
			r.fail("kv%d final read of the change log after %d: %d %s", obj, len(all), status, r.replyOf(path))
			return nil
		}
		if len(page.Items) == 0 {
			return all
		}
		all = append(all, page.Items...)
		if last := page.Items[len(page.Items)-1].LogID; last != uint64(len(all)) {
			return all // not one item per entry from 1: resolveUnknown settles nothing
		}
	}
}

// checkCursor: a commit's reply is at least what it asked for, never below a
// commit acknowledged before it was sent, and the cursor after the last restart
// is at least every acknowledged commit.
func (r *run) checkCursor(l int, lr *logRecord) {
	byCall := append([]commitOp(nil), lr.commits...)
	sort.Slice(byCall, func(i, j int) bool { return byCall[i].call < byCall[j].call })
	byRet := append([]commitOp(nil), lr.commits...)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].ret < byRet[j].ret })
	var before uint64 // the highest cursor acknowledged before the current call
	j := 0
	for _, c := range byCall {
		for j < len(byRet) && byRet[j].ret < c.call {
			before = max(before, byRet[j].cursor)
			j++
		}
		if c.cursor < c.offset {
			r.fail("log%d: commit to %d answered cursor %d", l, c.offset, c.cursor)
			return
		}
		if c.cursor < before {
			r.fail("log%d: cursor went back from %d to %d", l, before, c.cursor)
			return
		}
	}
	var rep struct {
		Offset uint64 `json:"offset"`
	}
	if outc, status := r.callFinal("GET", logPath(l)+"/cursors/c", &rep); outc != ok {
		if len(lr.commits) > 0 {
			r.fail("log%d final cursor read: %d", l, status)
		}
		return
	}
	for _, c := range lr.commits {
		if rep.Offset < c.cursor {
			r.fail("log%d: cursor %d after the last restart, below the acknowledged %d", l, rep.Offset, c.cursor)
			return
		}
	}
}
