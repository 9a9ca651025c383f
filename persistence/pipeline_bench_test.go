package persistence

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// benchWrites runs b.N writes of 200 bytes from writers goroutines, each waiting
// for its write before the next, and reports syncs per write.
func benchWrites(b *testing.B, writers int) {
	db := openTestDB(&testing.T{}, b.TempDir())
	defer db.Close()
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	defer p.Close()
	val := make([]byte, 200)
	ctx := context.Background()
	per := (b.N + writers - 1) / writers
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for g := 0; g < writers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				w := &Write{Sets: []KV{{Key: []byte(fmt.Sprint("k", g, "-", i%100)), Value: val}}}
				if err := p.Submit(w).Wait(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	b.ReportMetric(float64(p.Stats().Commits)/float64(per*writers), "syncs/write")
}

// BenchmarkPipeline_SerialWrite is one writer: the cost of one commit (one sync)
// plus the pipeline's hand-offs.
func BenchmarkPipeline_SerialWrite(b *testing.B) { benchWrites(b, 1) }

// BenchmarkPipeline_ParallelWrite is 256 writers, one write in flight each.
func BenchmarkPipeline_ParallelWrite(b *testing.B) { benchWrites(b, 256) }
