package actors

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// BenchmarkHost_ParallelSet is 1000 objects with one write in flight each.
func BenchmarkHost_ParallelSet(b *testing.B) {
	n := startNode(&testing.T{}, b.TempDir(), nodeOpts{})
	defer n.stop()
	ctx := context.Background()
	const objects = 1000
	objs := make([]*KV, objects)
	for i := range objs {
		objs[i] = n.kv("bench", fmt.Sprint(i))
		if _, err := objs[i].Set(ctx, "v", 0); err != nil {
			b.Fatal(err)
		}
	}
	val := strings.Repeat("x", 200)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N/objects + 1
	for g := 0; g < objects; g++ {
		wg.Add(1)
		go func(o *KV) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				if _, err := o.Set(ctx, "v", val); err != nil {
					b.Error(err)
					return
				}
			}
		}(objs[g])
	}
	wg.Wait()
}
