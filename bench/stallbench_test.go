package main

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, ms(i))
	}
	var thousand []time.Duration
	for i := 1; i <= 1000; i++ {
		thousand = append(thousand, ms(i))
	}
	for _, c := range []struct {
		name   string
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{"p50 of 1..100 is the 50th", hundred, 0.5, ms(50)},
		{"p99 of 1..100 is the 99th, not the max", hundred, 0.99, ms(99)},
		{"p99 of 1..1000 is the 990th", thousand, 0.99, ms(990)},
		{"p99.9 of 1..1000 is the 999th", thousand, 0.999, ms(999)},
		{"p100 is the max", thousand, 1, ms(1000)},
		{"p99 of 10 values is the max (nearest rank rounds up)", thousand[:10], 0.99, ms(10)},
		{"one value is every percentile", thousand[:1], 0.5, ms(1)},
		{"no values: zero", nil, 0.99, 0},
	} {
		if got := percentile(c.sorted, c.q); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestSummarizeLatencies(t *testing.T) {
	// 1..1000 ms, shuffled: summarizeLatencies sorts before it reads.
	lat := make([]time.Duration, 1000)
	for i := range lat {
		lat[i] = time.Duration((i*7919)%1000+1) * time.Millisecond
	}
	got := summarizeLatencies(lat)
	want := latencyFigures{P50Ms: 500, P99Ms: 990, P999Ms: 999, MaxMs: 1000}
	if got != want {
		t.Fatalf("%+v, want %+v", got, want)
	}
}

func TestP99Ratios(t *testing.T) {
	round := func(quiet, maint float64) stallRound {
		var r stallRound
		r.Quiet.P99Ms, r.Maintenance.P99Ms = quiet, maint
		return r
	}
	s := p99Ratios([]stallRound{round(10, 15), round(4, 12), round(5, 5)})
	if s.Median != 1.5 || s.Min != 1 || s.Max != 3 || s.N != 3 {
		t.Fatalf("%+v, want median 1.5, min 1, max 3 of 3", s)
	}
	if r := round(0, 1).ratio(func(p stallPhase) float64 { return p.P99Ms }); !math.IsInf(r, 1) {
		t.Fatalf("a quiet figure of 0: ratio %v, want +Inf", r)
	}
}

func TestNumberedIDs(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"00007.mem", "00012.mem", "00009.mem", "000003.sst", "x.mem", "prepare.tmp", "0000000000000004.free"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		ext    string
		lo, hi int64
	}{{".mem", 7, 12}, {".sst", 3, 3}, {".wal", 0, 0}} {
		lo, hi, err := numberedIDs(dir, c.ext)
		if err != nil || lo != c.lo || hi != c.hi {
			t.Errorf("%s: %d, %d, %v; want %d, %d", c.ext, lo, hi, err, c.lo, c.hi)
		}
	}
}

func TestLongestSilence(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms ...int) []time.Time {
		var out []time.Time
		for _, m := range ms {
			out = append(out, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return out
	}
	// Each caller alone has gaps of 40 ms and more; together, at most 30 ms
	// pass without an acknowledgement (70 to 100), if the callers are merged.
	acks := [][]time.Time{at(10, 50, 100), at(30, 70, 120)}
	if got := longestSilence(acks, t0, t0.Add(130*time.Millisecond)); got != 30*time.Millisecond {
		t.Fatalf("%v, want 30ms", got)
	}
	// The window's ends count: nothing from 120 until 200.
	if got := longestSilence(acks, t0, t0.Add(200*time.Millisecond)); got != 80*time.Millisecond {
		t.Fatalf("%v, want 80ms", got)
	}
}
