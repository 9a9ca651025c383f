package persistence

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// BenchmarkPipeline_SerialWrite is one writer waiting for each write: the cost of
// one commit (one sync) plus the pipeline's hand-offs.
func BenchmarkPipeline_SerialWrite(b *testing.B) {
	db := openTestDB(&testing.T{}, b.TempDir())
	defer db.Close()
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	defer p.Close()
	val := make([]byte, 200)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := &Write{Sets: []KV{{Key: []byte(fmt.Sprint("k", i%100)), Value: val}}}
		if err := p.Submit(w).Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(p.Stats().Commits)/float64(b.N), "syncs/write")
}

// BenchmarkPipeline_ParallelWrite is 256 writers, one write in flight each.
func BenchmarkPipeline_ParallelWrite(b *testing.B) {
	db := openTestDB(&testing.T{}, b.TempDir())
	defer db.Close()
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	defer p.Close()
	val := make([]byte, 200)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N/256 + 1
	for g := 0; g < 256; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				w := &Write{Sets: []KV{{Key: []byte(fmt.Sprint("k", g)), Value: val}}}
				if err := p.Submit(w).Wait(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	b.ReportMetric(float64(p.Stats().Commits)/float64(per*256), "syncs/write")
}
