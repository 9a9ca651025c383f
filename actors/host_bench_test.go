package actors

import (
	"context"
	"testing"
)

// BenchmarkHost_SerialSet is one caller writing one object, one write at a time.
func BenchmarkHost_SerialSet(b *testing.B) {
	n := startNode(&testing.T{}, b.TempDir(), nodeOpts{})
	defer n.stop()
	o := n.kv("bench", "one")
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := o.Set(ctx, "v", i); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHost_SerialGet is the request path without a write.
func BenchmarkHost_SerialGet(b *testing.B) {
	n := startNode(&testing.T{}, b.TempDir(), nodeOpts{})
	defer n.stop()
	o := n.kv("bench", "one")
	ctx := context.Background()
	if _, err := o.Set(ctx, "v", 1); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := o.GetSlot(ctx, "v"); err != nil {
			b.Fatal(err)
		}
	}
}
