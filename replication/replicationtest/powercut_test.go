package replicationtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/internal/powerfs"
	"github.com/holdfast/holdfast/persistence"
	"github.com/holdfast/holdfast/replication"
	"github.com/holdfast/holdfast/replication/internal/testknobs"
)

// The power-cut test of replicated storage. The fault it models is a power
// loss: every write that was not fsynced, and every directory entry whose
// directory was not fsynced, is gone (internal/powerfs drops them at the cut).
// Unlike kill -9, a power cut also loses what Badger holds only in memtables
// (TRAPS.md, "Badger"), which is exactly what a replica's log must still give
// back at a restart.
//
// A writer process runs a single-node replication.Engine (voters {1}) over a
// WALPipeline on a powerfs mount, with a small KeepEntries and Badger flushed
// several times a second, so that logs are truncated (to RaftFlushed+1) under
// load; the test cuts the power at a random moment, kills the writer, and
// restarts it on what was synced: once every group leads again and has applied
// every entry its log holds, every acknowledged write must be in Badger.
//
// The harness is a compact copy of persistence/powercut_test.go's (its
// helpers are unexported there). Only the writer process touches the mount
// (the test process never maps its files: a page fault on a mount the same
// process serves can deadlock). Its planted bug: a log truncated to the
// applied index + 1 (testknobs.TruncateApplied) must be caught.

const (
	walCutChildEnv = "HOLDFAST_WALCUT_CHILD"   // the data directory of the writer process
	walCutPlantEnv = "HOLDFAST_WALCUT_PLANTED" // "1": the writer plants testknobs.TruncateApplied
	walCutCutsEnv  = "HOLDFAST_WALCUT_CUTS"    // cuts per run of TestWALStorage_PowerCutLosesNoAcknowledgedWrite
	walCutDirEnv   = "HOLDFAST_WALCUT_DIR"     // an empty directory to work in and keep, instead of a temporary one

	// A log is truncated only once its replica applied walCutKeep entries
	// beyond what the last flush left in tables, so each group needs more
	// than walCutKeep applies per walCutFlushing: a few groups, a small keep.
	walCutGroups    = 4
	walCutKeys      = 2048 // many, so that a key's last write is often far behind the log's end
	walCutWriters   = 16   // goroutines, each owning the keys i with i%walCutWriters == its number
	walCutValueSize = 1500
	walCutKeep      = 20 // the WAL pipeline's KeepEntries: small, so that truncations are frequent
	walCutFlushing  = 150 * time.Millisecond
	// walCutPlantedCuts is the cuts within which the planted bug must be
	// caught; the run stops at the first catch.
	walCutPlantedCuts = 20
)

func walCutKey(i int) string { return fmt.Sprintf("p/pc-%04d", i) }

// walCutGroup is the group that owns key i.
func walCutGroup(i int) replication.GroupID { return replication.GroupID(i%walCutGroups + 1) }

// walCutValue is version n of key: "key=n|" and padding, so that a value read
// back shows its key, its version and whether it is whole.
func walCutValue(key string, n uint64) []byte {
	v := fmt.Appendf(nil, "%s=%d|", key, n)
	return append(v, bytes.Repeat([]byte{'.'}, walCutValueSize-len(v))...)
}

func parseWALCutValue(key string, v []byte) (uint64, error) {
	head, pad, ok := bytes.Cut(v, []byte("|"))
	k, n, ok2 := strings.Cut(string(head), "=")
	version, err := strconv.ParseUint(n, 10, 64)
	if !ok || !ok2 || k != key || err != nil || len(v) != walCutValueSize || len(bytes.Trim(pad, ".")) != 0 {
		return 0, fmt.Errorf("key %s holds a value that was never written: %.60q", key, v)
	}
	return version, nil
}

// dropTransport drops every message: the groups have one voter each.
type dropTransport struct{}

func (dropTransport) Send(replication.NodeID, []replication.Envelope) {}

var _ replication.Transport = dropTransport{}

// walCutNode is the replicated node of the power-cut test: one database, its
// pipelines and one engine of walCutGroups groups, replica 1 on node 1.
type walCutNode struct {
	db *persistence.DB
	pp *persistence.Pipeline
	wp *replication.WALPipeline
	e  *replication.Engine
	// first is each group's log's first index at open: above 1 once a
	// truncation survived.
	first map[replication.GroupID]uint64
}

// openWALCutNode opens the node in dir, bootstrapping each group whose log is
// new (no entries and no configuration), and starts it; then waits until every
// group leads and applied every entry its log holds (an empty proposal per
// group returned), so that Badger holds all that survived.
func openWALCutNode(ctx context.Context, dir string, planted bool, log *slog.Logger) (_ *walCutNode, err error) {
	db, err := persistence.Open(persistence.Config{Dir: dir, Replicated: true, MemTableSize: 8 << 20, SegmentSize: 1 << 20, BlockCacheSize: 1 << 20, ValueLogFileSize: 1 << 20, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	n := &walCutNode{db: db, first: map[replication.GroupID]uint64{}}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	n.pp = persistence.NewPipeline(db, persistence.PipelineConfig{Logger: log, ValueLogGCEvery: -1})
	n.pp.Start()
	n.wp = replication.NewWALPipeline(db, n.pp, replication.WALConfig{KeepEntries: walCutKeep, Logger: log})
	if planted {
		testknobs.TruncateApplied(n.wp)
	}
	n.e, err = replication.New(replication.Config{Node: 1, TickInterval: 2 * time.Millisecond, ElectionTick: 10, Workers: 2, Logger: log}, dropTransport{}, n.wp)
	if err != nil {
		return n, err
	}
	peers := map[replication.ReplicaID]replication.NodeID{1: 1}
	for g := replication.GroupID(1); g <= walCutGroups; g++ {
		s := db.RaftStorage(uint64(g), 1, nil)
		last, _ := s.LastIndex()
		_, cs, err := s.InitialState()
		if err != nil {
			return n, fmt.Errorf("group %d: %w", g, err)
		}
		if last == 0 && len(cs.GetVoters()) == 0 {
			if err := n.wp.Bootstrap(ctx, g, 1, &raftpb.ConfState{Voters: []uint64{1}}); err != nil {
				return n, err
			}
		}
		st, applied, err := n.wp.Storage(g, 1)
		if err != nil {
			return n, err
		}
		n.first[g] = applied + 1
		if err := n.e.AddGroup(replication.GroupConfig{ID: g, Replica: 1, Peers: peers, Storage: st, Applied: applied}); err != nil {
			return n, err
		}
	}
	if err := n.e.Start(); err != nil {
		return n, err
	}
	for g := replication.GroupID(1); g <= walCutGroups; g++ {
		for {
			st, err := n.e.Status(g)
			if err != nil {
				return n, err
			}
			if st.Err != nil {
				return n, st.Err
			}
			if st.IsLeader {
				break
			}
			if err := sleepCtx(ctx, time.Millisecond); err != nil {
				return n, fmt.Errorf("group %d elects no leader: %w", g, err)
			}
		}
		// Applied in order: once it returns, so is every entry before it.
		if _, err := n.e.Propose(ctx, g, nil); err != nil {
			return n, fmt.Errorf("group %d: the empty proposal: %w", g, err)
		}
	}
	return n, n.err()
}

// err is the first failure of the engine or the WAL pipeline.
func (n *walCutNode) err() error {
	if err := n.e.Err(); err != nil {
		return err
	}
	return n.wp.Err()
}

// state reads the version of every key (0 when absent).
func (n *walCutNode) state(ctx context.Context) (map[string]uint64, error) {
	state := make(map[string]uint64, walCutKeys)
	for i := range walCutKeys {
		k := walCutKey(i)
		v, found, err := n.db.Get(ctx, []byte(k))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", k, err)
		}
		state[k] = 0 // listed: the parent counts a first write in flight
		if found {
			if state[k], err = parseWALCutValue(k, v); err != nil {
				return nil, err
			}
		}
	}
	return state, nil
}

func (n *walCutNode) close() {
	if n.wp != nil {
		n.wp.Close()
	}
	if n.e != nil {
		_ = n.e.Close()
	}
	if n.pp != nil {
		n.pp.Close()
	}
	_ = n.db.Close()
}

// TestWALPowerCut_Child is the writer process of the power-cut tests; it runs
// only when one of them starts it.
func TestWALPowerCut_Child(t *testing.T) {
	dir := os.Getenv(walCutChildEnv)
	if dir == "" {
		t.Skip("the writer process of TestWALStorage_PowerCutLosesNoAcknowledgedWrite; runs only when started by it")
	}
	walCutChild(dir, os.Getenv(walCutPlantEnv) == "1")
}

// walCutChild opens the node in dir, prints "first G N" for each group's log's
// first index, "have KEY N" for the version of every key it finds and "ready",
// then writes until it is killed: each key has at most one write in flight,
// version after version, and each is printed as "ack KEY N" once Propose
// returned. Any error is printed as "error ..." and ends the process.
func walCutChild(dir string, planted bool) {
	var outMu sync.Mutex
	// One write(2) per line, after the acknowledgement: the parent trusts
	// only complete lines.
	printf := func(format string, a ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		_, _ = os.Stdout.Write(fmt.Appendf(nil, format, a...))
	}
	fail := func(what string, err error) {
		printf("error %s: %v\n", what, err)
		os.Exit(1)
	}
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n, err := openWALCutNode(ctx, dir, planted, log)
	if err != nil {
		fail("start", err)
	}
	for g, first := range n.first {
		printf("first %d %d\n", g, first)
	}
	state, err := n.state(ctx)
	if err != nil {
		fail("read the recovered state", err)
	}
	for k, v := range state {
		printf("have %s %d\n", k, v)
	}
	printf("ready\n")
	for w := range walCutWriters {
		go func() {
			ver := map[string]uint64{}
			for {
				for i := w; i < walCutKeys; i += walCutWriters {
					k := walCutKey(i)
					if ver[k] == 0 {
						ver[k] = state[k]
					}
					ver[k]++
					payload := persistence.AppendChanges(nil, &persistence.Write{Sets: []persistence.KV{{Key: []byte(k), Value: walCutValue(k, ver[k])}}})
					if _, err := n.e.Propose(ctx, walCutGroup(i), payload); err != nil {
						fail("propose", err)
					}
					printf("ack %s %d\n", k, ver[k])
				}
			}
		}()
	}
	// Badger flushes its memtables several times a second, so that
	// RaftFlushed advances and the logs are truncated under load.
	for {
		time.Sleep(walCutFlushing)
		if err := n.pp.Flush(); err != nil {
			fail("flush", err)
		}
		if err := n.err(); err != nil {
			fail("replication", err)
		}
	}
}

// errLostWrite marks a check that found an acknowledged write missing: what
// the planted bug must produce (any other failure is not a catch).
var errLostWrite = errors.New("acknowledged write lost")

// walCutModel is what the parent knows of the keys' versions.
type walCutModel struct {
	acked   map[string]uint64 // the highest acknowledged version
	written map[string]uint64 // the highest version ever proposed, at most
	pending int               // acknowledgements not yet checked
	checked int               // acknowledgements found in a recovered state
	first   uint64            // the highest first index a restarted log had
}

// check compares a recovered state with what was acknowledged and written.
func (m *walCutModel) check(state map[string]uint64) error {
	for k, a := range m.acked {
		if state[k] < a {
			return fmt.Errorf("%w: key %s holds version %d, version %d was acknowledged", errLostWrite, k, state[k], a)
		}
	}
	for k, n := range state {
		if n > m.written[k] {
			return fmt.Errorf("key %s holds version %d, never written (at most %d was)", k, n, m.written[k])
		}
	}
	m.checked += m.pending
	m.pending = 0
	return nil
}

type walCutResult struct {
	cuts    int    // cuts made before the check that failed, or all
	checked int    // acknowledged writes found after a cut
	first   uint64 // the highest first index a restarted log had
	err     error
}

// runWALCuts runs the writer on a powerfs mount and cuts the power under it up
// to cuts times, each time restarting it on the state the cut left (the
// restarted writer reports that state first); after the last cut the test
// process opens that state itself (a plain directory by then) and checks it.
// It stops at the first check that fails and returns it in the result; a
// failure of the harness fails t.
func runWALCuts(t *testing.T, cuts int, planted bool) walCutResult {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); errors.Is(err, os.ErrNotExist) {
		t.Skip("no /dev/fuse: the power-cut test runs the storage on a FUSE filesystem")
	}
	base := t.TempDir()
	if d := os.Getenv(walCutDirEnv); d != "" {
		base = d // kept for a look after a failure
	}
	mnt := filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 27))
	t.Logf("seed %d", seed)
	m := &walCutModel{acked: map[string]uint64{}, written: map[string]uint64{}}
	res := walCutResult{}
	recovered := ""
	for cut := 1; cut <= cuts; cut++ {
		next := filepath.Join(base, fmt.Sprintf("cut-%d", cut))
		run, err := walCutRun(t, mnt, recovered, next, planted, rng)
		if err == nil && run.ready {
			err = m.check(run.have)
		}
		res.checked, res.first = m.checked, m.first
		if err != nil {
			res.cuts = cut - 1
			res.err = fmt.Errorf("start %d (after cut %d): %w\nthe tree it started on:\n%s", cut, cut-1, err, run.tree)
			return res
		}
		if recovered != "" {
			_ = os.RemoveAll(recovered) // checked, and loaded into the mount's memory
		}
		recovered = next
		for _, f := range run.first {
			m.first = max(m.first, f)
		}
		if run.ready {
			// Every key may have had one write in flight, its version at
			// start + 1 or its last acknowledged one + 1.
			for k, n := range run.have {
				m.written[k] = max(m.written[k], n+1)
			}
		}
		for k, n := range run.acks {
			m.acked[k] = max(m.acked[k], n)
			m.written[k] = max(m.written[k], n+1)
		}
		m.pending += run.ackCount
		res.cuts = cut
		t.Logf("cut %d: %v after start, %d writes acknowledged (%s)", cut, run.cutAfter.Round(time.Millisecond), run.ackCount, run.when)
	}
	tree := describeTree(recovered)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := openWALCutNode(ctx, filepath.Join(recovered, "data"), planted, quiet)
	if err != nil {
		res.err = fmt.Errorf("start after cut %d: %w\nrecovered tree:\n%s", cuts, err, tree)
		return res
	}
	defer n.close()
	for _, f := range n.first {
		m.first = max(m.first, f)
	}
	state, err := n.state(ctx)
	if err == nil {
		err = m.check(state)
	}
	if err != nil {
		res.err = fmt.Errorf("after cut %d: %w\nrecovered tree:\n%s", cuts, err, tree)
	}
	res.checked, res.first = m.checked, m.first
	return res
}

// walCutRunResult is what one writer process said before its cut.
type walCutRunResult struct {
	ready    bool
	first    map[replication.GroupID]uint64 // the logs' first indexes at start
	have     map[string]uint64              // the versions it found at start
	acks     map[string]uint64              // the highest version acknowledged per key
	ackCount int
	cutAfter time.Duration
	when     string // when the cut came
	tree     string // the state it started from
}

// walCutRun mounts powerfs at mnt over the state in seed (none if empty), runs
// the writer on it, cuts the power at a random moment, and leaves the durable
// state in next. A writer that stops before the cut is an error returned; the
// harness failing fails t.
func walCutRun(t *testing.T, mnt, seed, next string, planted bool, rng *rand.Rand) (walCutRunResult, error) {
	t.Helper()
	run := walCutRunResult{first: map[replication.GroupID]uint64{}, have: map[string]uint64{}, acks: map[string]uint64{}}
	if seed != "" {
		run.tree = describeTree(seed)
	}
	fs, err := powerfs.Mount(mnt, powerfs.Options{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWALPowerCut_Child$")
	cmd.Env = append(os.Environ(), walCutChildEnv+"="+filepath.Join(mnt, "data"))
	if planted {
		cmd.Env = append(cmd.Env, walCutPlantEnv+"=1")
	}
	var stderr tailBuffer
	cmd.Stderr = &stderr
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var (
		linesMu sync.Mutex
		lines   []string
		ready   = make(chan struct{})
		read    = make(chan struct{})
		exited  = make(chan struct{})
	)
	go func() { // the reader keeps every complete line until the writer's end
		defer close(read)
		defer r.Close()
		br := bufio.NewReader(r)
		readyOnce := sync.OnceFunc(func() { close(ready) })
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return // a partial last line is not trusted
			}
			line = strings.TrimSuffix(line, "\n")
			linesMu.Lock()
			lines = append(lines, line)
			linesMu.Unlock()
			if line == "ready" {
				readyOnce()
			}
		}
	}()
	go func() {
		defer close(exited)
		_ = cmd.Wait()
	}()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		<-read
	}

	// Where the cut lands: sometimes during the writer's recovery, mostly
	// under load, once flushes and truncations have begun. With the planted
	// bug always under load, where it has something to lose.
	var earlyExit bool
	if !planted && rng.IntN(8) == 0 {
		run.when = "during start-up or recovery"
		select {
		case <-time.After(time.Duration(rng.IntN(400)) * time.Millisecond):
		case <-exited:
			earlyExit = true
		}
	} else {
		run.when = "under load"
		select {
		case <-ready:
			select {
			case <-time.After(time.Duration(500+rng.IntN(2000)) * time.Millisecond):
			case <-exited:
				earlyExit = true
			}
		case <-exited:
			earlyExit = true
		case <-time.After(2 * time.Minute):
			stop()
			_ = fs.Cut(nil, next)
			t.Fatalf("the writer did not recover within 2 minutes; stderr:\n%s", stderr.String())
		}
	}
	run.cutAfter = time.Since(start)
	if err := fs.Cut(stop, next); err != nil {
		t.Fatal(err)
	}
	linesMu.Lock()
	defer linesMu.Unlock()
	var failure string
	for _, line := range lines {
		f := strings.Fields(line)
		switch {
		case line == "ready":
			run.ready = true
		case len(f) == 3 && (f[0] == "have" || f[0] == "ack" || f[0] == "first"):
			n, err := strconv.ParseUint(f[2], 10, 64)
			if err != nil {
				t.Fatalf("writer said %q", line)
			}
			switch f[0] {
			case "have":
				run.have[f[1]] = n
			case "ack":
				run.acks[f[1]] = max(run.acks[f[1]], n)
				run.ackCount++
			default:
				g, err := strconv.ParseUint(f[1], 10, 64)
				if err != nil {
					t.Fatalf("writer said %q", line)
				}
				run.first[replication.GroupID(g)] = n
			}
		case len(f) > 0 && f[0] == "error":
			if failure == "" {
				failure = line
			}
		default:
			// The testing package's own lines ("PASS" and such) never come:
			// the writer runs until killed.
			t.Fatalf("writer said %q", line)
		}
	}
	if earlyExit {
		return run, fmt.Errorf("the writer failed before the cut: %s\nstderr:\n%s", failure, stderr.String())
	}
	return run, nil
}

// tailBuffer keeps the last 16 KiB written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - 16<<10; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

var _ io.Writer = (*tailBuffer)(nil)

// describeTree lists the files under dir with their sizes, for a failure's
// message.
func describeTree(dir string) string {
	var sb strings.Builder
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			fmt.Fprintf(&sb, "  %s: %v\n", p, err)
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			fmt.Fprintf(&sb, "  %s/\n", rel)
			return nil
		}
		if fi, err := d.Info(); err == nil {
			fmt.Fprintf(&sb, "  %s %d\n", rel, fi.Size())
		}
		return nil
	})
	if sb.Len() == 0 {
		return "  (nothing)\n"
	}
	return sb.String()
}

// A power cut at random moments under load, then a restart on what was
// synced, several times over: every acknowledged write is in Badger after
// each, though the logs were truncated meanwhile. HOLDFAST_WALCUT_CUTS sets
// the number of cuts (default 4).
func TestWALStorage_PowerCutLosesNoAcknowledgedWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a writer process")
	}
	cuts := 4
	if s := os.Getenv(walCutCutsEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", walCutCutsEnv, s)
		}
		cuts = n
	}
	res := runWALCuts(t, cuts, false)
	if res.err != nil {
		t.Fatalf("%v\n(%d acknowledged writes checked before)", res.err, res.checked)
	}
	if res.checked < 100 {
		t.Fatalf("only %d acknowledged writes checked over %d cuts: the test does not exercise the storage", res.checked, cuts)
	}
	if res.first <= 1 {
		t.Fatalf("no restart found a truncated log over %d cuts: the test does not exercise truncation", cuts)
	}
	t.Logf("%d cuts, %d acknowledged writes checked, logs restarted from index %d at most", cuts, res.checked, res.first)
}

// The planted bug: logs truncated to start after the applied index, not after
// what Badger holds in synced tables, so that entries Badger holds only in
// memtables leave the log. The power-cut check must find a lost write.
func TestWALStorage_PowerCutCatchesATruncationPastFlushed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a writer process")
	}
	if raceEnabled {
		t.Skip("the planted-bug check runs without the race detector (it slows the writer several times over)")
	}
	res := runWALCuts(t, walCutPlantedCuts, true)
	switch {
	case res.err == nil:
		t.Fatalf("a truncation past what Badger flushed went unnoticed over %d cuts (%d acknowledged writes checked)", res.cuts, res.checked)
	case !errors.Is(res.err, errLostWrite):
		t.Fatalf("after %d cuts the run failed, but not with a lost write: %v", res.cuts, res.err)
	}
	first, _, _ := strings.Cut(res.err.Error(), "\n")
	t.Logf("caught after %d cuts: %s", res.cuts, first)
}
