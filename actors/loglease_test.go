package actors

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cold"
)

type leaseNode struct {
	*testNode
	log   *Log
	clock atomic.Int64 // unix ms the host sees
}

func startLeaseNode(t *testing.T, dir string, opts LogOptions, store cold.Store) *leaseNode {
	t.Helper()
	ln := &leaseNode{}
	ln.clock.Store(time.Unix(1_800_000_000, 0).UnixMilli())
	n := startNode(t, dir, nodeOpts{cfg: Config{
		Cold:        store,
		TypeOptions: func(string) TypeOptions { o := DefaultTypeOptions(); o.Log = opts; return o },
	}})
	n.host.now = func() time.Time { return time.UnixMilli(ln.clock.Load()) }
	ln.testNode = n
	ln.log = NewLog(n.host, ObjectID{App: "app_t", Type: "events", Key: "p"})
	return ln
}

func (n *leaseNode) advance(d time.Duration) { n.clock.Add(d.Milliseconds()) }

func (n *leaseNode) lease(t *testing.T, consumer string, limit int) *Lease {
	t.Helper()
	l, err := n.log.Lease(context.Background(), consumer, limit)
	if err != nil {
		t.Fatalf("lease %s: %v", consumer, err)
	}
	return l
}

func span(l *Lease) string {
	if l == nil {
		return "none"
	}
	return fmt.Sprintf("[%d,%d]#%d", l.FirstOffset, l.LastOffset, l.Attempt)
}

func checkRecords(t *testing.T, l *Lease) {
	t.Helper()
	if uint64(len(l.Records)) != l.LastOffset-l.FirstOffset+1 {
		t.Fatalf("lease %s has %d records", span(l), len(l.Records))
	}
	for i, r := range l.Records {
		if r.Offset != l.FirstOffset+uint64(i) || string(r.Body) != fmt.Sprintf(`{"n":%d}`, r.Offset) {
			t.Fatalf("lease %s record %d: %d %s", span(l), i, r.Offset, r.Body)
		}
	}
}

func leaseOpts(par, attempts int) LogOptions {
	return LogOptions{MaxBatchSize: 5, Leases: &LeaseOptions{MaxParallelism: par, LeaseDuration: 10 * time.Second, MaxAttempts: attempts}}
}

func TestLease_ExclusiveRangesAndContiguousCommit(t *testing.T) {
	n := startLeaseNode(t, t.TempDir(), leaseOpts(2, 0), nil)
	ctx := context.Background()
	appendN(t, n.log, 0, 5)
	appendN(t, n.log, 5, 5)
	appendN(t, n.log, 10, 2)
	a, b := n.lease(t, "c", 0), n.lease(t, "c", 0)
	if span(a) != "[0,4]#1" || span(b) != "[5,9]#1" || a.BatchID == b.BatchID {
		t.Fatalf("leases %s %s", span(a), span(b))
	}
	checkRecords(t, a)
	checkRecords(t, b)
	if c := n.lease(t, "c", 0); c != nil {
		t.Fatalf("a third lease beyond maxParallelism 2: %s", span(c))
	}
	// Acking the later range commits nothing; acking the earlier folds both.
	if cur, err := n.log.Ack(ctx, "c", b.BatchID); err != nil || cur != nil {
		t.Fatalf("ack of the later range: %v %v, want no cursor move", cur, err)
	}
	if cur, err := n.log.Ack(ctx, "c", a.BatchID); err != nil || cur == nil || *cur != 10 {
		t.Fatalf("ack of the earlier range: %v %v, want cursor 10", cur, err)
	}
	if c, _, _ := n.log.Cursor(ctx, "c"); c != 10 {
		t.Fatalf("cursor %d", c)
	}
	// Double settlement, another consumer's ack, unknown ids: all refused.
	for _, x := range []struct{ consumer, id string }{{"c", a.BatchID}, {"c", b.BatchID}, {"c", "nope"}, {"c", ""}} {
		if _, err := n.log.Ack(ctx, x.consumer, x.id); !errors.Is(err, ErrLeaseNotHeld) {
			t.Fatalf("ack %s %q: %v, want lease_not_held", x.consumer, x.id, err)
		}
	}
	c := n.lease(t, "c", 1)
	if span(c) != "[10,10]#1" {
		t.Fatalf("limit 1: %s", span(c))
	}
	if _, err := n.log.Ack(ctx, "other", c.BatchID); !errors.Is(err, ErrLeaseNotHeld) {
		t.Fatalf("ack by another consumer: %v", err)
	}
	// An independent consumer starts from the beginning.
	if d := n.lease(t, "d", 0); span(d) != "[0,4]#1" {
		t.Fatalf("independent consumer: %s", span(d))
	}
}

func TestLease_NackAndExpiryRedeliverUnderAFreshBatchID(t *testing.T) {
	n := startLeaseNode(t, t.TempDir(), leaseOpts(1, 0), nil)
	ctx := context.Background()
	appendN(t, n.log, 0, 5)
	appendN(t, n.log, 5, 5)
	a := n.lease(t, "c", 0)
	if err := n.log.Nack(ctx, "c", a.BatchID); err != nil {
		t.Fatal(err)
	}
	a2 := n.lease(t, "c", 0)
	if span(a2) != "[0,4]#2" || a2.BatchID == a.BatchID {
		t.Fatalf("after a nack: %s (batch %s, was %s)", span(a2), a2.BatchID, a.BatchID)
	}
	checkRecords(t, a2)
	if _, err := n.log.Ack(ctx, "c", a.BatchID); !errors.Is(err, ErrLeaseNotHeld) {
		t.Fatalf("ack with the fenced id: %v", err)
	}
	if err := n.log.Nack(ctx, "c", a.BatchID); !errors.Is(err, ErrLeaseNotHeld) {
		t.Fatalf("nack with the fenced id: %v", err)
	}
	// Expiry: not redelivered early, then reclaimed and the old holder fenced.
	n.advance(9 * time.Second)
	if l := n.lease(t, "c", 0); l != nil {
		t.Fatalf("lease while the range is held: %s", span(l))
	}
	n.advance(2 * time.Second)
	a3 := n.lease(t, "c", 0)
	if span(a3) != "[0,4]#3" {
		t.Fatalf("after expiry: %s", span(a3))
	}
	if _, err := n.log.Ack(ctx, "c", a2.BatchID); !errors.Is(err, ErrLeaseNotHeld) {
		t.Fatalf("ack by the expired holder: %v", err)
	}
	// An expired range nobody reclaimed may still be acked by its holder.
	n.advance(11 * time.Second)
	if cur, err := n.log.Ack(ctx, "c", a3.BatchID); err != nil || cur == nil || *cur != 5 {
		t.Fatalf("ack of an expired, unreclaimed range: %v %v", cur, err)
	}
	infos, _ := n.log.Leases(ctx, "c")
	if len(infos) != 0 {
		t.Fatalf("ranges left: %+v", infos)
	}
}

func TestLease_PoisonWithoutAndWithMaxAttempts(t *testing.T) {
	t.Run("without maxAttempts it blocks forever", func(t *testing.T) {
		n := startLeaseNode(t, t.TempDir(), leaseOpts(2, 0), nil)
		ctx := context.Background()
		appendN(t, n.log, 0, 5)
		appendN(t, n.log, 5, 5)
		poison := n.lease(t, "c", 0)
		next := n.lease(t, "c", 0)
		if _, err := n.log.Ack(ctx, "c", next.BatchID); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 20; i++ {
			if err := n.log.Nack(ctx, "c", poison.BatchID); err != nil {
				t.Fatal(err)
			}
			poison = n.lease(t, "c", 0)
			if poison.FirstOffset != 0 || poison.Attempt != i+2 {
				t.Fatalf("redelivery %d: %s", i, span(poison))
			}
		}
		if c, _, _ := n.log.Cursor(ctx, "c"); c != 0 {
			t.Fatalf("cursor %d moved past a poison range", c)
		}
		if d, _ := n.log.DeadLetters(ctx, "c"); len(d) != 0 {
			t.Fatalf("dead letters without maxAttempts: %+v", d)
		}
	})
	t.Run("with maxAttempts it is dead-lettered and skipped", func(t *testing.T) {
		var poisoned atomic.Int32
		opts := leaseOpts(1, 2)
		opts.OnPoison = func(id ObjectID, consumer string, first, last uint64, attempts int) {
			if consumer == "c" && first == 0 && last == 4 && attempts == 2 {
				poisoned.Add(1)
			}
		}
		n := startLeaseNode(t, t.TempDir(), opts, nil)
		ctx := context.Background()
		appendN(t, n.log, 0, 5)
		appendN(t, n.log, 5, 5)
		for i := 0; i < 2; i++ {
			p := n.lease(t, "c", 0)
			if err := n.log.Nack(ctx, "c", p.BatchID); err != nil {
				t.Fatal(err)
			}
		}
		next := n.lease(t, "c", 0) // attempt 3 would be one too many: dead letter, then the next range
		if span(next) != "[5,9]#1" {
			t.Fatalf("after the poison range: %s", span(next))
		}
		if c, _, _ := n.log.Cursor(ctx, "c"); c != 5 {
			t.Fatalf("cursor %d: the dead letter counts as settled", c)
		}
		if cur, err := n.log.Ack(ctx, "c", next.BatchID); err != nil || *cur != 10 {
			t.Fatalf("ack: %v %v", cur, err)
		}
		d, err := n.log.DeadLetters(ctx, "c")
		if err != nil || len(d) != 1 || d[0].FirstOffset != 0 || d[0].LastOffset != 4 || d[0].Attempts != 2 || len(d[0].Records) != 5 || string(d[0].Records[3].Body) != `{"n":3}` {
			t.Fatalf("dead letters %+v %v", d, err)
		}
		if poisoned.Load() != 1 {
			t.Fatalf("OnPoison called %d times", poisoned.Load())
		}
	})
}

func TestLease_RedeliveryOfFlushedAndTrimmedRanges(t *testing.T) {
	t.Run("flushed to cold storage", func(t *testing.T) {
		opts := leaseOpts(1, 0)
		opts.MaxRecords, opts.Cold = 5, true
		n := startLeaseNode(t, t.TempDir(), opts, cold.NewMemory())
		ctx := context.Background()
		appendN(t, n.log, 0, 5)
		appendN(t, n.log, 5, 5)
		a := n.lease(t, "c", 0)
		if err := n.log.Nack(ctx, "c", a.BatchID); err != nil {
			t.Fatal(err)
		}
		if removed, err := n.log.Trim(ctx); err != nil || removed != 5 {
			t.Fatalf("trim: %d %v", removed, err)
		}
		a2 := n.lease(t, "c", 0)
		if span(a2) != "[0,4]#2" {
			t.Fatalf("redelivery from cold: %s", span(a2))
		}
		checkRecords(t, a2)
		if _, err := n.log.Ack(ctx, "c", a2.BatchID); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("trimmed without cold storage", func(t *testing.T) {
		opts := leaseOpts(1, 0)
		opts.MaxRecords = 2
		n := startLeaseNode(t, t.TempDir(), opts, nil)
		ctx := context.Background()
		appendN(t, n.log, 0, 5)
		appendN(t, n.log, 5, 5)
		a := n.lease(t, "c", 0)
		if err := n.log.Nack(ctx, "c", a.BatchID); err != nil {
			t.Fatal(err)
		}
		if _, err := n.log.Trim(ctx); err != nil {
			t.Fatal(err)
		}
		var te *OffsetTruncatedError
		if _, err := n.log.Lease(ctx, "c", 0); !errors.As(err, &te) || te.Requested != 0 || te.Oldest != 8 {
			t.Fatalf("lease of a trimmed redelivery: %v, want 410 once", err)
		}
		b := n.lease(t, "c", 0)
		if span(b) != "[8,9]#1" {
			t.Fatalf("after the 410: %s", span(b))
		}
		if cur, err := n.log.Ack(ctx, "c", b.BatchID); err != nil || *cur != 10 {
			t.Fatalf("ack: %v %v", cur, err)
		}
	})
	t.Run("history trimmed before anyone leased it", func(t *testing.T) {
		opts := leaseOpts(1, 0)
		opts.MaxRecords = 3
		n := startLeaseNode(t, t.TempDir(), opts, nil)
		ctx := context.Background()
		appendN(t, n.log, 0, 5)
		if _, err := n.log.Trim(ctx); err != nil {
			t.Fatal(err)
		}
		a := n.lease(t, "c", 0)
		if span(a) != "[2,4]#1" {
			t.Fatalf("first lease: %s", span(a))
		}
		if c, _, _ := n.log.Cursor(ctx, "c"); c != 2 {
			t.Fatalf("cursor %d, want it to start at oldestOffset 2", c)
		}
		if cur, err := n.log.Ack(ctx, "c", a.BatchID); err != nil || *cur != 5 {
			t.Fatalf("ack: %v %v", cur, err)
		}
	})
}

func TestLease_DisabledAndSurvivesRestart(t *testing.T) {
	n := startLeaseNode(t, t.TempDir(), LogOptions{}, nil)
	if _, err := n.log.Lease(context.Background(), "c", 0); !errors.Is(err, ErrLeasesDisabled) {
		t.Fatalf("lease without leases: %v", err)
	}
	dir := t.TempDir()
	n = startLeaseNode(t, dir, leaseOpts(2, 0), nil)
	ctx := context.Background()
	appendN(t, n.log, 0, 5)
	appendN(t, n.log, 5, 5)
	a, b := n.lease(t, "c", 0), n.lease(t, "c", 0)
	if err := n.log.Nack(ctx, "c", b.BatchID); err != nil {
		t.Fatal(err)
	}
	n.stop()
	n = startLeaseNode(t, dir, leaseOpts(2, 0), nil)
	infos, err := n.log.Leases(ctx, "c")
	if err != nil || len(infos) != 2 || infos[0].State != "active" || infos[1].State != "nacked" || infos[0].BatchID != a.BatchID {
		t.Fatalf("ranges after a restart: %+v %v", infos, err)
	}
	if l := n.lease(t, "c", 0); span(l) != "[5,9]#2" {
		t.Fatalf("redelivery after a restart: %s", span(l))
	}
	if cur, err := n.log.Ack(ctx, "c", a.BatchID); err != nil || *cur != 5 {
		t.Fatalf("ack after a restart: %v %v", cur, err)
	}
}

// TestLease_SixteenPollersShareOneConsumer: 16 pollers share one consumer over
// 20,000 records; each randomly acks, nacks, or crashes (lets its lease expire).
// Every offset is acked exactly once by a holder whose batch id was current, and
// the cursor ends at nextOffset.
func TestLease_SixteenPollersShareOneConsumer(t *testing.T) {
	records := 100_000
	if testing.Short() {
		records = 20_000
	}
	opts := LogOptions{MaxBatchSize: 100, Leases: &LeaseOptions{MaxParallelism: 16, LeaseDuration: 300 * time.Millisecond}}
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{TypeOptions: func(string) TypeOptions { o := DefaultTypeOptions(); o.Log = opts; return o }}})
	lg := NewLog(n.host, ObjectID{App: "app_t", Type: "events", Key: "p"})
	ctx := context.Background()
	for i := 0; i < records; i += 100 {
		appendN(t, lg, i, 100)
	}
	var mu sync.Mutex
	acked := make([]int, records)
	var acks, nacks, crashes atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Minute)
	for p := 0; p < 16; p++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := newRand(seed)
			for time.Now().Before(deadline) {
				if c, _, _ := lg.Cursor(ctx, "c"); c == uint64(records) {
					return
				}
				l, err := lg.Lease(ctx, "c", 0)
				if err != nil {
					t.Error(err)
					return
				}
				if l == nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				switch x := rng.Intn(100); {
				case x < 80:
					if _, err := lg.Ack(ctx, "c", l.BatchID); err != nil {
						if errors.Is(err, ErrLeaseNotHeld) {
							continue // expired and reclaimed meanwhile: fenced, as it must be
						}
						t.Error(err)
						return
					}
					acks.Add(1)
					mu.Lock()
					for off := l.FirstOffset; off <= l.LastOffset; off++ {
						acked[off]++
					}
					mu.Unlock()
				case x < 90:
					nacks.Add(1)
					if err := lg.Nack(ctx, "c", l.BatchID); err != nil && !errors.Is(err, ErrLeaseNotHeld) {
						t.Error(err)
						return
					}
				default:
					crashes.Add(1) // walk away: the lease expires
				}
			}
		}(int64(p))
	}
	wg.Wait()
	if c, _, _ := lg.Cursor(ctx, "c"); c != uint64(records) {
		t.Fatalf("cursor %d, want %d", c, records)
	}
	for off, k := range acked {
		if k != 1 {
			t.Fatalf("offset %d acked %d times", off, k)
		}
	}
	t.Logf("%d records: %d acks, %d nacks, %d crashed holders", records, acks.Load(), nacks.Load(), crashes.Load())
}

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewSource(seed)) }

// TestLog_GoAPIRejectsBadBodies: the Go API checks what the gateway checks,
// and a refused append writes nothing.
func TestLog_GoAPIRejectsBadBodies(t *testing.T) {
	n := startNode(t, t.TempDir(), nodeOpts{})
	lg := NewLog(n.host, ObjectID{App: "app_t", Type: "events", Key: "p"})
	ctx := context.Background()
	for _, body := range []string{`{`, `{"a":1} x`, ``, `nul`} {
		if _, err := lg.Append(ctx, LogInput{Body: []byte(`1`)}, LogInput{Body: []byte(body)}); !errors.Is(err, ErrBadRequest) {
			t.Errorf("append of body %q: %v, want bad request", body, err)
		}
	}
	if b, _ := lg.Bounds(ctx); b.NextOffset != 0 {
		t.Fatalf("refused appends wrote: %+v", b)
	}
}
