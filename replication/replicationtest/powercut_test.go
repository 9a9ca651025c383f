package replicationtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/internal/powercut"
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

type walCutResult struct {
	powercut.Result
	first uint64 // the highest first index a restarted log had
}

// runWALCuts runs the writer (TestWALPowerCut_Child) under cuts power cuts
// (internal/powercut); after the last one the test process opens the state
// it left (a plain directory by then) and reads it. Besides what the harness
// checks, it keeps the highest first index a restarted log had.
func runWALCuts(t *testing.T, cuts int, planted bool) walCutResult {
	t.Helper()
	var res walCutResult
	o := powercut.Options{
		ChildTest:  "TestWALPowerCut_Child",
		DirEnv:     walCutChildEnv,
		KeepDirEnv: walCutDirEnv,
		Cuts:       cuts,
		// Under load, once flushes and truncations have begun.
		CutDelay: func(rng *rand.Rand) time.Duration { return time.Duration(500+rng.IntN(2000)) * time.Millisecond },
		// "first G N": group G's log started at index N.
		Line: func(f []string, run *powercut.Run) bool {
			if len(f) != 3 || f[0] != "first" {
				return false
			}
			n, err := strconv.ParseUint(f[2], 10, 64)
			if err != nil {
				return false
			}
			run.Extra["first"] = max(run.Extra["first"], n)
			return true
		},
		AfterRun: func(run *powercut.Run) { res.first = max(res.first, run.Extra["first"]) },
		Final: func(dir string) (map[string]uint64, error) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			n, err := openWALCutNode(ctx, filepath.Join(dir, "data"), planted, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				return nil, fmt.Errorf("start: %w", err)
			}
			defer n.close()
			for _, f := range n.first {
				res.first = max(res.first, f)
			}
			return n.state(ctx)
		},
	}
	if planted {
		o.Env = []string{walCutPlantEnv + "=1"} // every cut under load, where it has something to lose
	} else {
		o.EarlyOneIn = 8 // sometimes during start-up or recovery
	}
	res.Result = powercut.RunCuts(t, o)
	return res
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
	if res.Err != nil {
		t.Fatalf("%v\n(%d acknowledged writes checked before)", res.Err, res.Checked)
	}
	if res.Checked < 100 {
		t.Fatalf("only %d acknowledged writes checked over %d cuts: the test does not exercise the storage", res.Checked, cuts)
	}
	if res.first <= 1 {
		t.Fatalf("no restart found a truncated log over %d cuts: the test does not exercise truncation", cuts)
	}
	t.Logf("%d cuts, %d acknowledged writes checked, logs restarted from index %d at most", cuts, res.Checked, res.first)
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
	case res.Err == nil:
		t.Fatalf("a truncation past what Badger flushed went unnoticed over %d cuts (%d acknowledged writes checked)", res.Cuts, res.Checked)
	case !errors.Is(res.Err, powercut.ErrLostWrite):
		t.Fatalf("after %d cuts the run failed, but not with a lost write: %v", res.Cuts, res.Err)
	}
	first, _, _ := strings.Cut(res.Err.Error(), "\n")
	t.Logf("caught after %d cuts: %s", res.Cuts, first)
}
