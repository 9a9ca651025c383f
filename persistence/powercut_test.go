package persistence

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/powercut"
)

// The power-cut test. The fault it models is a power loss: every write that
// was not fsynced, and every directory entry whose directory was not fsynced,
// is gone (internal/powerfs keeps them in memory and drops them at the cut).
// A writer process runs the storage on a powerfs mount under load, with
// memtable flushes, log segment releases and value-log GCs made frequent
// (powerCutConfig); the test cuts the power at a random moment, kills the writer,
// and restarts it on what was synced; every acknowledged write must be there.
// Its planted bug: a log release that gives up records Badger holds only in
// its unsynced memtables (testReleaseUnflushed) must be caught.

const (
	powerCutChildEnv = "HOLDFAST_POWERCUT_CHILD"   // the data directory of the writer process
	powerCutPlantEnv = "HOLDFAST_POWERCUT_PLANTED" // "1": the writer plants testReleaseUnflushed
	powerCutCutsEnv  = "HOLDFAST_POWERCUT_CUTS"    // cuts per run of TestDB_PowerCutLosesNoAcknowledgedWrite
	powerCutDirEnv   = "HOLDFAST_POWERCUT_DIR"     // an empty directory to work in and keep, instead of a temporary one

	powerCutKeys       = 2048 // counter keys, values of counterValueSize in Badger's tree; many, so that a key's last write is often in a segment the log released
	counterValueSize   = 2000
	powerCutWriters    = 4  // goroutines writing the counter keys
	powerCutBigKeys    = 16 // keys of 1 MiB values, in Badger's value log
	powerCutBigWriters = 2  // goroutines writing them (and the junk keys)
	// powerCutPlantedCuts is the cuts within which the planted bug must be
	// caught. The run stops at the first catch: 8 of 8 runs here caught it in
	// 1-3 cuts, but one CI run (2026-12-04) went 12 cuts without a catch, so
	// the search goes on longer before it calls the bug unnoticed.
	powerCutPlantedCuts = 30

	bigWritePause = 100 * time.Millisecond
	flushEvery    = 200 * time.Millisecond
)

// powerCutConfig makes flushes, releases and value-log GCs frequent. The
// memtable is as small as Badger allows with values of 1 MiB in the value
// log (a write request may take 15% of it).
//
// The writer pauses bigWritePause after each big write, and has the memtables
// flushed every flushEvery: a value-log file then stays current, unsynced by
// Badger, while flushed tables point into it and the log releases the records
// of the values in it. That window lost values until Badger's flush synced
// the value log first (third_party/badger, HOLDFAST PATCH 3; this test found it).
//
// With the planted bug the memtables are 64 MiB, flushed every few seconds:
// the log then releases, every second, records that are only in them.
func powerCutConfig(dir string) Config {
	cfg := Config{Dir: dir, MemTableSize: 8 << 20, SegmentSize: 1 << 20, ValueLogFileSize: 32 << 20}
	if testReleaseUnflushed {
		cfg.MemTableSize = 64 << 20
	}
	return cfg
}

func counterKey(i int) string { return fmt.Sprintf("pc-%04d", i) }
func bigKey(i int) string     { return fmt.Sprintf("pcbig-%d", i) }
func junkKey(g int) string    { return fmt.Sprintf("pcjunk-%d", g) }

// counterValue is version n of key: "key=n|" and padding, so that a value
// read back shows its key, its version and whether it is whole.
func counterValue(key string, n uint64) []byte {
	v := fmt.Appendf(nil, "%s=%d|", key, n)
	return append(v, bytes.Repeat([]byte{'.'}, counterValueSize-len(v))...)
}

func parseCounterValue(key string, v []byte) (uint64, error) {
	head, pad, ok := bytes.Cut(v, []byte("|"))
	k, n, ok2 := strings.Cut(string(head), "=")
	version, err := strconv.ParseUint(n, 10, 64)
	if !ok || !ok2 || k != key || err != nil || len(v) != counterValueSize || len(bytes.Trim(pad, ".")) != 0 {
		return 0, fmt.Errorf("key %s holds a value that was never written: %.60q", key, v)
	}
	return version, nil
}

func parseBigValue(key string, v []byte) (uint64, error) {
	if len(v) < 8 {
		return 0, fmt.Errorf("key %s holds a value of %d bytes, never written", key, len(v))
	}
	n := binary.BigEndian.Uint64(v)
	if !bytes.Equal(v, bigVersion(n)) {
		return 0, fmt.Errorf("key %s holds a torn or foreign value (%d bytes, version %d in its head)", key, len(v), n)
	}
	return n, nil
}

// powerCutState reads the version of every counter and big key (0 when
// absent), and checks that the junk keys hold whole values or nothing.
func powerCutState(db *DB) (map[string]uint64, error) {
	ctx := context.Background()
	state := map[string]uint64{}
	read := func(key string, parse func(string, []byte) (uint64, error)) error {
		v, found, err := db.Get(ctx, []byte(key))
		if err != nil {
			return fmt.Errorf("read %s: %w", key, err)
		}
		if !found {
			state[key] = 0
			return nil
		}
		n, err := parse(key, v)
		state[key] = n
		return err
	}
	for i := range powerCutKeys {
		if err := read(counterKey(i), parseCounterValue); err != nil {
			return nil, err
		}
	}
	for i := range powerCutBigKeys {
		if err := read(bigKey(i), parseBigValue); err != nil {
			return nil, err
		}
	}
	for g := range powerCutBigWriters {
		if err := read(junkKey(g), parseBigValue); err != nil {
			return nil, err
		}
		delete(state, junkKey(g))
	}
	return state, nil
}

// TestPowerCut_Child is the writer process of the power-cut tests; it runs
// only when one of them starts it.
func TestPowerCut_Child(t *testing.T) {
	dir := os.Getenv(powerCutChildEnv)
	if dir == "" {
		t.Skip("the writer process of TestDB_PowerCutLosesNoAcknowledgedWrite; runs only when started by it")
	}
	powerCutChild(dir)
}

// powerCutChild opens the database in dir, prints "have KEY N" for the
// version of every key it finds and "ready", then writes until it is killed:
// each key has at most one write in flight, version after version, and each
// acknowledged write is printed as "ack KEY N" once acknowledged. Any error
// is printed as "error ..." and ends the process.
func powerCutChild(dir string) {
	testReleaseUnflushed = os.Getenv(powerCutPlantEnv) == "1"
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
	db, err := Open(powerCutConfig(dir))
	if err != nil {
		fail("open", err)
	}
	state, err := powerCutState(db)
	if err != nil {
		fail("read the recovered state", err)
	}
	for k, n := range state {
		printf("have %s %d\n", k, n)
	}
	printf("ready\n")
	p := NewPipeline(db, PipelineConfig{ValueLogGCEvery: 50 * time.Millisecond})
	p.Start()
	ctx := context.Background()
	submit := func(w *Write) {
		if err := p.Submit(w).Wait(ctx); err != nil {
			fail("write", err)
		}
	}
	// Each key has one writing goroutine, which counts its versions in its
	// own map.
	versions := func() map[string]uint64 {
		v := make(map[string]uint64, len(state))
		for k, n := range state {
			v[k] = n
		}
		return v
	}
	for g := range powerCutWriters {
		ver := versions()
		go func() {
			for {
				for i := g; i < powerCutKeys; i += powerCutWriters {
					k := counterKey(i)
					ver[k]++
					n := ver[k]
					submit(&Write{Sets: []KV{{Key: []byte(k), Value: counterValue(k, n)}}})
					printf("ack %s %d\n", k, n)
				}
			}
		}()
	}
	for g := range powerCutBigWriters {
		ver := versions()
		go func() {
			for round := 0; ; round++ {
				for i := g; i < powerCutBigKeys; i += powerCutBigWriters {
					k := bigKey(i)
					ver[k]++
					n := ver[k]
					w := &Write{Sets: []KV{{Key: []byte(k), Value: bigVersion(n)}}}
					// Garbage for the value-log GC: a junk value set, then deleted.
					if round%2 == 0 {
						w.Sets = append(w.Sets, KV{Key: []byte(junkKey(g)), Value: bigVersion(n)})
					} else {
						w.Deletes = [][]byte{[]byte(junkKey(g))}
					}
					submit(w)
					printf("ack %s %d\n", k, n)
					// Slow enough that a value-log file stays the current,
					// unsynced one across several releases of the log.
					time.Sleep(bigWritePause)
				}
			}
		}()
	}
	// Memtable flushes, and so log releases, several times a second: through
	// the applier, as the GC loop asks for them. Not with the planted bug: it
	// releases what is not flushed yet, which frequent flushes would make rare.
	for {
		time.Sleep(flushEvery)
		if testReleaseUnflushed {
			continue
		}
		reply := make(chan error, 1)
		p.flushes <- reply
		if err := <-reply; err != nil {
			fail("flush", err)
		}
	}
}

// cutDelay is how long after the writer is ready a cut under load lands.
func cutDelay(planted bool, rng *rand.Rand) time.Duration {
	if planted {
		return time.Duration(1300+rng.IntN(1200)) * time.Millisecond
	}
	return time.Duration(100+rng.IntN(2400)) * time.Millisecond
}

// runPowerCuts runs the writer (TestPowerCut_Child) under cuts power cuts
// (internal/powercut), and after the last one opens the state it left.
func runPowerCuts(t *testing.T, cuts int, planted bool) powercut.Result {
	t.Helper()
	o := powercut.Options{
		ChildTest:  "TestPowerCut_Child",
		DirEnv:     powerCutChildEnv,
		KeepDirEnv: powerCutDirEnv,
		Cuts:       cuts,
		CutDelay:   func(rng *rand.Rand) time.Duration { return cutDelay(planted, rng) },
		Final: func(dir string) (map[string]uint64, error) {
			db, err := Open(powerCutConfig(filepath.Join(dir, "data")))
			if err != nil {
				return nil, fmt.Errorf("open: %w", err)
			}
			defer db.Close()
			return powerCutState(db)
		},
	}
	if planted {
		// Every cut lands after the first release (at least a second into
		// the load), where the bug has something to lose.
		o.Env = []string{powerCutPlantEnv + "=1"}
	} else {
		o.EarlyOneIn = 8 // sometimes during start-up or recovery
	}
	return powercut.RunCuts(t, o)
}

// A power cut at random moments under load, then a restart on what was
// synced, several times over: every acknowledged write is there after each.
// HOLDFAST_POWERCUT_CUTS sets the number of cuts (default 4).
func TestDB_PowerCutLosesNoAcknowledgedWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a writer process")
	}
	cuts := 4
	if s := os.Getenv(powerCutCutsEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", powerCutCutsEnv, s)
		}
		cuts = n
	}
	res := runPowerCuts(t, cuts, false)
	if res.Err != nil {
		t.Fatalf("%v\n(%d acknowledged writes checked before)", res.Err, res.Checked)
	}
	if res.Checked < 100 {
		t.Fatalf("only %d acknowledged writes checked over %d cuts: the test does not exercise the storage", res.Checked, cuts)
	}
	t.Logf("%d cuts, %d acknowledged writes checked", cuts, res.Checked)
}

// The planted bug: log segments released as soon as Badger applied their
// records, not once it flushed them to synced tables. The power-cut check must
// find a lost write within a few cuts. (Planting a release that skips its own
// sync of the value log, as first written, is no longer caught: Badger's flush
// now syncs the value log before it names a table (third_party/badger, HOLDFAST
// PATCH 3), which made that sync a second line of defence.)
func TestDB_PowerCutCatchesAReleaseOfUnflushedRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a writer process")
	}
	if raceEnabled {
		// The race detector slows the writer several times over: far fewer
		// writes, fewer releases of unflushed records per cut, and once no
		// catch in 12 cuts. The check of the check runs in the plain test run.
		t.Skip("the planted-bug check runs without the race detector")
	}
	res := runPowerCuts(t, powerCutPlantedCuts, true)
	if res.Err == nil {
		t.Fatalf("a release of unflushed records went unnoticed over %d cuts (%d acknowledged writes checked)", res.Cuts, res.Checked)
	}
	t.Logf("caught: %v", res.Err)
}
