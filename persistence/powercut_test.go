package persistence

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/powerfs"
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

// powerCutModel is what the parent knows of the keys' versions.
type powerCutModel struct {
	acked   map[string]uint64 // the highest acknowledged version
	written map[string]uint64 // the highest version ever submitted, at most
	pending int               // acknowledgements not yet checked
	checked int               // acknowledgements found in a recovered state
}

// check compares a recovered state with what was acknowledged and written.
func (m *powerCutModel) check(state map[string]uint64) error {
	for k, a := range m.acked {
		if state[k] < a {
			return fmt.Errorf("acknowledged write lost: key %s holds version %d, version %d was acknowledged", k, state[k], a)
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

type powerCutResult struct {
	cuts    int // cuts made
	checked int // acknowledged writes found after a cut
	err     error
}

// runPowerCuts runs the writer on a powerfs mount and cuts the power under it
// up to cuts times, each time restarting it on the state the cut left (the
// restarted writer checks that state first); after the last cut the parent
// opens that state itself and checks it. It stops at the first check that
// fails and returns it in the result; a failure of the harness fails t.
func runPowerCuts(t *testing.T, cuts int, planted bool) powerCutResult {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); errors.Is(err, os.ErrNotExist) {
		t.Skip("no /dev/fuse: the power-cut test runs the storage on a FUSE filesystem")
	}
	base := t.TempDir()
	if d := os.Getenv(powerCutDirEnv); d != "" {
		base = d // kept for a look after a failure
	}
	mnt := filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	seed := int64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)
	m := &powerCutModel{acked: map[string]uint64{}, written: map[string]uint64{}}
	res := powerCutResult{}
	recovered := ""
	for cut := 1; cut <= cuts; cut++ {
		next := filepath.Join(base, fmt.Sprintf("cut-%d", cut))
		run, err := powerCutRun(t, mnt, recovered, next, planted, rng)
		res.cuts = cut
		if err == nil && run.ready {
			err = m.check(run.have)
		}
		if err != nil {
			res.err = fmt.Errorf("start %d (after cut %d): %w\nthe tree it started on:\n%s", cut, cut-1, err, run.tree)
			res.checked = m.checked
			return res
		}
		if recovered != "" {
			_ = os.RemoveAll(recovered) // checked, and loaded into the mount's memory
		}
		recovered = next
		if run.ready {
			// Every key may have had one write in flight, version start+1
			// or the last acknowledged one plus one.
			for k, n := range run.have {
				m.written[k] = max(m.written[k], n+1)
			}
		}
		for k, n := range run.acks {
			m.acked[k] = max(m.acked[k], n)
			m.written[k] = max(m.written[k], n+1)
		}
		m.pending += run.ackCount
		t.Logf("cut %d: %v after start, %d writes acknowledged (%s)", cut, run.cutAfter.Round(time.Millisecond), run.ackCount, run.when)
	}
	tree := describeTree(recovered)
	db, err := Open(powerCutConfig(filepath.Join(recovered, "data")))
	if err != nil {
		res.err = fmt.Errorf("open after cut %d: %w\nrecovered tree:\n%s", cuts, err, tree)
		return res
	}
	defer db.Close()
	state, err := powerCutState(db)
	if err == nil {
		err = m.check(state)
	}
	if err != nil {
		res.err = fmt.Errorf("after cut %d: %w\nrecovered tree:\n%s", cuts, err, tree)
	}
	res.checked = m.checked
	return res
}

// powerCutRunResult is what one writer process said before its cut.
type powerCutRunResult struct {
	ready    bool
	have     map[string]uint64 // the versions it found at start
	acks     map[string]uint64 // the highest version acknowledged per key
	ackCount int
	cutAfter time.Duration
	when     string // when the cut came
	tree     string // the state it started from
}

// powerCutRun mounts powerfs at mnt over the state in seed (none if empty),
// runs the writer on it, cuts the power at a random moment, and leaves the
// durable state in next. A writer that stops before the cut, or cannot
// recover, is an error returned; the harness failing fails t.
func powerCutRun(t *testing.T, mnt, seed, next string, planted bool, rng *rand.Rand) (powerCutRunResult, error) {
	t.Helper()
	run := powerCutRunResult{have: map[string]uint64{}, acks: map[string]uint64{}}
	if seed != "" {
		run.tree = describeTree(seed)
	}
	fs, err := powerfs.Mount(mnt, powerfs.Options{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPowerCut_Child$")
	cmd.Env = append(os.Environ(), powerCutChildEnv+"="+filepath.Join(mnt, "data"))
	if planted {
		cmd.Env = append(cmd.Env, powerCutPlantEnv+"=1")
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
	// The reader keeps every complete line until the writer's end.
	var (
		linesMu sync.Mutex
		lines   []string
		ready   = make(chan struct{})
		read    = make(chan struct{})
		exited  = make(chan struct{})
	)
	go func() {
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
	// under load, where flushes, releases and GCs are frequent.
	var earlyExit bool
	// With the planted bug every cut lands after the first release (at least
	// a second into the load), where the bug has something to lose.
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
			case <-time.After(cutDelay(planted, rng)):
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
		case len(f) == 3 && (f[0] == "have" || f[0] == "ack"):
			n, err := strconv.ParseUint(f[2], 10, 64)
			if err != nil {
				t.Fatalf("writer said %q", line)
			}
			if f[0] == "have" {
				run.have[f[1]] = n
			} else {
				run.acks[f[1]] = max(run.acks[f[1]], n)
				run.ackCount++
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
	if res.err != nil {
		t.Fatalf("%v\n(%d acknowledged writes checked before)", res.err, res.checked)
	}
	if res.checked < 100 {
		t.Fatalf("only %d acknowledged writes checked over %d cuts: the test does not exercise the storage", res.checked, cuts)
	}
	t.Logf("%d cuts, %d acknowledged writes checked", cuts, res.checked)
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
	if res.err == nil {
		t.Fatalf("a release of unflushed records went unnoticed over %d cuts (%d acknowledged writes checked)", res.cuts, res.checked)
	}
	t.Logf("caught: %v", res.err)
}
