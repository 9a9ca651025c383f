// Package torture runs many concurrent clients against a Holdfast server that is
// SIGKILLed and restarted at random, records every call with its outcome, and
// checks the history: each KV object's operations must be linearizable
// (github.com/anishathalye/porcupine, with log_id in every reply), and each
// retained log must hold every acknowledged offset with its record, contiguous
// offsets, every key once, and cursors that never go back.
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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/anishathalye/porcupine"
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
	// KillMin and KillMax bound the time between kills; zero means 1s and 5s.
	KillMin, KillMax time.Duration
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
	Kills    int
	Ops      int // operations with a known outcome
	Unknown  int // writes whose outcome is unknown (cut off by a kill)
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
	fmt.Fprintf(&b, "%s: seed %d, %d kills, %d operations, %d with unknown outcome\n", status, v.Seed, v.Kills, v.Ops, v.Unknown)
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
	appSecret = "sk_torture_secret"
	app       = "app_torture"
)

type run struct {
	cfg   Config
	start time.Time
	url   atomic.Pointer[string]
	down  atomic.Bool
	http  *http.Client

	mu       sync.Mutex
	killedAt []int64                 // r.now() once each killed server had exited
	kv       [][]porcupine.Operation // per object
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
	r := &run{cfg: cfg, start: time.Now(), http: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		kv: make([][]porcupine.Operation, cfg.Objects)}
	for range cfg.Logs {
		r.logs = append(r.logs, &logRecord{acked: map[string]uint64{}, seen: map[uint64]string{}, maxAcked: -1})
	}
	cfgFile := filepath.Join(cfg.Dir, "holdfast.yaml")
	conf := fmt.Sprintf("apps:\n  - {id: %s, key: %s, secret: %s}\ntypes:\n  events:\n    log: {maxBatchSize: 100}\n", app, appKey, appSecret)
	if err := os.WriteFile(cfgFile, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	dataDir := filepath.Join(cfg.Dir, "data")
	srv, err := r.startServer(ctx, dataDir, cfgFile)
	if err != nil {
		return nil, err
	}
	defer func() { srv.kill() }()

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
	kills := 0
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
		r.down.Store(true)
		r.kill(srv)
		kills++
		fmt.Fprintf(cfg.Progress, "kill %d at %.1fs\n", kills, time.Since(r.start).Seconds())
		time.Sleep(time.Duration(rng.Intn(200)) * time.Millisecond)
		if srv, err = r.startServer(ctx, dataDir, cfgFile); err != nil {
			close(stop)
			wg.Wait()
			return nil, err
		}
		r.down.Store(false)
	}
	time.Sleep(time.Until(deadline))
	close(stop)
	wg.Wait()
	// A last kill and restart, then the final reads.
	r.kill(srv)
	kills++
	if srv, err = r.startServer(ctx, dataDir, cfgFile); err != nil {
		return nil, err
	}
	r.finalChecks()
	v := &Verdict{Seed: cfg.Seed, Kills: kills, Ops: r.ops, Unknown: r.unknown}
	checkStart := time.Now()
	for i, h := range r.kv {
		boundUnknown(h, r.killedAt)
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
	fmt.Fprintf(cfg.Progress, "checked %d objects' histories in %.1fs\n", len(r.kv), time.Since(checkStart).Seconds())
	v.Failures = r.failures
	v.OK = len(v.Failures) == 0
	fmt.Fprint(cfg.Progress, v.String())
	return v, nil
}

// kill SIGKILLs the server and notes when it had exited: no request it
// received can take effect after that.
func (r *run) kill(srv *server) {
	srv.kill()
	r.mu.Lock()
	r.killedAt = append(r.killedAt, r.now())
	r.mu.Unlock()
}

// boundUnknown gives each operation of unknown outcome its latest possible
// effect: the first kill that ended after the client saw the error. The server
// that received the request may still have been running it (a client time-out)
// but not beyond its own death, and a request that saw its connection reset
// was on a server that was dead by then or died at the kill noted just after
// (the kill is noted a moment after the process exits, so the bound may be one
// kill late, which is loose but never wrong). Without the bound an unknown
// write overlaps every later operation and the check's search explodes.
func boundUnknown(h []porcupine.Operation, killedAt []int64) {
	for i := range h {
		if !h[i].Output.(kvOutput).Unknown {
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
	exited chan struct{}
}

func (s *server) kill() {
	if s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.exited
	}
}

var listenRE = regexp.MustCompile(`"holdfast listening" addr=(\S+)`)

func (r *run) startServer(ctx context.Context, dataDir, cfgFile string) (*server, error) {
	cmd := exec.CommandContext(ctx, r.cfg.Binary, "serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--config", cfgFile)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", r.cfg.Binary, err)
	}
	s := &server{cmd: cmd, exited: make(chan struct{})}
	addr := make(chan string, 1)
	var tail bytes.Buffer
	var tailMu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			tailMu.Lock()
			if tail.Len() < 64<<10 {
				tail.WriteString(line + "\n")
			}
			tailMu.Unlock()
			if m := listenRE.FindStringSubmatch(line); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		_ = cmd.Wait()
		close(s.exited)
	}()
	select {
	case a := <-addr:
		u := "http://" + a
		r.url.Store(&u)
		return s, nil
	case <-s.exited:
	case <-time.After(30 * time.Second):
		s.kill()
	}
	tailMu.Lock()
	defer tailMu.Unlock()
	return nil, fmt.Errorf("torture: the server did not start:\n%s", tail.String())
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
	u := r.url.Load()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, *u+path, rd)
	if err != nil {
		return notSent, 0
	}
	req.Header.Set("X-App-Key", appKey)
	req.Header.Set("X-App-Secret", appSecret)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := r.http.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return notSent, 0
		}
		return unknown, 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil || resp.StatusCode >= 500:
		return unknown, resp.StatusCode
	case resp.StatusCode >= 400:
		return refused, resp.StatusCode
	}
	if out != nil && len(b) > 0 {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		if err := d.Decode(out); err != nil {
			r.fail("%s %s: reply %q: %v", method, path, b, err)
			return unknown, resp.StatusCode
		}
	}
	return ok, resp.StatusCode
}

func (r *run) client(c int, rng *rand.Rand, stop chan struct{}) {
	var retry []string // keys of an append whose outcome is unknown, to send again
	var retryLog int
	seq := 0
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
			r.kvOp(c, rng)
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
			if r.appendOp(l, keys) {
				retry = nil
			} else {
				retry, retryLog = keys, l
			}
		case p < 85:
			r.readOp(l, rng)
		default:
			r.commitOp(l)
		}
	}
}

func (r *run) kvOp(c int, rng *rand.Rand) {
	obj := rng.Intn(r.cfg.Objects)
	base := fmt.Sprintf("/api/v1/objects/%s/reg/kv%d", app, obj)
	var in kvInput
	var outc outcome
	var status int
	var out kvOutput
	call := r.now()
	switch p := rng.Intn(100); {
	case p < 35:
		in = kvInput{Op: "set", Value: fmt.Sprintf("v%d-%d", c, rng.Intn(1e9))}
		var rep struct {
			LogID json.Number `json:"log_id"`
		}
		outc, status = r.call("PUT", base+"/a", map[string]any{"value": in.Value}, &rep)
		out.LogID = num(rep.LogID)
	case p < 60:
		in = kvInput{Op: "incr", By: int64(1 + rng.Intn(5))}
		var rep struct {
			LogID json.Number `json:"log_id"`
			Value json.Number `json:"value"`
		}
		outc, status = r.call("POST", base+"/n/increment", map[string]any{"by": in.By}, &rep)
		out.LogID, out.N = num(rep.LogID), int64(num(rep.Value))
	default:
		in = kvInput{Op: "get"}
		var rep stateReply
		outc, status = r.call("GET", base, nil, &rep)
		out = rep.output()
	}
	ret := r.now()
	op := porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret}
	switch outc {
	case notSent:
		return
	case refused:
		r.fail("kv%d %s: refused with %d", obj, in.Op, status)
		return
	case unknown:
		if in.Op == "get" {
			return // a read with no reply changed nothing
		}
		// Return stays the time the client saw the error; boundUnknown moves it
		// to the kill that ended that server before the check.
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

// appendOp appends one record per key; true once its outcome is known.
func (r *run) appendOp(l int, keys []string) bool {
	recs := make([]map[string]any, len(keys))
	for i, k := range keys {
		recs[i] = map[string]any{"body": map[string]any{"k": k}, "deduplicationKey": k}
	}
	var rep struct {
		Offsets []uint64 `json:"offsets"`
	}
	outc, status := r.call("POST", logPath(l)+"/append", map[string]any{"records": recs}, &rep)
	switch outc {
	case notSent:
		return false
	case unknown:
		r.mu.Lock()
		r.unknown++
		r.mu.Unlock()
		return false
	case refused:
		r.fail("log%d append: refused with %d", l, status)
		return true
	}
	if len(rep.Offsets) != len(keys) {
		r.fail("log%d append of %d records returned %d offsets", l, len(keys), len(rep.Offsets))
		return true
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
	return true
}

func (r *run) readOp(l int, rng *rand.Rand) {
	r.mu.Lock()
	top := r.logs[l].maxAcked
	r.mu.Unlock()
	from := uint64(0)
	if top >= 0 {
		from = uint64(rng.Int63n(top + 2))
	}
	var rep recordPage
	outc, status := r.call("GET", fmt.Sprintf("%s/records?from=%d&limit=50", logPath(l), from), nil, &rep)
	if outc == refused {
		r.fail("log%d read from %d: refused with %d", l, from, status)
	}
	if outc != ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops++
	lr := r.logs[l]
	for i, rec := range rep.Records {
		if rec.Offset != from+uint64(i) {
			r.failures = append(r.failures, fmt.Sprintf("log%d read from %d: record %d has offset %d", l, from, i, rec.Offset))
			return
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
}

func (r *run) commitOp(l int) {
	r.mu.Lock()
	top := r.logs[l].maxAcked
	r.mu.Unlock()
	if top < 0 {
		return
	}
	to := uint64(top + 1) // an acknowledged offset exists below it
	var rep struct {
		Offset uint64 `json:"offset"`
	}
	call := r.now()
	outc, status := r.call("PUT", logPath(l)+"/cursors/c", map[string]any{"offset": to}, &rep)
	ret := r.now()
	if outc == refused {
		r.fail("log%d commit %d: refused with %d", l, to, status)
	}
	if outc != ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops++
	r.logs[l].commits = append(r.logs[l].commits, commitOp{call: call, ret: ret, offset: to, cursor: rep.Offset})
}

// finalChecks reads every object and log once the server is back for good.
func (r *run) finalChecks() {
	for obj := range r.cfg.Objects {
		for try := 0; ; try++ {
			n := len(r.kv[obj])
			r.kvFinalGet(obj)
			if len(r.kv[obj]) > n || try == 20 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for l, lr := range r.logs {
		var all []string // key by offset
		for from := uint64(0); ; {
			var rep recordPage
			if outc, status := r.call("GET", fmt.Sprintf("%s/records?from=%d&limit=100", logPath(l), from), nil, &rep); outc != ok {
				r.fail("log%d final read from %d: %d", l, from, status)
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
	outc, _ := r.call("GET", fmt.Sprintf("/api/v1/objects/%s/reg/kv%d", app, obj), nil, &rep)
	if outc != ok {
		return
	}
	r.kv[obj] = append(r.kv[obj], porcupine.Operation{ClientId: r.cfg.Clients, Input: kvInput{Op: "get"}, Call: call, Output: rep.output(), Return: r.now()})
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
	if outc, status := r.call("GET", logPath(l)+"/cursors/c", nil, &rep); outc != ok {
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
