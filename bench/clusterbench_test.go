package main

import (
	"testing"
	"time"
)

func TestLongestGap(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms ...int) []time.Time {
		var out []time.Time
		for _, m := range ms {
			out = append(out, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return out
	}
	from, to := t0.Add(100*time.Millisecond), t0.Add(1000*time.Millisecond)
	for _, c := range []struct {
		name  string
		times []time.Time
		want  time.Duration
	}{
		{"the gap that spans the window's start counts", at(0, 300, 400, 1100), 700 * time.Millisecond},
		{"a gap before the window does not", at(0, 90, 150, 200, 1005), 805 * time.Millisecond},
		{"a gap after the window does not", at(50, 950, 1010, 3000), 900 * time.Millisecond},
		{"nothing after the window's end: it counts as the last", at(50, 120, 400), 600 * time.Millisecond},
		{"nothing at all: the whole window", nil, 900 * time.Millisecond},
	} {
		if got := longestGap(c.times, from, to); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestDistinct(t *testing.T) {
	keep := distinct(func(p uint32) bool { return p%2 == 0 })
	var got []bool
	for _, p := range []uint32{0, 1, 2, 0, 2, 4} {
		got = append(got, keep(p))
	}
	want := []bool{true, false, true, false, false, true}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}
