package gateway

import (
	"math/rand"
	"strings"
	"testing"
)

// badSegmentSplit is badSegment as first written, with strings.Split: the
// oracle for the version that does not allocate.
func badSegmentSplit(p string) string {
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, seg := range segs {
		switch {
		case seg == "" && i < len(segs)-1:
			return "an empty"
		case seg == "." || seg == "..":
			return "a dot"
		}
	}
	return ""
}

func TestBadSegment(t *testing.T) {
	for p, want := range map[string]string{
		"": "", "/": "", "/a/b": "", "/a/b/": "", "/a//b": "an empty", "//": "an empty", "/a/b//": "an empty",
		"/a/./b": "a dot", "/a/..": "a dot", "/../a": "a dot", "/a/.../b": "", "/a/.b": "",
	} {
		if got := badSegment(p); got != want {
			t.Errorf("badSegment(%q) = %q, want %q", p, got, want)
		}
	}
	rng := rand.New(rand.NewSource(1))
	for range 20000 {
		b := make([]byte, rng.Intn(12))
		for i := range b {
			b[i] = "a./"[rng.Intn(3)]
		}
		if got, want := badSegment(string(b)), badSegmentSplit(string(b)); got != want {
			t.Fatalf("badSegment(%q) = %q, the split version says %q", b, got, want)
		}
	}
}

func BenchmarkBadSegment(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = badSegment("/api/v1/objects/app_1/counter/obj-17/n/increment")
	}
}
