package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as the server: run with HOLDFAST_TEST_MAIN=1 it is
// `holdfast` with the arguments after "--".
func TestMain(m *testing.M) {
	if os.Getenv("HOLDFAST_TEST_ETCD") != "" {
		runTestEtcd()
		os.Exit(0)
	}
	if os.Getenv("HOLDFAST_TEST_MAIN") == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"holdfast"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const (
	crashAppKey    = "pk_crash"
	crashAppSecret = "sk_crash_secret_0123456789"
)

// server is a holdfast process started by a test.
type server struct {
	cmd    *exec.Cmd
	url    string
	mu     sync.Mutex // guards stderr
	stderr *bytes.Buffer
	exited chan error
	addr   chan string // the address it listens on, once it says it
}

// log returns what the server printed so far.
func (s *server) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

var listenRE = regexp.MustCompile(`"holdfast listening" addr=(\S+)`)

func startServer(t *testing.T, dataDir, configFile string) *server {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--", "serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--config", configFile)
	return startServerCmd(t, cmd)
}

// startServerCmd starts cmd, a `serve` of this test binary (perhaps run
// through a shell), and waits until it listens.
func startServerCmd(t *testing.T, cmd *exec.Cmd) *server {
	t.Helper()
	s := launchServerCmd(t, cmd)
	s.waitListening(t)
	return s
}

// launchServerCmd starts cmd as startServerCmd does, without waiting until
// it listens (waitListening), so that several can start at once.
func launchServerCmd(t *testing.T, cmd *exec.Cmd) *server {
	t.Helper()
	cmd.Env = append(append(os.Environ(), "HOLDFAST_TEST_MAIN=1", "GOTRACEBACK=all"), cmd.Env...) // cmd's own last: they win
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, stderr: &bytes.Buffer{}, exited: make(chan error, 1), addr: make(chan string, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			s.stderr.WriteString(line + "\n")
			s.mu.Unlock()
			if m := listenRE.FindStringSubmatch(line); m != nil {
				s.addr <- m[1]
			}
		}
		s.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState != nil {
			return
		}
		if t.Failed() {
			// SIGQUIT: the Go runtime prints every goroutine to stderr, which
			// the logs of a failed test keep (a hang shows where it waits).
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-s.exited:
				return
			case <-time.After(5 * time.Second):
			}
		}
		_ = cmd.Process.Kill()
		<-s.exited
	})
	return s
}

// waitListening waits until the server says where it listens (its url).
func (s *server) waitListening(t *testing.T) {
	t.Helper()
	select {
	case a := <-s.addr:
		s.url = "http://" + a
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		t.Fatalf("server did not start: %s", s.log())
	}
}

func (s *server) kill(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-s.exited
}

// call sends one request; ok is false when the outcome is unknown (connection
// error, 5xx).
func call(ctx context.Context, c *http.Client, method, url string, body any) (status int, reply map[string]any, err error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-App-Key", crashAppKey)
	req.Header.Set("X-App-Secret", crashAppSecret)
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	if len(b) > 0 {
		if err := json.Unmarshal(b, &reply); err != nil {
			return resp.StatusCode, nil, fmt.Errorf("reply %q: %w", b, err)
		}
	}
	return resp.StatusCode, reply, nil
}

// op is one write issued by the workload; acked ones must survive.
type op struct {
	object string
	kind   string // set, increment, append, transaction
	slot   string
	token  string
	logID  uint64
	value  json.Number // increment reply
	served string      // X-Holdfast-Served-By (node/partition/epoch), in cluster tests
	at     time.Time   // when the reply came, in cluster tests
}

// TestCrash_AcknowledgedWritesSurviveSIGKILL runs concurrent writers over many
// objects, SIGKILLs the server at a random moment, restarts it and checks that
// every acknowledged write is there, log_ids are gap-free and monotonic, the state
// equals the replayed log, and no transaction is half applied. It repeats on the
// same data directory with different kill points.
func TestCrash_AcknowledgedWritesSurviveSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test starts server processes")
	}
	const writers, objects, rounds = 32, 100, 3
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "holdfast.yaml")
	cfg := fmt.Sprintf("apps:\n  - {id: app_crash, key: %s, secret: %s}\ntypes:\n  \"*\":\n    objects: {changeLogEntries: 1000000}\n", crashAppKey, crashAppSecret)
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(dir, "data")
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))

	issued := map[string]bool{} // every token ever sent, acked or not
	var acked []op
	for round := 0; round < rounds; round++ {
		srv := startServer(t, dataDir, cfgFile)
		killAfter := time.Duration(200+rng.Intn(1500)) * time.Millisecond
		roundAcked, roundIssued := runWorkload(t, srv.url, writers, objects, round, rng.Int63(), killAfter, srv)
		acked = append(acked, roundAcked...)
		for tok := range roundIssued {
			issued[tok] = true
		}
		t.Logf("round %d: killed after %v with %d acknowledged writes", round, killAfter, len(roundAcked))
		if len(roundAcked) == 0 {
			t.Fatalf("round %d acknowledged nothing before the kill: %s", round, srv.log())
		}
		srv = startServer(t, dataDir, cfgFile)
		verify(t, srv.url, objects, acked, issued)
		srv.kill(t)
	}
}

func runWorkload(t *testing.T, url string, writers, objects, round int, seed int64, killAfter time.Duration, srv *server) ([]op, map[string]bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: writers}}
	var mu sync.Mutex
	var acked []op
	issued := map[string]bool{}
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(w)))
			for seq := 0; ctx.Err() == nil; seq++ {
				o, method, path, body := randomKVOp(rng, url, objects, round, w, seq, 4)
				mu.Lock()
				issued[o.token] = true
				mu.Unlock()
				status, reply, err := call(ctx, client, method, path, body)
				if err != nil || status != http.StatusOK {
					if ctx.Err() == nil && err == nil {
						t.Errorf("%s %s: status %d %v", method, path, status, reply)
					}
					continue // outcome unknown: the server is being killed
				}
				if err := o.fromReply(reply); err != nil {
					t.Errorf("reply %v: %v", reply, err)
					continue
				}
				mu.Lock()
				acked = append(acked, o)
				mu.Unlock()
			}
		}(w)
	}
	time.Sleep(killAfter) // the kill point is the point of this test: a random moment under load
	srv.kill(t)
	cancel()
	wg.Wait()
	return acked, issued
}

// randomKVOp picks one write of the KV crash workload for writer w: a set, an
// increment, an append, or (kinds 4) a transaction, on one of objects objects.
func randomKVOp(rng *rand.Rand, url string, objects, round, w, seq, kinds int) (o op, method, path string, body any) {
	o = op{object: fmt.Sprintf("o%d", rng.Intn(objects)), token: fmt.Sprintf("r%d-w%d-%d", round, w, seq)}
	base := url + "/api/v1/objects/app_crash/crash/" + o.object
	switch rng.Intn(kinds) {
	case 0:
		o.kind, o.slot = "set", fmt.Sprintf("s%d", w)
		method, path, body = "PUT", base+"/"+o.slot, map[string]any{"value": o.token}
	case 1:
		o.kind, o.slot = "increment", "n"
		method, path, body = "POST", base+"/n/increment", map[string]any{"by": 1}
	case 2:
		o.kind, o.slot = "append", "l"
		method, path, body = "POST", base+"/l/append", map[string]any{"value": o.token}
	case 3:
		o.kind = "transaction"
		method, path, body = "POST", base+"/transaction", []map[string]any{
			{"op": "set", "key": "ta", "value": o.token},
			{"op": "set", "key": "tb", "value": o.token},
			{"op": "increment", "key": "tn"},
		}
	}
	return o, method, path, body
}

// fromReply records an acknowledged write's log_id (and an increment's value).
func (o *op) fromReply(reply map[string]any) error {
	var id json.Number
	if err := decodeNumber(reply["log_id"], &id); err != nil {
		return err
	}
	n, _ := id.Int64()
	o.logID = uint64(n)
	if o.kind == "increment" {
		_ = decodeNumber(reply["value"], &o.value)
	}
	return nil
}

func decodeNumber(v any, dst *json.Number) error {
	f, ok := v.(float64)
	if !ok {
		return fmt.Errorf("not a number: %v", v)
	}
	*dst = json.Number(fmt.Sprint(int64(f)))
	return nil
}

type entryItem struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
	LogID uint64          `json:"log_id"`
}

func verify(t *testing.T, url string, objects int, acked []op, issued map[string]bool) {
	t.Helper()
	ctx := context.Background()
	client := &http.Client{Timeout: 30 * time.Second}
	byObject := map[string]map[uint64]op{}
	var dups []string
	for _, o := range acked {
		if byObject[o.object] == nil {
			byObject[o.object] = map[uint64]op{}
		}
		if prev, dup := byObject[o.object][o.logID]; dup {
			if len(dups) == 0 {
				t.Logf("%s's acknowledged writes by time:\n%s", o.object, ackHistory(acked, o.object))
			}
			dups = append(dups, fmt.Sprintf("%s: log_id %d acknowledged twice (%+v and %+v)", o.object, o.logID, prev, o))
		}
		byObject[o.object][o.logID] = o
	}
	if len(dups) > 0 {
		t.Fatalf("%d log_ids acknowledged twice; the first ones:\n%s", len(dups), strings.Join(dups[:min(len(dups), 5)], "\n"))
	}
	for i := 0; i < objects; i++ {
		name := fmt.Sprintf("o%d", i)
		base := url + "/api/v1/objects/app_crash/crash/" + name
		// Read the whole log.
		entries := map[uint64][]entryItem{}
		var order []uint64
		for after := uint64(0); ; {
			req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/log?after=%d&limit=10000", base, after), nil)
			req.Header.Set("X-App-Key", crashAppKey)
			req.Header.Set("X-App-Secret", crashAppSecret)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var page struct{ Items []entryItem }
			err = json.NewDecoder(resp.Body).Decode(&page)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("%s log: %d %v", name, resp.StatusCode, err)
			}
			if len(page.Items) == 0 {
				break
			}
			for _, it := range page.Items {
				if len(order) == 0 || order[len(order)-1] != it.LogID {
					order = append(order, it.LogID)
				}
				entries[it.LogID] = append(entries[it.LogID], it)
			}
			after = order[len(order)-1]
		}
		for j, id := range order {
			if id != uint64(j+1) {
				t.Fatalf("%s: log_ids %v... not gap-free from 1 (position %d holds %d)", name, order[:min(len(order), 10)], j, id)
			}
		}
		// Replay the log and compare with the state.
		replay := map[string]json.RawMessage{}
		for _, id := range order {
			items := entries[id]
			var ta, tb string
			for _, it := range items {
				if string(it.Value) == "null" {
					delete(replay, it.Key)
				} else {
					replay[it.Key] = it.Value
				}
				var s string
				if json.Unmarshal(it.Value, &s) == nil && strings.HasPrefix(s, "r") && !issued[s] {
					t.Fatalf("%s log_id %d holds %q, which no client ever sent", name, id, s)
				}
				switch it.Key {
				case "ta":
					ta = string(it.Value)
				case "tb":
					tb = string(it.Value)
				}
			}
			if ta != tb {
				t.Fatalf("%s log_id %d: a half-applied transaction (ta=%s tb=%s)", name, id, ta, tb)
			}
		}
		status, reply, err := call(ctx, client, "GET", base, nil)
		if err != nil || status != 200 {
			t.Fatalf("%s state: %d %v", name, status, err)
		}
		var lastID json.Number
		_ = decodeNumber(reply["log_id"], &lastID)
		if string(lastID) != fmt.Sprint(len(order)) {
			t.Fatalf("%s: state log_id %s, log has %d entries", name, lastID, len(order))
		}
		state, _ := json.Marshal(reply["state"])
		want, _ := json.Marshal(replay)
		var a, b any
		_ = json.Unmarshal(state, &a)
		_ = json.Unmarshal(want, &b)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("%s: state %s differs from the replayed log %s", name, state, want)
		}
		// Every acknowledged write is in its entry.
		for id, o := range byObject[name] {
			items, ok := entries[id]
			if !ok {
				t.Fatalf("%s: acknowledged %s at log_id %d is missing after the crash", name, o.kind, id)
			}
			checkEntry(t, name, o, items)
		}
	}
}

func checkEntry(t *testing.T, name string, o op, items []entryItem) {
	t.Helper()
	tok, _ := json.Marshal(o.token)
	fail := func() {
		t.Fatalf("%s log_id %d: acknowledged %s %q but the entry holds %+v", name, o.logID, o.kind, o.token, items)
	}
	switch o.kind {
	case "set":
		if len(items) != 1 || items[0].Key != o.slot || string(items[0].Value) != string(tok) {
			fail()
		}
	case "increment":
		if len(items) != 1 || items[0].Key != "n" || string(items[0].Value) != string(o.value) {
			fail()
		}
	case "append":
		var list []string
		if len(items) != 1 || items[0].Key != "l" || json.Unmarshal(items[0].Value, &list) != nil || len(list) == 0 || list[len(list)-1] != o.token {
			fail()
		}
	case "transaction":
		if len(items) != 3 || items[0].Key != "ta" || items[1].Key != "tb" || items[2].Key != "tn" ||
			string(items[0].Value) != string(tok) || string(items[1].Value) != string(tok) {
			fail()
		}
	}
}

// crashSetup writes a configuration with the crash app and the given types
// section (YAML under "types:", may be empty) and returns it, the data directory
// and a logged random seed.
func crashSetup(t *testing.T, types string) (cfgFile, dataDir string, rng *rand.Rand) {
	t.Helper()
	dir := t.TempDir()
	cfgFile = filepath.Join(dir, "holdfast.yaml")
	cfg := fmt.Sprintf("apps:\n  - {id: app_crash, key: %s, secret: %s}\n", crashAppKey, crashAppSecret)
	if types != "" {
		cfg += "types:\n" + types
	}
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	return cfgFile, filepath.Join(dir, "data"), rand.New(rand.NewSource(seed))
}

// ackHistory lists the writes to object that were acknowledged, by the time
// their replies came (cluster tests record it), with who served them.
func ackHistory(acked []op, object string) string {
	var ops []op
	for _, o := range acked {
		if o.object == object {
			ops = append(ops, o)
		}
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].at.Before(ops[j].at) })
	var b strings.Builder
	for _, o := range ops {
		fmt.Fprintf(&b, "%s log_id %d %s %s served by %s\n", o.at.Format("15:04:05.000"), o.logID, o.kind, o.token, o.served)
	}
	return b.String()
}
