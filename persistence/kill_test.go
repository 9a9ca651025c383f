package persistence

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/holdfast/holdfast/internal/leakcheck"
)

// TestMain lets the test binary act as a writer process that a test kills.
func TestMain(m *testing.M) {
	if dir := os.Getenv("HOLDFAST_PERSISTENCE_WRITER"); dir != "" {
		writerProcess(dir)
		return
	}
	if dir := os.Getenv("HOLDFAST_PERSISTENCE_BIG_WRITER"); dir != "" {
		bigWriterProcess(dir)
		return
	}
	// The tests leave no goroutine behind: the pipeline's and the log's
	// Close wait for theirs.
	leakcheck.Main(m)
}

// writerProcess writes key i = value i, one write at a time from 8 goroutines,
// printing "ack i" once each write is acknowledged, until it is killed.
func writerProcess(dir string) {
	db, err := Open(Config{Dir: dir, SegmentSize: 256 << 10})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	out := make(chan int, 1024)
	for g := 0; g < 8; g++ {
		go func(g int) {
			for i := g; ; i += 8 {
				w := &Write{Sets: []KV{{Key: []byte(fmt.Sprintf("key-%07d", i)), Value: []byte(strings.Repeat(strconv.Itoa(i), 20))}}}
				if err := p.Submit(w).Wait(context.Background()); err != nil {
					fmt.Println("error", err)
					os.Exit(1)
				}
				out <- i
			}
		}(g)
	}
	bw := bufio.NewWriter(os.Stdout)
	for i := range out {
		fmt.Fprintf(bw, "ack %d\n", i)
		if len(out) == 0 {
			bw.Flush()
		}
	}
}

// TestDB_KilledWriterLosesNoAcknowledgedWrite kills a writer process with
// SIGKILL and checks that the write-ahead log alone brings back every
// acknowledged write: Badger's memtables keep no log of their own (HOLDFAST
// PATCH 5, NoMemTableLog), so the kill takes whatever only they held, as a
// power loss could take their never-synced .mem files before.
func TestDB_KilledWriterLosesNoAcknowledgedWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a writer process")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HOLDFAST_PERSISTENCE_WRITER="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked []int
	sc := bufio.NewScanner(stdout)
	deadline := time.Now().Add(60 * time.Second)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "error") {
			t.Fatal(line)
		}
		i, _ := strconv.Atoi(strings.TrimPrefix(line, "ack "))
		acked = append(acked, i)
		if len(acked) >= 3000 || time.Now().After(deadline) {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if len(acked) < 100 {
		t.Fatalf("only %d writes acknowledged before the kill", len(acked))
	}
	mems, _ := filepath.Glob(filepath.Join(dir, "badger", "*.mem"))
	segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	if len(mems) != 0 || len(segs) < 2 {
		t.Fatalf("%d memtable files (want none), %d log segments (want 2 or more): the test does not exercise the log", len(mems), len(segs))
	}
	keys := make([][]byte, len(acked))
	for j, i := range acked {
		keys[j] = []byte(fmt.Sprintf("key-%07d", i))
	}
	if held := badgerAloneHolds(t, filepath.Join(dir, "badger"), keys); held == len(acked) {
		t.Fatalf("Badger alone holds all %d acknowledged writes after the kill: the test does not exercise the log", held)
	}
	db, err := Open(Config{Dir: dir, SegmentSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	for _, i := range acked {
		v, found, err := db.Get(ctx, []byte(fmt.Sprintf("key-%07d", i)))
		if err != nil || !found || string(v) != strings.Repeat(strconv.Itoa(i), 20) {
			t.Fatalf("acknowledged write %d: found=%v value=%q err=%v", i, found, v, err)
		}
	}
	// The reopened database takes new writes after the replayed ones.
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	defer p.Close()
	tk := p.Submit(set("after", "x"))
	if err := tk.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, tk)
	if _, found, _ := db.Get(ctx, []byte("after")); !found {
		t.Fatal("write after recovery not readable")
	}
}

// badgerAloneHolds opens the Badger directory dir as it is, without the
// write-ahead log's replay, and counts the keys it holds of keys.
func badgerAloneHolds(t *testing.T, dir string, keys [][]byte) int {
	t.Helper()
	bdb, err := badger.OpenManaged(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	txn := bdb.NewTransactionAt(math.MaxUint64, false)
	defer txn.Discard()
	held := 0
	for _, k := range keys {
		if _, err := txn.Get(k); err == nil {
			held++
		}
	}
	return held
}
