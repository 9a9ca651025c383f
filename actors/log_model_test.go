package actors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"
)

// logModel is the retained log as the spec describes it, in memory.
type logModel struct {
	next, hot uint64
	records   map[uint64]modelRecord // hot records
	byKey     map[string]uint64      // dedup index of hot records
	cursors   map[string]uint64
	opts      LogOptions
}

type modelRecord struct {
	body string
	key  string
	at   time.Time
}

func (m *logModel) append(in []LogInput, now time.Time) ([]uint64, error) {
	if len(in) == 0 || len(in) > m.opts.MaxBatchSize {
		return nil, ErrInvalid
	}
	for _, r := range in {
		if r.DeduplicationKey != nil && *r.DeduplicationKey == "" {
			return nil, ErrInvalid
		}
	}
	out := make([]uint64, len(in))
	for i, r := range in {
		if r.DeduplicationKey != nil {
			if off, ok := m.byKey[*r.DeduplicationKey]; ok {
				out[i] = off
				continue
			}
		}
		key := fmt.Sprint("generated-", m.next)
		if r.DeduplicationKey != nil {
			key = *r.DeduplicationKey
		}
		m.records[m.next] = modelRecord{body: string(r.Body), key: key, at: now}
		m.byKey[key] = m.next
		out[i] = m.next
		m.next++
	}
	return out, nil
}

func (m *logModel) hotBytes() int64 {
	var n int64
	for _, r := range m.records {
		n += int64(len(r.body))
	}
	return n
}

func (m *logModel) trim(now time.Time) uint64 {
	var removed uint64
	for m.hot < m.next {
		r := m.records[m.hot]
		count := m.next - m.hot
		old := m.opts.MaxAge > 0 && r.at.Before(now.Add(-m.opts.MaxAge).Truncate(time.Millisecond))
		if !(m.opts.MaxRecords > 0 && count > uint64(m.opts.MaxRecords)) && !(m.opts.MaxBytes > 0 && m.hotBytes() > m.opts.MaxBytes) && !old {
			break
		}
		delete(m.byKey, r.key)
		delete(m.records, m.hot)
		m.hot++
		removed++
	}
	return removed
}

// TestLog_RandomModel runs seeded random operations (appends with fresh, repeated
// and trimmed deduplication keys, reads anywhere, commits, trims, restarts)
// against the log and against logModel, comparing every reply. HOLDFAST_LOG_SEED
// replays one seed; HOLDFAST_LOG_STEPS sets the length.
func TestLog_RandomModel(t *testing.T) {
	seeds := []int64{1, 2, 3}
	if s := os.Getenv("HOLDFAST_LOG_SEED"); s != "" {
		n, _ := strconv.ParseInt(s, 10, 64)
		seeds = []int64{n}
	}
	steps := 600
	if s := os.Getenv("HOLDFAST_LOG_STEPS"); s != "" {
		steps, _ = strconv.Atoi(s)
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runLogModel(t, seed, steps) })
	}
}

func runLogModel(t *testing.T, seed int64, steps int) {
	rng := rand.New(rand.NewSource(seed))
	opts := LogOptions{MaxBatchSize: 1 + rng.Intn(8), MaxRecords: int64(rng.Intn(30)), MaxBytes: int64(rng.Intn(200)),
		Leases: &LeaseOptions{MaxParallelism: 1 + rng.Intn(3), LeaseDuration: time.Duration(1+rng.Intn(3)) * time.Second, MaxAttempts: rng.Intn(4)}}
	clock := time.Unix(1_700_000_000, 0)
	if rng.Intn(2) == 0 {
		opts.MaxAge = time.Duration(1+rng.Intn(20)) * time.Second
	}
	t.Logf("seed %d: %+v", seed, opts)
	dir := t.TempDir()
	cfg := Config{TypeOptions: func(string) TypeOptions { o := DefaultTypeOptions(); o.Log = opts; return o }}
	start := func() *testNode {
		n := startNode(t, dir, nodeOpts{cfg: cfg})
		n.host.now = func() time.Time { return clock }
		return n
	}
	n := start()
	m := &logModel{records: map[uint64]modelRecord{}, byKey: map[string]uint64{}, cursors: map[string]uint64{}, opts: opts}
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "events", Key: "p"}
	lg := func() *Log { return NewLog(n.host, id) }
	keyPool := func() string { return fmt.Sprint("k", rng.Intn(40)) }

	lm := &leaseModel{m: m, opts: *opts.Leases, maxBatch: opts.MaxBatchSize}
	for step := 0; step < steps; step++ {
		where := fmt.Sprintf("seed %d step %d", seed, step)
		switch op := rng.Intn(120); {
		case op >= 100: // leases of consumer "L"
			lm.step(t, where, rng, lg(), clock)
		case op < 40: // append
			size := 1 + rng.Intn(opts.MaxBatchSize+1) // sometimes one too many
			if rng.Intn(20) == 0 {
				size = 0
			}
			in := make([]LogInput, size)
			for i := range in {
				in[i].Body = json.RawMessage(strconv.Quote(fmt.Sprint("body-", step, "-", i, "-", rng.Intn(1000))))
				switch rng.Intn(5) {
				case 0:
				case 1:
					if rng.Intn(10) == 0 {
						in[i].DeduplicationKey = Key("")
						break
					}
					fallthrough
				default:
					in[i].DeduplicationKey = Key(keyPool())
				}
			}
			want, werr := m.append(in, clock)
			got, err := lg().Append(ctx, in...)
			if (werr != nil) != (err != nil) || (werr != nil && !errors.Is(err, ErrInvalid)) {
				t.Fatalf("%s: append %d records: %v, model %v", where, size, err, werr)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s: append offsets %v, model %v", where, got, want)
			}
		case op < 65: // read
			from := uint64(0)
			if m.next > 0 {
				from = uint64(rng.Int63n(int64(m.next + 3)))
			}
			limit := rng.Intn(opts.MaxBatchSize + 3)
			page, err := lg().Read(ctx, from, limit)
			if from < m.hot {
				var te *OffsetTruncatedError
				if !errors.As(err, &te) || te.Requested != from || te.Oldest != m.hot {
					t.Fatalf("%s: read from %d below hot %d: %v", where, from, m.hot, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: read: %v", where, err)
			}
			eff := limit
			if eff == 0 || eff > opts.MaxBatchSize {
				eff = opts.MaxBatchSize
			}
			var want []string
			for off := from; off < m.next && len(want) < eff; off++ {
				r := m.records[off]
				want = append(want, fmt.Sprint(off, r.body, r.at.UnixMilli()))
			}
			var got []string
			for _, r := range page.Records {
				got = append(got, fmt.Sprint(r.Offset, string(r.Body), r.AppendedAt))
				if mr := m.records[r.Offset]; r.DeduplicationKey != mr.key && (mr.key[:1] == "k") {
					t.Fatalf("%s: record %d key %q, model %q", where, r.Offset, r.DeduplicationKey, mr.key)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s: read(%d, %d)\n got %v\nwant %v", where, from, limit, got, want)
			}
			wantNext := max(from, m.next)
			if len(want) > 0 {
				wantNext = from + uint64(len(want))
			}
			wantLag := uint64(0)
			if m.next > wantNext {
				wantLag = m.next - wantNext
			}
			if page.NextOffset != wantNext || page.Lag != wantLag {
				t.Fatalf("%s: read(%d): next %d lag %d, want %d %d", where, from, page.NextOffset, page.Lag, wantNext, wantLag)
			}
		case op < 75: // commit
			c := fmt.Sprint("c", rng.Intn(3))
			off := uint64(rng.Int63n(int64(m.next + 2)))
			got, err := lg().Commit(ctx, c, off)
			if off > m.next {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("%s: commit beyond next: %v", where, err)
				}
				continue
			}
			if cur, ok := m.cursors[c]; !ok || off > cur {
				m.cursors[c] = off
			}
			if err != nil || got != m.cursors[c] {
				t.Fatalf("%s: commit %s %d: %d %v, model %d", where, c, off, got, err, m.cursors[c])
			}
		case op < 85: // trim, after time passes
			clock = clock.Add(time.Duration(rng.Intn(3000)) * time.Millisecond)
			hot0, next0, bytes0 := m.hot, m.next, m.hotBytes()
			want := m.trim(clock)
			b0, _ := lg().Bounds(ctx)
			got, err := lg().Trim(ctx)
			if err != nil || got != want {
				t.Fatalf("%s: trim removed %d %v, model %d (before: model hot %d next %d bytes %d; log %+v)", where, got, err, want, hot0, next0, bytes0, b0)
			}
		case op < 90: // restart
			n.stop()
			n = start()
		default: // bounds, cursors, load
			b, err := lg().Bounds(ctx)
			if err != nil || *b != (LogBounds{OldestOffset: m.hot, HotOffset: m.hot, NextOffset: m.next}) {
				t.Fatalf("%s: bounds %+v %v, model %d %d", where, b, err, m.hot, m.next)
			}
			cs, err := lg().Cursors(ctx)
			if err != nil || fmt.Sprint(cs) != fmt.Sprint(m.cursors) {
				t.Fatalf("%s: cursors %v, model %v", where, cs, m.cursors)
			}
			load, _ := lg().Load(ctx)
			var want uint64
			if len(m.cursors) > 0 {
				vals := make([]uint64, 0, len(m.cursors))
				for _, v := range m.cursors {
					vals = append(vals, v)
				}
				sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
				want = m.next - vals[0]
			}
			if load != want {
				t.Fatalf("%s: load %d, model %d", where, load, want)
			}
		}
	}
	t.Logf("leases: %+v", lm.stats)
}

// leaseModel is consumer "L"'s leases as the spec describes them.
type leaseModel struct {
	m        *logModel
	opts     LeaseOptions
	maxBatch int
	alloc    uint64
	ranges   []*mRange // by first offset
	ids      []string  // every batch id ever handed out (stale ones included)
	stats    struct{ leases, redeliveries, truncations, none, acks, refused int }
}

type mRange struct {
	first, last uint64
	id          string
	attempt     int
	exp         time.Time
	state       byte
}

func (lm *leaseModel) fold() (moved bool) {
	cur := lm.m.cursors["L"]
	keep := lm.ranges[:0]
	for _, r := range lm.ranges {
		switch {
		case r.last < cur && r.state == rangeSettled:
		case r.first <= cur && r.state == rangeSettled:
			cur, moved = r.last+1, true
		default:
			keep = append(keep, r)
		}
	}
	lm.ranges = keep
	if moved {
		lm.m.cursors["L"] = cur
	}
	return moved
}

// lease predicts LogLease: a range (its offsets and attempt), a truncation, or nothing.
func (lm *leaseModel) lease(now time.Time, limit int) (r *mRange, trunc *OffsetTruncatedError) {
	m := lm.m
	for {
		var again bool
		for _, r := range lm.ranges {
			if !(r.state == rangeNacked || (r.state == rangeActive && !r.exp.After(now))) {
				continue
			}
			if r.first < m.hot {
				te := &OffsetTruncatedError{Requested: r.first, Oldest: m.hot}
				if r.last < m.hot {
					r.state = rangeSettled
				} else {
					r.first = m.hot
				}
				if cur := m.cursors["L"]; cur < m.hot {
					below := false
					for _, x := range lm.ranges {
						below = below || (x != r && x.first < m.hot && x.state != rangeSettled)
					}
					if !below {
						m.cursors["L"] = m.hot
					}
				}
				lm.fold()
				return nil, te
			}
			if lm.opts.MaxAttempts > 0 && r.attempt+1 > lm.opts.MaxAttempts {
				r.state = rangeSettled
				lm.fold()
				again = true
				break
			}
			r.attempt++
			r.state = rangeActive
			r.exp = now.Add(lm.opts.LeaseDuration)
			return r, nil
		}
		if !again {
			break
		}
	}
	held := 0
	for _, r := range lm.ranges {
		if r.state == rangeNacked || (r.state == rangeActive && r.exp.After(now)) {
			held++
		}
	}
	if held >= lm.opts.MaxParallelism {
		return nil, nil
	}
	cur, hasCursor := m.cursors["L"]
	start := max(m.hot, cur, lm.alloc)
	if start >= m.next {
		return nil, nil
	}
	if limit == 0 || limit > lm.maxBatch {
		limit = lm.maxBatch
	}
	end := min(m.next, start+uint64(limit))
	if !hasCursor || cur < m.hot {
		if base := max(m.hot, lm.alloc); !hasCursor || base > cur {
			m.cursors["L"] = base
		}
	}
	r = &mRange{first: start, last: end - 1, attempt: 1, exp: now.Add(lm.opts.LeaseDuration), state: rangeActive}
	lm.ranges = append(lm.ranges, r)
	sort.Slice(lm.ranges, func(i, j int) bool { return lm.ranges[i].first < lm.ranges[j].first })
	lm.alloc = end
	return r, nil
}

func (lm *leaseModel) step(t *testing.T, where string, rng *rand.Rand, l *Log, now time.Time) {
	t.Helper()
	ctx := context.Background()
	switch rng.Intn(3) {
	case 0: // lease
		limit := rng.Intn(lm.maxBatch + 2)
		want, wantTrunc := lm.lease(now, limit)
		got, err := l.Lease(ctx, "L", limit)
		switch {
		case wantTrunc != nil:
			lm.stats.truncations++
			var te *OffsetTruncatedError
			if !errors.As(err, &te) || *te != *wantTrunc {
				t.Fatalf("%s: lease: %v, model truncation %+v", where, err, wantTrunc)
			}
		case err != nil:
			t.Fatalf("%s: lease: %v", where, err)
		case want == nil:
			lm.stats.none++
			if got != nil {
				t.Fatalf("%s: lease [%d,%d]#%d, model none", where, got.FirstOffset, got.LastOffset, got.Attempt)
			}
		default:
			if got == nil || got.FirstOffset != want.first || got.LastOffset != want.last || got.Attempt != want.attempt || len(got.Records) != int(want.last-want.first+1) {
				t.Fatalf("%s: lease %+v, model [%d,%d]#%d", where, got, want.first, want.last, want.attempt)
			}
			for _, r := range got.Records {
				if mr, ok := lm.m.records[r.Offset]; !ok || string(r.Body) != mr.body {
					t.Fatalf("%s: lease record %d: %s", where, r.Offset, r.Body)
				}
			}
			want.id = got.BatchID
			lm.ids = append(lm.ids, got.BatchID)
			lm.stats.leases++
			if got.Attempt > 1 {
				lm.stats.redeliveries++
			}
		}
	default: // ack or nack, of a current or a stale id
		if len(lm.ids) == 0 {
			return
		}
		id := lm.ids[rng.Intn(len(lm.ids))] // often a stale one
		var current []string
		for _, x := range lm.ranges {
			if x.state == rangeActive {
				current = append(current, x.id)
			}
		}
		if len(current) > 0 && rng.Intn(10) < 8 {
			id = current[rng.Intn(len(current))]
		}
		var r *mRange
		for _, x := range lm.ranges {
			if x.id == id && x.state == rangeActive {
				r = x
			}
		}
		ack := rng.Intn(3) > 0
		var err error
		var cur *uint64
		if ack {
			cur, err = l.Ack(ctx, "L", id)
		} else {
			err = l.Nack(ctx, "L", id)
		}
		if r == nil {
			if !errors.Is(err, ErrLeaseNotHeld) {
				t.Fatalf("%s: settle of a batch not held: %v", where, err)
			}
			lm.stats.refused++
			return
		}
		if err != nil {
			t.Fatalf("%s: settle: %v", where, err)
		}
		if !ack {
			r.state = rangeNacked
			return
		}
		r.state = rangeSettled
		lm.stats.acks++
		moved := lm.fold()
		if (cur != nil) != moved || (cur != nil && *cur != lm.m.cursors["L"]) {
			t.Fatalf("%s: ack moved the cursor to %v, model %v %d", where, cur, moved, lm.m.cursors["L"])
		}
	}
}
