package persistence

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// bigValue is a value Badger keeps in its value log (1 MiB or more; and at
// most a value-log file, the tests' 1 MiB), made of one byte repeated so that
// a wrong copy shows.
func bigValue(b byte) []byte {
	return bytes.Repeat([]byte{b}, 1<<20)
}

// vlogFiles lists Badger's value-log files in dir.
func vlogFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "badger", "*.vlog"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(m)
	return m
}

func put(t *testing.T, p *Pipeline, key string, value []byte) {
	t.Helper()
	w := &Write{Sets: []KV{{Key: []byte(key), Value: value}}}
	if err := p.Submit(w).Wait(context.Background()); err != nil {
		t.Fatalf("set %s: %v", key, err)
	}
}

func del(t *testing.T, p *Pipeline, key string) {
	t.Helper()
	if err := p.Submit(&Write{Deletes: [][]byte{[]byte(key)}}).Wait(context.Background()); err != nil {
		t.Fatalf("delete %s: %v", key, err)
	}
}

// syncRecorder replaces db's fsync with one that records each path and then
// syncs it.
type syncRecorder struct {
	mu    sync.Mutex
	paths []string
	// before, if set, is called with each path before it is synced.
	before func(path string)
}

func recordSyncs(db *DB) *syncRecorder {
	r := &syncRecorder{}
	db.vlog.fsync = func(path string) error {
		r.mu.Lock()
		r.paths = append(r.paths, path)
		before := r.before
		r.mu.Unlock()
		if before != nil {
			before(path)
		}
		return syncPath(path)
	}
	return r
}

func (r *syncRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.paths
	r.paths = nil
	return p
}

// Badger's own Sync covers only the value-log file it writes now. Before the
// write-ahead log gives up records, every file they may point into must be
// synced, the ones Badger filled and left included, and the directory that
// names them.
func TestValueLog_SyncCoversEveryFileBadgerLeft(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Config{Dir: dir, ValueLogFileSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	rec := recordSyncs(db)
	for i := range 3 {
		put(t, p, fmt.Sprintf("big-%d", i), bigValue(byte('a'+i)))
	}
	p.WaitApplied(context.Background())
	files := vlogFiles(t, dir)
	if len(files) < 3 {
		t.Fatalf("value-log files after three 1 MiB values in 1 MiB files: %v", files)
	}
	if err := db.vlog.syncValueLog(); err != nil {
		t.Fatal(err)
	}
	synced := rec.take()
	for _, f := range files {
		if !slices.Contains(synced, f) {
			t.Errorf("%s was not synced (synced: %v)", filepath.Base(f), synced)
		}
	}
	if !slices.Contains(synced, filepath.Join(dir, "badger")) {
		t.Errorf("Badger's directory was not synced (synced: %v)", synced)
	}

	// The next sync takes the files Badger wrote since: the newest of the
	// last round (still written to), and every newer one; not the older ones.
	newestBefore := files[len(files)-1]
	for i := 3; i < 5; i++ {
		put(t, p, fmt.Sprintf("big-%d", i), bigValue(byte('a'+i)))
	}
	p.WaitApplied(context.Background())
	if err := db.vlog.syncValueLog(); err != nil {
		t.Fatal(err)
	}
	synced = rec.take()
	for _, f := range vlogFiles(t, dir) {
		if want := f >= newestBefore; slices.Contains(synced, f) != want {
			t.Errorf("%s synced = %v, want %v (synced: %v)", filepath.Base(f), !want, want, synced)
		}
	}
}

// The pipeline releases log segments only after syncing the value log.
func TestPipeline_ReleaseSyncsTheValueLog(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Config{Dir: dir, MemTableSize: 8 << 20, SegmentSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	rec := recordSyncs(db)
	value := bytes.Repeat([]byte("v"), 4<<10)
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		// 4 KiB values fill 8 MiB memtables, which Badger flushes to
		// tables: then the segments before them can go.
		put(t, p, fmt.Sprintf("key-%06d", i), value)
		if slices.Contains(rec.take(), filepath.Join(dir, "badger")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no release synced the value log after %d writes (%d log segments)", i, db.wal.segments())
		}
	}
}

// A value-log GC deletes the files it rewrote only once what it wrote (the
// live values' copies, and the pointers to them) is durable: until then, those
// files are the only synced copies. The pointers become durable through a
// flush of Badger's memtables, which syncs the copies before it names the
// tables that point at them; the GC never syncs the memtable logs, which would
// make pointers durable apart from their values (see valuelog.go). It gives
// the space of deleted and overwritten values back, and the live values read
// the same, before and after a restart.
func TestValueLog_GCKeepsRewrittenFilesUntilItsCopiesAreSynced(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, ValueLogFileSize: 4 << 20}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	live := map[string][]byte{}
	for i := range 12 {
		key := fmt.Sprintf("v%02d", i)
		put(t, p, key, bigValue(byte('a'+i)))
		if i%4 == 3 {
			live[key] = bigValue(byte('a' + i))
		}
	}
	for i := range 12 {
		if i%4 != 3 {
			del(t, p, fmt.Sprintf("v%02d", i))
		}
	}
	p.WaitApplied(context.Background()) // the values are in Badger's files
	before := len(vlogFiles(t, dir))

	rec := recordSyncs(db)
	var memSyncs []string // memtable logs the GC synced
	rec.before = func(path string) {
		if strings.HasSuffix(path, ".mem") {
			memSyncs = append(memSyncs, filepath.Base(path))
		}
	}
	var present []string // the value-log files when a GC starts
	var gone []string    // those of them missing when the GC flushes
	gcFlushes := 0
	flush := func() error {
		gcFlushes++
		for _, f := range present {
			if _, err := os.Stat(f); err != nil {
				gone = append(gone, filepath.Base(f))
			}
		}
		return p.flushMemtables()
	}
	// Badger finds garbage in compactions of its tables: flush the memtables
	// (as the GC loop has the applier do) until a compaction found some.
	deadline := time.Now().Add(30 * time.Second)
	for round := 0; ; round++ {
		put(t, p, fmt.Sprintf("filler-%d", round), []byte("x"))
		if err := p.flushMemtables(); err != nil {
			t.Fatalf("flush: %v", err)
		}
		present = vlogFiles(t, dir)
		n, err := db.collectValueLog(maxGCFiles, flush)
		if err != nil {
			t.Fatal(err)
		}
		if len(gone) > 0 {
			t.Fatalf("the GC deleted %v before it flushed the pointers to its copies", gone)
		}
		if len(memSyncs) > 0 {
			t.Fatalf("the GC synced memtable logs %v: pointers durable apart from their values", memSyncs)
		}
		if n > 0 {
			if gcFlushes == 0 {
				t.Fatal("the GC rewrote files without flushing the memtables that point at the copies")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no value-log GC after %d flushes", round+1)
		}
		time.Sleep(20 * time.Millisecond)
	}
	after := len(vlogFiles(t, dir))
	if after >= before {
		t.Errorf("value-log files: %d before the GC, %d after", before, after)
	}
	check := func(db *DB) {
		t.Helper()
		for i := range 12 {
			key := fmt.Sprintf("v%02d", i)
			v, found, err := db.Get(context.Background(), []byte(key))
			if err != nil {
				t.Fatal(err)
			}
			if want, ok := live[key]; found != ok || !bytes.Equal(v, want) {
				t.Errorf("%s: found=%v, %d bytes; want found=%v, %d bytes", key, found, len(v), ok, len(want))
			}
		}
	}
	p.WaitApplied(context.Background()) // Get reads Badger alone
	p.WaitApplied(context.Background()) // Get reads Badger alone
	check(db)
	check(reopen(t, p, db, cfg))
}

// Overwriting 1 MiB values does not grow the disk without bound: tree entries
// for them are small, so Badger's memtables would not fill and no compaction
// would find the garbage, but the GC loop has the applier flush them.
func TestValueLog_OverwrittenBigValuesGiveTheirSpaceBack(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 60 MiB")
	}
	dir := t.TempDir()
	cfg := Config{Dir: dir, ValueLogFileSize: 1 << 20}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: 20 * time.Millisecond})
	var last [2][]byte
	for i := range 60 {
		last[i%2] = bigValue(byte('a' + i%26))
		put(t, p, fmt.Sprintf("k%d", i%2), last[i%2])
	}
	const most = 12                     // two live files, the current one, and garbage not yet found
	p.WaitApplied(context.Background()) // every value is in Badger's files: the count below starts high
	deadline := time.Now().Add(30 * time.Second)
	for len(vlogFiles(t, dir)) > most {
		if time.Now().After(deadline) {
			t.Fatalf("%d value-log files after 60 overwrites of two 1 MiB values; want at most %d", len(vlogFiles(t, dir)), most)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.WaitApplied(context.Background()) // Get reads Badger alone
	p.Close()                           // and the GC stops: what it counted stays what is gone
	// Badger numbers its value-log files from 1, and only the GC removes them.
	files, err := numberedFiles(filepath.Join(dir, "badger"), ".vlog")
	if err != nil {
		t.Fatal(err)
	}
	if n, gone := p.Stats().ValueLogReclaimed, files[len(files)-1].id-uint64(len(files)); n != gone {
		t.Errorf("the pipeline counts %d reclaimed value-log files; %d went", n, gone)
	}
	if b, err := db.ValueLogBytes(); err != nil || b > most*(2<<20) {
		t.Errorf("the value log takes %d bytes (err %v) in %d files", b, err, len(vlogFiles(t, dir)))
	}
	check := func(db *DB) {
		t.Helper()
		for k, want := range last {
			v, _, err := db.Get(context.Background(), fmt.Appendf(nil, "k%d", k))
			if err != nil || !bytes.Equal(v, want) {
				var got byte
				if len(v) > 0 {
					got = v[0]
				}
				t.Errorf("k%d: %d bytes of %q, err %v; want %d bytes of %q", k, len(v), got, err, len(want), want[0])
			}
		}
	}
	check(db)
	check(reopen(t, p, db, cfg))
}

// bigWriterConfig is the database of bigWriterProcess: 4 MiB value-log files.
func bigWriterConfig(dir string) Config {
	return Config{Dir: dir, ValueLogFileSize: 4 << 20, SegmentSize: 4 << 20}
}

// bigWriterKeys is how many keys bigWriterProcess overwrites.
const bigWriterKeys = 4

// bigVersion is version n of a 1 MiB value: n in its first 8 bytes, then byte
// n repeated, so that a value read back shows which write it is and whether it
// is whole.
func bigVersion(n uint64) []byte {
	v := bytes.Repeat([]byte{byte(n)}, 1<<20)
	binary.BigEndian.PutUint64(v, n)
	return v
}

// bigWriterProcess overwrites bigWriterKeys keys with 1 MiB values, one write
// at a time from two goroutines, while the value-log GC runs every 10 ms,
// printing "ack key n" once version n of key is acknowledged, until it is
// killed. Versions start at $HOLDFAST_PERSISTENCE_BIG_FROM; version n goes to
// key n % bigWriterKeys.
func bigWriterProcess(dir string) {
	db, err := Open(bigWriterConfig(dir))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	p := NewPipeline(db, PipelineConfig{ValueLogGCEvery: 10 * time.Millisecond})
	p.Start()
	from, _ := strconv.ParseUint(os.Getenv("HOLDFAST_PERSISTENCE_BIG_FROM"), 10, 64)
	var mu sync.Mutex
	for g := range uint64(2) {
		go func() {
			for n := from + g; ; n += 2 {
				key := n % bigWriterKeys
				w := &Write{Sets: []KV{{Key: fmt.Appendf(nil, "big-%d", key), Value: bigVersion(n)}}}
				if err := p.Submit(w).Wait(context.Background()); err != nil {
					fmt.Println("error", err)
					os.Exit(1)
				}
				mu.Lock()
				fmt.Printf("ack %d %d\n", key, n)
				mu.Unlock()
			}
		}()
	}
	select {}
}

// A writer overwriting 1 MiB values while the value-log GC runs, killed with
// SIGKILL at a random moment, three times over the same directory: after each
// restart every key holds its last acknowledged version or a later one, whole,
// and the value log has not grown with the overwritten versions.
func TestValueLog_KilledDuringGCLosesNoAcknowledgedValue(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a writer process")
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	var last [bigWriterKeys]uint64 // the last acknowledged version of each key, plus one
	total := 0
	for run := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		// Versions go on from the last run's.
		from := uint64(0)
		for _, l := range last {
			from = max(from, l)
		}
		cmd.Env = append(os.Environ(), "HOLDFAST_PERSISTENCE_BIG_WRITER="+dir, fmt.Sprintf("HOLDFAST_PERSISTENCE_BIG_FROM=%d", from))
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		killAt := 40 + rng.IntN(160) // acknowledgements before the kill
		acks := 0
		sc := bufio.NewScanner(stdout)
		deadline := time.Now().Add(60 * time.Second)
		for acks < killAt && time.Now().Before(deadline) && sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "error") {
				t.Fatal(line)
			}
			var key, n uint64
			if _, err := fmt.Sscanf(line, "ack %d %d", &key, &n); err != nil {
				t.Fatalf("writer said %q", line)
			}
			last[key] = max(last[key], n+1)
			acks++
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		if acks < 20 {
			t.Fatalf("run %d: only %d writes acknowledged before the kill", run, acks)
		}
		total += acks
		t.Logf("run %d: killed after %d acknowledgements", run, acks)

		db, err := Open(bigWriterConfig(dir))
		if err != nil {
			t.Fatalf("run %d: reopen: %v", run, err)
		}
		for key := range uint64(bigWriterKeys) {
			v, found, err := db.Get(context.Background(), fmt.Appendf(nil, "big-%d", key))
			if err != nil || !found || len(v) != 1<<20 {
				t.Fatalf("run %d: big-%d: found=%v, %d bytes, err %v", run, key, found, len(v), err)
			}
			n := binary.BigEndian.Uint64(v)
			if !bytes.Equal(v, bigVersion(n)) {
				t.Fatalf("run %d: big-%d holds version %d, not whole", run, key, n)
			}
			if n+1 < last[key] || n%bigWriterKeys != key {
				t.Fatalf("run %d: big-%d holds version %d; the last acknowledged is %d", run, key, n, last[key]-1)
			}
			last[key] = n + 1
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The overwritten versions (over 1 MiB each) do not all stay on disk.
	if files := len(vlogFiles(t, dir)); files*4 >= total {
		t.Errorf("%d value-log files of 4 MiB after %d overwrites of 1 MiB", files, total)
	}
}

// Badger truncates a value-log or memtable-log file to nothing before it
// removes it, so a crash can leave an empty one, which Badger refuses to open.
// Open removes it, and keeps what the database holds.
func TestDB_OpenRemovesEmptyLogFilesACrashLeft(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := startPipeline(t, db, PipelineConfig{ValueLogGCEvery: -1})
	put(t, p, "big", bigValue('b'))
	put(t, p, "small", []byte("s"))
	db = reopen(t, p, db, cfg)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	empty := []string{filepath.Join(dir, "badger", "000099.vlog"), filepath.Join(dir, "badger", "00099.mem")}
	for _, f := range empty {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	db, err = Open(cfg)
	if err != nil {
		t.Fatalf("open with empty log files: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	for _, f := range empty {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s is still there", filepath.Base(f))
		}
	}
	for k, want := range map[string][]byte{"big": bigValue('b'), "small": []byte("s")} {
		if v, found, err := db.Get(context.Background(), []byte(k)); err != nil || !found || !bytes.Equal(v, want) {
			t.Errorf("%s: found=%v, %d bytes, err %v", k, found, len(v), err)
		}
	}
}
