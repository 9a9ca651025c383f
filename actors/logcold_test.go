package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cold"
	"github.com/holdfast/holdfast/internal/pipehook"
	"github.com/holdfast/holdfast/persistence"
)

// faultyStore wraps a store: it can fail every call, lose creates' replies
// (the object lands, the caller gets an error), or hold Gets.
type faultyStore struct {
	cold.Store
	mu       sync.Mutex
	down     bool
	lossy    bool
	holdGets chan struct{} // when set, Get waits for it to close
	// holdCreates, when set, makes Create wait for it to close; inCreate and
	// maxInCreate count the Creates waiting at once.
	holdCreates           chan struct{}
	inCreate, maxInCreate int
	creates               []string
}

var errStoreDown = errors.New("store down for the test")

func (f *faultyStore) set(fn func(f *faultyStore)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *faultyStore) Create(ctx context.Context, key string, data []byte) error {
	f.mu.Lock()
	down, lossy, hold := f.down, f.lossy, f.holdCreates
	f.creates = append(f.creates, key)
	f.inCreate++
	f.maxInCreate = max(f.maxInCreate, f.inCreate)
	f.mu.Unlock()
	defer f.set(func(f *faultyStore) { f.inCreate-- })
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if down {
		return errStoreDown
	}
	err := f.Store.Create(ctx, key, data)
	if lossy && err == nil {
		return errStoreDown
	}
	return err
}

func (f *faultyStore) Get(ctx context.Context, key string) ([]byte, error) {
	f.mu.Lock()
	down, hold := f.down, f.holdGets
	f.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if down {
		return nil, errStoreDown
	}
	return f.Store.Get(ctx, key)
}

type coldNode struct {
	*testNode
	store *faultyStore
	mem   *cold.Memory
	log   *Log
}

func startColdNode(t *testing.T, dir string, mem *cold.Memory, opts LogOptions) *coldNode {
	t.Helper()
	opts.Cold = true
	fs := &faultyStore{Store: mem}
	n := startNode(t, dir, nodeOpts{cfg: Config{
		Cold: fs, ColdTimeout: 2 * time.Second,
		TypeOptions: func(string) TypeOptions { o := DefaultTypeOptions(); o.Log = opts; return o },
	}})
	return &coldNode{testNode: n, store: fs, mem: mem, log: NewLog(n.host, ObjectID{App: "app_t", Type: "events", Key: "p"})}
}

func appendN(t *testing.T, l *Log, from, n int) {
	t.Helper()
	in := make([]LogInput, n)
	for i := range in {
		in[i].Body = []byte(fmt.Sprintf(`{"n":%d}`, from+i))
	}
	if _, err := l.Append(context.Background(), in...); err != nil {
		t.Fatal(err)
	}
}

// readAll reads from `from` to the end, page by page, and returns each page's
// offsets.
func readPages(t *testing.T, l *Log, from uint64) [][]uint64 {
	t.Helper()
	var pages [][]uint64
	for {
		p, err := l.Read(context.Background(), from, 0)
		if err != nil {
			t.Fatalf("read from %d: %v", from, err)
		}
		if len(p.Records) == 0 {
			return pages
		}
		var offs []uint64
		for i, r := range p.Records {
			if string(r.Body) != fmt.Sprintf(`{"n":%d}`, r.Offset) || (i > 0 && r.Offset != offs[i-1]+1) {
				t.Fatalf("record %d: body %s", r.Offset, r.Body)
			}
			offs = append(offs, r.Offset)
		}
		pages = append(pages, offs)
		from = p.NextOffset
	}
}

func TestLogCold_FlushThenReadBackSegmentBySegment(t *testing.T) {
	n := startColdNode(t, t.TempDir(), cold.NewMemory(), LogOptions{MaxBatchSize: 3, MaxRecords: 2})
	ctx := context.Background()
	appendN(t, n.log, 0, 3)
	appendN(t, n.log, 3, 1)
	appendN(t, n.log, 4, 3)
	appendN(t, n.log, 7, 3) // offsets 0..9 in blocks of 3, 1, 3, 3
	removed, err := n.log.Trim(ctx)
	if err != nil || removed != 8 {
		t.Fatalf("trim: %d %v, want 8", removed, err)
	}
	b, _ := n.log.Bounds(ctx)
	if *b != (LogBounds{OldestOffset: 0, HotOffset: 8, NextOffset: 10}) {
		t.Fatalf("bounds %+v", b)
	}
	// Three segments of at most maxBatchSize, each record exactly once.
	segs, _ := n.mem.List(ctx, "log/")
	if len(segs) != 3 {
		t.Fatalf("segments %v", segs)
	}
	seen := map[uint64]int{}
	for i, s := range segs {
		data, _ := n.mem.Get(ctx, s.Key)
		first := []uint64{0, 3, 6}[i]
		recs, err := decodeSegment(first, data)
		if err != nil {
			t.Fatalf("segment %s: %v", s.Key, err)
		}
		for _, r := range recs {
			seen[r.Offset]++
		}
	}
	for off := uint64(0); off < 8; off++ {
		if seen[off] != 1 {
			t.Fatalf("offset %d is in %d segments", off, seen[off])
		}
	}
	// Pages stop at each segment's end, then go on into the hot window.
	pages := readPages(t, n.log, 0)
	if fmt.Sprint(pages) != "[[0 1 2] [3 4 5] [6 7] [8 9]]" {
		t.Fatalf("pages %v", pages)
	}
	if pages := readPages(t, n.log, 4); fmt.Sprint(pages) != "[[4 5] [6 7] [8 9]]" {
		t.Fatalf("pages from 4: %v", pages)
	}
	// Lag counts to the end of the log.
	if p, _ := n.log.Read(ctx, 1, 1); p.NextOffset != 2 || p.Lag != 8 {
		t.Fatalf("page %+v", p)
	}
	// A later trim flushes what it trims, after the earlier segments.
	appendN(t, n.log, 10, 2)
	if removed, err := n.log.Trim(ctx); err != nil || removed != 2 {
		t.Fatalf("second trim: %d %v", removed, err)
	}
	if pages := readPages(t, n.log, 0); fmt.Sprint(pages) != "[[0 1 2] [3 4 5] [6 7] [8 9] [10 11]]" {
		t.Fatalf("pages after the second trim: %v", pages)
	}
}

func TestLogCold_ForgetLostAndCorruptSegments(t *testing.T) {
	mem := cold.NewMemory()
	n := startColdNode(t, t.TempDir(), mem, LogOptions{MaxBatchSize: 3, MaxRecords: 1})
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		appendN(t, n.log, i*3, 3)
	}
	if removed, err := n.log.Trim(ctx); err != nil || removed != 11 {
		t.Fatalf("trim: %d %v", removed, err)
	}
	// Segments [0,3) [3,6) [6,9) [9,11), hot 11.
	got, err := n.host.Request(ctx, n.log.id, LogForgetCold{Before: 4})
	if err != nil || got.(*LogForgotten).Forgotten != 1 {
		t.Fatalf("forget before 4: %+v %v (the segment straddling 4 stays)", got, err)
	}
	b, _ := n.log.Bounds(ctx)
	if b.OldestOffset != 3 || b.HotOffset != 11 {
		t.Fatalf("bounds after forgetting %+v", b)
	}
	var te *OffsetTruncatedError
	if _, err := n.log.Read(ctx, 2, 0); !errors.As(err, &te) || te.Requested != 2 || te.Oldest != 3 {
		t.Fatalf("read of a forgotten segment: %v", err)
	}
	// The store still has the forgotten object.
	if _, err := mem.Get(ctx, segmentKey(n.log.id, 0)); err != nil {
		t.Fatalf("forget deleted the object: %v", err)
	}
	// A lost segment is a 410, never a gap; so is a damaged one.
	if err := mem.Delete(ctx, segmentKey(n.log.id, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.log.Read(ctx, 4, 0); !errors.As(err, &te) || te.Requested != 4 || te.Oldest != 6 {
		t.Fatalf("read of a lost segment: %v", err)
	}
	data, _ := mem.Get(ctx, segmentKey(n.log.id, 6))
	data[len(data)/2] ^= 0xFF
	mem.Corrupt(segmentKey(n.log.id, 6), data)
	if _, err := n.log.Read(ctx, 6, 0); !errors.As(err, &te) || te.Oldest != 9 {
		t.Fatalf("read of a corrupt segment: %v", err)
	}
	if pages := readPages(t, n.log, 9); fmt.Sprint(pages) != "[[9 10] [11]]" {
		t.Fatalf("pages after the damage: %v", pages)
	}
	if got, _ := n.host.Request(ctx, n.log.id, LogForgetCold{Before: 100}); got.(*LogForgotten).Forgotten != 3 {
		t.Fatalf("forget all: %+v", got)
	}
	if b, _ := n.log.Bounds(ctx); b.OldestOffset != 11 {
		t.Fatalf("bounds after forgetting all %+v", b)
	}
}

// TestLogCold_StoreFailuresKeepRecordsHotAndRetryTheSameSegment: a failed create
// fails the trim with every record hot; a create whose reply was lost is retried
// with the same bytes, across a restart, even after more appends.
func TestLogCold_StoreFailuresKeepRecordsHotAndRetryTheSameSegment(t *testing.T) {
	dir := t.TempDir()
	mem := cold.NewMemory()
	n := startColdNode(t, dir, mem, LogOptions{MaxBatchSize: 4, MaxRecords: 2})
	ctx := context.Background()
	appendN(t, n.log, 0, 4)
	appendN(t, n.log, 4, 2)

	n.store.set(func(f *faultyStore) { f.down = true })
	if _, err := n.log.Trim(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("trim with the store down: %v, want 503", err)
	}
	if b, _ := n.log.Bounds(ctx); b.HotOffset != 0 {
		t.Fatalf("records left hot after a failed flush: %+v", b)
	}
	if pages := readPages(t, n.log, 0); fmt.Sprint(pages) != "[[0 1 2 3] [4 5]]" {
		t.Fatalf("pages after a failed flush: %v", pages)
	}
	// The create lands, its reply is lost.
	n.store.set(func(f *faultyStore) { f.down, f.lossy = false, true })
	if _, err := n.log.Trim(ctx); err == nil {
		t.Fatal("trim succeeded with a lost reply")
	}
	// Restart with a looser retention, and more records: a fresh run would now be
	// [0,3); the pending run [0,4) is written as it was fixed.
	n.stop()
	n = startColdNode(t, dir, mem, LogOptions{MaxBatchSize: 4, MaxRecords: 5})
	appendN(t, n.log, 6, 2)
	removed, err := n.log.Trim(ctx)
	if err != nil || removed != 4 {
		t.Fatalf("trim after the restart: %d %v, want the pending run of 4", removed, err)
	}
	segs, _ := mem.List(ctx, "log/")
	if len(segs) != 1 || segs[0].Key != segmentKey(n.log.id, 0) {
		t.Fatalf("segments %v: want the pending run [0,4) only", segs)
	}
	data, _ := mem.Get(ctx, segs[0].Key)
	if recs, err := decodeSegment(0, data); err != nil || len(recs) != 4 {
		t.Fatalf("segment: %d records, %v", len(recs), err)
	}
	if pages := readPages(t, n.log, 0); fmt.Sprint(pages) != "[[0 1 2 3] [4 5 6 7]]" {
		t.Fatalf("pages %v", pages)
	}
}

// TestLogCold_ReadsDoNotStallTheObject holds a cold read in the store while the
// object serves appends and hot reads; a store that is down answers 503.
func TestLogCold_ReadsDoNotStallTheObject(t *testing.T) {
	n := startColdNode(t, t.TempDir(), cold.NewMemory(), LogOptions{MaxBatchSize: 2, MaxRecords: 1})
	ctx := context.Background()
	appendN(t, n.log, 0, 2)
	appendN(t, n.log, 2, 1)
	if _, err := n.log.Trim(ctx); err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	n.store.set(func(f *faultyStore) { f.holdGets = hold })
	done := make(chan error, 1)
	go func() {
		p, err := n.log.Read(ctx, 0, 0)
		if err == nil && len(p.Records) != 2 {
			err = fmt.Errorf("cold page %+v", p)
		}
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	appendN(t, n.log, 3, 1)
	if p, err := n.log.Read(ctx, 2, 0); err != nil || len(p.Records) != 2 {
		t.Fatalf("hot read while a cold read is held: %+v %v", p, err)
	}
	select {
	case err := <-done:
		t.Fatalf("the cold read finished while held: %v", err)
	default:
	}
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	n.store.set(func(f *faultyStore) { f.holdGets, f.down = nil, true })
	if _, err := n.log.Read(ctx, 0, 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("cold read with the store down: %v, want 503", err)
	}
}

// TestLogCold_ReadsSeeWritesBadgerDoesNotShowYet holds the applier: a segment
// index entry and a dead letter that are durable but not yet in Badger are read
// from the object's overlay.
func TestLogCold_ReadsSeeWritesBadgerDoesNotShowYet(t *testing.T) {
	applyHold := newHold(t)
	applyHold.open()
	opts := LogOptions{MaxBatchSize: 2, MaxRecords: 1, Cold: true, Leases: &LeaseOptions{MaxAttempts: 1, LeaseDuration: time.Minute}}
	n := startNode(t, t.TempDir(), nodeOpts{
		cfg:  Config{Cold: cold.NewMemory(), TypeOptions: func(string) TypeOptions { o := DefaultTypeOptions(); o.Log = opts; return o }},
		pipe: persistence.PipelineConfig{Hooks: &pipehook.Hooks{BeforeApply: func(uint64) { applyHold.before(1) }}},
	})
	t.Cleanup(applyHold.open)
	lg := NewLog(n.host, ObjectID{App: "app_t", Type: "events", Key: "p"})
	ctx := context.Background()
	appendN(t, lg, 0, 2)
	appendN(t, lg, 2, 1)
	applyHold.mu.Lock()
	applyHold.held, applyHold.release = true, make(chan struct{})
	applyHold.mu.Unlock()
	lease, err := lg.Lease(ctx, "c", 0)
	if err != nil || lease == nil {
		t.Fatalf("lease: %v", err)
	}
	if err := lg.Nack(ctx, "c", lease.BatchID); err != nil {
		t.Fatal(err)
	}
	if l, err := lg.Lease(ctx, "c", 0); err != nil || l == nil || l.FirstOffset != 2 {
		t.Fatalf("lease after the poison range: %+v %v", l, err)
	}
	if d, err := lg.DeadLetters(ctx, "c"); err != nil || len(d) != 1 {
		t.Fatalf("dead letters not yet applied: %+v %v", d, err)
	}
	if removed, err := lg.Trim(ctx); err != nil || removed != 2 {
		t.Fatalf("trim: %d %v", removed, err)
	}
	if p, err := lg.Read(ctx, 0, 0); err != nil || len(p.Records) != 2 {
		t.Fatalf("cold read of a segment whose index entry is not applied yet: %+v %v", p, err)
	}
}
