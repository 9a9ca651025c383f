package persistence

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/holdfast/holdfast/internal/pipehook"
)

// heldApplier holds the applier in BeforeApply on its first record until
// release is closed, and records the sequence numbers it was shown. entered is
// closed once the applier holds.
type heldApplier struct {
	mu      sync.Mutex
	seqs    []uint64
	entered chan struct{}
	release chan struct{}
}

func newHeldApplier() *heldApplier {
	return &heldApplier{entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *heldApplier) before(seq uint64) {
	h.mu.Lock()
	first := len(h.seqs) == 0
	h.seqs = append(h.seqs, seq)
	h.mu.Unlock()
	if first {
		close(h.entered)
		<-h.release
	}
}

func (h *heldApplier) seen() []uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seqs)
}

// versions returns the versions Badger holds of key, newest first.
func versions(t *testing.T, db *DB, key string) []uint64 {
	t.Helper()
	var vs []uint64
	txn := db.bdb.NewTransactionAt(math.MaxUint64, false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{AllVersions: true, Prefix: []byte(key)})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		if string(it.Item().Key()) == key {
			vs = append(vs, it.Item().Version())
		}
	}
	return vs
}

// submitHeld submits writes one record each (each waits for its sync) while
// the applier holds the first one alone, so that the others queue behind it;
// then it lets the applier go and waits until every write is applied.
func submitHeld(t *testing.T, p *Pipeline, held *heldApplier, writes []*Write) []*Ticket {
	t.Helper()
	var tickets []*Ticket
	for i, w := range writes {
		tk := p.Submit(w)
		if err := tk.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, tk)
		if i == 0 {
			<-held.entered
		}
	}
	if tickets[0].Applied() {
		t.Fatal("the first record was applied while the applier was held")
	}
	close(held.release)
	for _, tk := range tickets {
		waitApplied(t, tk)
	}
	if p.Failed() != nil {
		t.Fatal(p.Failed())
	}
	return tickets
}

// TestPipeline_ApplierMergesTheRecordsWaitingForIt: records that queue up
// behind a slow applier reach Badger as one batch at the newest one's
// sequence number, so a key written by several of them gets one version, with
// the newest value; a delete and a set in later records win over earlier ones;
// every ticket is marked applied, and a reopen (which replays the log record by
// record) shows the same state.
func TestPipeline_ApplierMergesTheRecordsWaitingForIt(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir)
	held := newHeldApplier()
	p := NewPipeline(db, PipelineConfig{Hooks: &pipehook.Hooks{BeforeApply: held.before}})
	p.Start()
	ctx := context.Background()
	writes := []*Write{
		set("k", "1"),
		set("k", "2"),
		{Sets: []KV{{Key: []byte("k"), Value: []byte("3")}, {Key: []byte("d"), Value: []byte("x")}}},
		{Deletes: [][]byte{[]byte("d")}, Sets: []KV{{Key: []byte("e"), Value: []byte("gone soon")}}},
		{Deletes: [][]byte{[]byte("e")}},
		set("e", "back"),
	}
	submitHeld(t, p, held, writes)
	p.WaitApplied(context.Background())
	if got := held.seen(); len(got) != 6 || !slices.IsSorted(got) || got[5]-got[0] != 5 {
		t.Fatalf("BeforeApply saw %v, want six sequence numbers in order", got)
	}
	first, last := held.seen()[0], held.seen()[5]
	if vs := versions(t, db, "k"); !slices.Equal(vs, []uint64{last, first}) {
		t.Fatalf("versions of k: %v, want [%d %d] (the five queued records merged)", vs, last, first)
	}
	check := func(db *DB) {
		t.Helper()
		for k, want := range map[string]string{"k": "3", "d": "", "e": "back"} {
			v, found, err := db.Get(ctx, []byte(k))
			if err != nil || found != (want != "") || string(v) != want {
				t.Fatalf("%s: %q found=%v err=%v, want %q", k, v, found, err, want)
			}
		}
	}
	check(db)
	check(reopen(t, p, db, Config{Dir: dir}))
}

// TestPipeline_MergedRecordsLargerThanABadgerWriteRequest: records waiting for
// the applier that together exceed one Badger write request (Badger splits
// them into several) are still applied together at the newest one's sequence
// number, every one of them whole, before and after a restart.
func TestPipeline_MergedRecordsLargerThanABadgerWriteRequest(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Config{Dir: dir, MemTableSize: 8 << 20}) // Badger takes ~1.2 MiB per write request
	if err != nil {
		t.Fatal(err)
	}
	held := newHeldApplier()
	p := NewPipeline(db, PipelineConfig{Hooks: &pipehook.Hooks{BeforeApply: held.before}})
	p.Start()
	ctx := context.Background()
	var writes []*Write
	for r := 0; r < 8; r++ {
		w := &Write{}
		for i := 0; i < 5; i++ {
			w.Sets = append(w.Sets, KV{Key: []byte(fmt.Sprintf("r%d-%d", r, i)), Value: bytes.Repeat([]byte{byte(r)}, 100<<10)})
		}
		writes = append(writes, w)
	}
	submitHeld(t, p, held, writes)
	check := func(db *DB) {
		t.Helper()
		for r := 0; r < 8; r++ {
			for i := 0; i < 5; i++ {
				v, found, err := db.Get(ctx, []byte(fmt.Sprintf("r%d-%d", r, i)))
				if err != nil || !found || len(v) != 100<<10 || v[0] != byte(r) {
					t.Fatalf("r%d-%d: found=%v len=%d err=%v", r, i, found, len(v), err)
				}
			}
		}
	}
	check(db)
	// Record 0 was applied alone; records 1 to 7 (3.5 MiB) waited and were
	// applied together, in three of Badger's write requests.
	seqs := held.seen()
	for r := 0; r < 8; r++ {
		want := seqs[len(seqs)-1]
		if r == 0 {
			want = seqs[0]
		}
		for i := 0; i < 5; i++ {
			if vs := versions(t, db, fmt.Sprintf("r%d-%d", r, i)); !slices.Equal(vs, []uint64{want}) {
				t.Fatalf("versions of r%d-%d: %v, want [%d]", r, i, vs, want)
			}
		}
	}
	check(reopen(t, p, db, Config{Dir: dir, MemTableSize: 8 << 20}))
}

// withApplyWait sets how long the applier waits for more small records, for
// one test.
func withApplyWait(t *testing.T, d time.Duration) {
	old := applyWait
	applyWait = d
	t.Cleanup(func() { applyWait = old })
}

// TestPipeline_SmallRecordsReachBadgerTogether: a serial writer's small
// records, each acknowledged on its own sync, wait for the applier's window
// and reach Badger as one batch: one version of the key they all write.
func TestPipeline_SmallRecordsReachBadgerTogether(t *testing.T) {
	withApplyWait(t, 2*time.Second)
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's
	p := startPipeline(t, db, PipelineConfig{})
	ctx := context.Background()
	var last *Ticket
	for i := range 5 {
		last = p.Submit(set("k", fmt.Sprint(i)))
		if err := last.Wait(ctx); err != nil { // durable: acknowledged without the applier
			t.Fatal(err)
		}
	}
	if last.Applied() {
		t.Fatal("applied before the applier's window closed")
	}
	waitApplied(t, last)
	if vs := versions(t, db, "k"); len(vs) != 1 {
		t.Fatalf("versions of k: %v, want one: the five records in one batch", vs)
	}
	if v, _, err := db.Get(ctx, []byte("k")); err != nil || string(v) != "4" {
		t.Fatalf("k = %q, %v; want the newest value 4", v, err)
	}
}

// TestPipeline_WaitAppliedCutsTheApplierWindowShort: an activation waiting for
// Badger does not wait out the applier's window for more records.
func TestPipeline_WaitAppliedCutsTheApplierWindowShort(t *testing.T) {
	withApplyWait(t, 20*time.Second)
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's
	p := startPipeline(t, db, PipelineConfig{})
	tk := p.Submit(set("k", "v"))
	if err := tk.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p.WaitApplied(context.Background())
	if took := time.Since(start); took > 10*time.Second || !tk.Applied() {
		t.Fatalf("WaitApplied took %v (the window is 20s); applied=%v", took, tk.Applied())
	}
}

// TestDB_ReleasableStaysBelowABatchSplitAcrossMemtables: a record larger than
// a memtable reaches Badger in several write requests at one version, and so
// in two memtables. Once the first is flushed, Badger's tables show that
// version while part of the record is still only in the second, unflushed
// memtable: the log must keep the record (releasable stays below it).
func TestDB_ReleasableStaysBelowABatchSplitAcrossMemtables(t *testing.T) {
	db, err := Open(Config{Dir: t.TempDir(), MemTableSize: 8 << 20}) // ~1.2 MiB per write request
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's
	p, v := splitRecordAcrossMemtables(t, db, func(int) []byte { return bytes.Repeat([]byte{'v'}, 40<<10) })
	if got := db.releasable(p.batchFirst); got >= v {
		t.Fatalf("releasable = %d while version %d is partly in an unflushed memtable, want below it", got, v)
	}
}

// TestDB_ACrashAfterABatchSplitAcrossMemtablesReplaysItWhole: as above, a
// record larger than a memtable reaches Badger in two memtables at one
// version, and the first is flushed. A crash then (the data directory as it
// is on disk) leaves Badger's tables with the record's version and only part
// of its keys: Badger's memtables keep no log of their own (HOLDFAST PATCH 5,
// NoMemTableLog), so the second memtable is gone, which the test checks in
// Badger alone. The reopened database must have every key back from the
// write-ahead log: the log keeps the record (releasable, above) and replays
// it.
func TestDB_ACrashAfterABatchSplitAcrossMemtablesReplaysItWhole(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Config{Dir: dir, MemTableSize: 8 << 20}) // ~1.2 MiB per write request
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's
	value := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 40<<10) }
	splitRecordAcrossMemtables(t, db, value)
	crashed := t.TempDir()
	copyAsCrashed(t, dir, crashed)
	// Badger alone, as the crash left it: part of the record is gone.
	keys := make([][]byte, 300)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("big-%03d", i))
	}
	if held := badgerAloneHolds(t, filepath.Join(crashed, "badger"), keys); held == 0 || held == 300 {
		t.Fatalf("after the crash Badger holds %d of the record's 300 keys, want some but not all (the second memtable lost)", held)
	}
	db2, err := Open(Config{Dir: crashed, MemTableSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	missing := 0
	for i := 0; i < 300; i++ {
		got, found, err := db2.Get(context.Background(), keys[i])
		if err != nil {
			t.Fatal(err)
		}
		if !found || !bytes.Equal(got, value(i)) {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("after the crash %d of the record's 300 keys are missing or wrong", missing)
	}
}

// splitRecordAcrossMemtables starts a pipeline on db (8 MiB memtables) and
// commits one record of 300 keys of 40 KiB, value(i) for key big-<i>: 12 MiB
// in the tree (values under valueThreshold), more than a memtable, so Badger
// takes it in several write requests at one version, across two memtables.
// It returns once the first is flushed (Badger's tables show the version),
// with the pipeline and the record's version.
func splitRecordAcrossMemtables(t *testing.T, db *DB, value func(i int) []byte) (*Pipeline, uint64) {
	t.Helper()
	var seq atomic.Uint64
	p := startPipeline(t, db, PipelineConfig{Hooks: &pipehook.Hooks{BeforeApply: func(s uint64) { seq.Store(s) }}})
	w := &Write{}
	for i := 0; i < 300; i++ {
		w.Sets = append(w.Sets, KV{Key: []byte(fmt.Sprintf("big-%03d", i)), Value: value(i)})
	}
	tk := p.Submit(w)
	if err := tk.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, tk)
	v := seq.Load()
	deadline := time.Now().Add(10 * time.Second)
	for db.newestTableVersion() < v {
		if time.Now().After(deadline) {
			t.Fatalf("Badger never flushed the first memtable of version %d (tables at %d)", v, db.newestTableVersion())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p, v
}

// copyAsCrashed copies the files under src to dst, as a process crash leaves
// them (the page cache survives it; nothing in memory does).
func copyAsCrashed(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() || d.Name() == "LOCK" {
			return nil
		}
		return copyFile(path, filepath.Join(dst, rel))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDB_ReleasableStaysBelowAMergedBatchSplitAcrossMemtables: records that
// queued behind a held applier reach Badger as one batch at the newest one's
// version; when that batch is larger than a memtable it lands in two, and once
// the first is flushed Badger's tables show the batch's version while part of
// it, which may be any of its records' changes, is in the unflushed memtable.
// Nothing of the batch may be released: releasable stays below its first
// record. (Counting version-1 released every record of the batch but the
// last.)
func TestDB_ReleasableStaysBelowAMergedBatchSplitAcrossMemtables(t *testing.T) {
	// 8 MiB memtables; six records of 2 MiB merge into one batch of 12 MiB
	// (applyMergeBytes raised for it), which spans two memtables, the second
	// never full, so never flushed.
	defer func(b int) { applyMergeBytes = b }(applyMergeBytes)
	applyMergeBytes = 16 << 20
	db, err := Open(Config{Dir: t.TempDir(), MemTableSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's
	held := newHeldApplier()
	p := startPipeline(t, db, PipelineConfig{Hooks: &pipehook.Hooks{BeforeApply: held.before}})
	var writes []*Write
	writes = append(writes, set("first", "alone"))
	for r := 0; r < 6; r++ {
		w := &Write{}
		for i := 0; i < 50; i++ { // 2 MiB in the tree (values under valueThreshold)
			w.Sets = append(w.Sets, KV{Key: []byte(fmt.Sprintf("big-%d-%02d", r, i)), Value: bytes.Repeat([]byte{'v'}, 40<<10)})
		}
		writes = append(writes, w)
	}
	submitHeld(t, p, held, writes)
	seen := held.seen()
	first, last := seen[1], seen[len(seen)-1] // the first record was applied alone
	if last-first != 5 {
		t.Fatalf("the applier saw %v, want the six big records after the first", seen)
	}
	deadline := time.Now().Add(10 * time.Second)
	for db.newestTableVersion() < last {
		if time.Now().After(deadline) {
			t.Fatalf("Badger never flushed the first memtable of version %d (tables at %d)", last, db.newestTableVersion())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := db.releasable(p.batchFirst); got >= first {
		t.Fatalf("releasable = %d while the batch %d..%d is partly in an unflushed memtable, want below %d", got, first, last, first)
	}
}

// TestPipeline_LargeMergedBatchKeepsTheLastChangeOfEachKey: a merged batch of
// more than applyLoaderEntries keys (sent through Badger's KVLoader in key
// order) keeps, for each key, the change of the newest record: sets over sets,
// deletes over sets and sets over deletes, before and after a restart.
func TestPipeline_LargeMergedBatchKeepsTheLastChangeOfEachKey(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir)
	held := newHeldApplier()
	p := NewPipeline(db, PipelineConfig{Hooks: &pipehook.Hooks{BeforeApply: held.before}})
	p.Start()
	ctx := context.Background()
	const keys = applyLoaderEntries + 500
	key := func(i int) []byte { return []byte(fmt.Sprintf("a%05d", keys-i)) } // written in reverse order
	all, evens, fours := &Write{}, &Write{}, &Write{}
	for i := 0; i < keys; i++ {
		all.Sets = append(all.Sets, KV{Key: key(i), Value: []byte("1")})
		if i%2 == 0 {
			evens.Deletes = append(evens.Deletes, key(i))
		}
		if i%4 == 0 {
			fours.Sets = append(fours.Sets, KV{Key: key(i), Value: []byte("3")})
		}
	}
	// A value above Badger's value threshold (1 MiB) goes to its value log.
	huge := bytes.Repeat([]byte{'h'}, 2<<20)
	all.Sets = append(all.Sets, KV{Key: []byte("huge"), Value: huge})
	submitHeld(t, p, held, []*Write{set("first", "alone"), all, evens, fours})
	last := held.seen()[len(held.seen())-1]
	check := func(db *DB, merged bool) {
		t.Helper()
		if v, found, err := db.Get(ctx, []byte("huge")); err != nil || !found || !bytes.Equal(v, huge) {
			t.Fatalf("huge: %d bytes found=%v err=%v, want %d bytes", len(v), found, err, len(huge))
		}
		for i := 0; i < keys; i++ {
			want := map[bool]string{true: "1", false: ""}[i%2 == 1]
			if i%4 == 0 {
				want = "3"
			}
			v, found, err := db.Get(ctx, key(i))
			if err != nil || found != (want != "") || string(v) != want {
				t.Fatalf("%s: %q found=%v err=%v, want %q", key(i), v, found, err, want)
			}
			if vs := versions(t, db, string(key(i))); merged && (len(vs) == 0 || vs[0] != last) {
				t.Fatalf("versions of %s: %v, want the newest at %d", key(i), vs, last)
			}
		}
	}
	check(db, true)
	check(reopen(t, p, db, Config{Dir: dir}), false)
}
