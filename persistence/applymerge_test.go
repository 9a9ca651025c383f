package persistence

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
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

// TestPipeline_ApplierMergesTheRecordsWaitingForIt: records that queue up
// behind a slow applier reach Badger as one transaction at the newest one's
// sequence number, so a key written by several of them gets one version, with
// the newest value; a delete and a set in later records win over earlier ones;
// every ticket is marked applied, and a reopen (which replays the log record by
// record) shows the same state.
func TestPipeline_ApplierMergesTheRecordsWaitingForIt(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir)
	held := newHeldApplier()
	p := NewPipeline(db, PipelineConfig{BeforeApply: held.before})
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
	var tickets []*Ticket
	for i, w := range writes { // one record each: each waits for its sync
		tk := p.Submit(w)
		if err := tk.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, tk)
		if i == 0 {
			// The applier takes the first record alone; the others queue
			// behind it while it is held.
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
	p.WaitApplied()
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

// TestPipeline_MergedRecordsLargerThanABadgerTransaction: records waiting for
// the applier that together do not fit one Badger transaction are applied one
// at a time, each at its own sequence number, every one of them whole.
func TestPipeline_MergedRecordsLargerThanABadgerTransaction(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Config{Dir: dir, MemTableSize: 8 << 20}) // Badger takes ~1.2 MiB per transaction
	if err != nil {
		t.Fatal(err)
	}
	held := newHeldApplier()
	p := NewPipeline(db, PipelineConfig{BeforeApply: held.before})
	p.Start()
	ctx := context.Background()
	var tickets []*Ticket
	for r := 0; r < 8; r++ {
		w := &Write{}
		for i := 0; i < 5; i++ {
			w.Sets = append(w.Sets, KV{Key: []byte(fmt.Sprintf("r%d-%d", r, i)), Value: bytes.Repeat([]byte{byte(r)}, 100<<10)})
		}
		tk := p.Submit(w)
		if err := tk.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, tk)
		if r == 0 {
			<-held.entered // the first record alone; the others queue
		}
	}
	close(held.release)
	for _, tk := range tickets {
		waitApplied(t, tk)
	}
	if p.Failed() != nil {
		t.Fatal(p.Failed())
	}
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
	seqs := held.seen()
	for r := 0; r < 8; r++ {
		if vs := versions(t, db, fmt.Sprintf("r%d-0", r)); !slices.Equal(vs, []uint64{seqs[r]}) {
			t.Fatalf("versions of record %d's keys: %v, want [%d] (its own sequence number)", r, vs, seqs[r])
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
// and reach Badger as one transaction: one version of the key they all write.
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
		t.Fatalf("versions of k: %v, want one: the five records in one Badger transaction", vs)
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
	p.WaitApplied()
	if took := time.Since(start); took > 10*time.Second || !tk.Applied() {
		t.Fatalf("WaitApplied took %v (the window is 20s); applied=%v", took, tk.Applied())
	}
}
