package persistence

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
)

// benchWrites runs b.N writes of 200 bytes from writers goroutines, each waiting
// for its write before the next, and reports syncs per write.
func benchWrites(b *testing.B, writers int) { benchWritesVia(b, writers, false) }

// benchWritesVia is benchWrites; with help, each writer queues its write and
// commits it itself when the committer is parked (Queue, then Help), as an
// object's caller does (actors.Host.send), instead of Submit's hand-off to the
// committer goroutine.
func benchWritesVia(b *testing.B, writers int, help bool) {
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
				var t *Ticket
				if help {
					t = p.Queue(w)
					p.Help()
				} else {
					t = p.Submit(w)
				}
				if err := t.Wait(ctx); err != nil {
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

// BenchmarkPipeline_SerialWriteHelped is one writer that commits its own write
// while the committer is parked: a serial object's path. The goroutine
// hand-offs of SerialWrite are gone, so its excess over WAL_Commit is the
// pipeline's own work on the caller's goroutine.
func BenchmarkPipeline_SerialWriteHelped(b *testing.B) { benchWritesVia(b, 1, true) }

// BenchmarkPipeline_ParallelWrite is 256 writers, one write in flight each.
func BenchmarkPipeline_ParallelWrite(b *testing.B) { benchWrites(b, 256) }

// BenchmarkWAL_Commit is the log's own commit of a 200-byte record: one page
// written and synced (RWF_DSYNC through O_DIRECT where the kernel allows it),
// with no pipeline around it. SerialWrite minus this is the pipeline's cost.
func BenchmarkWAL_Commit(b *testing.B) {
	w, _, err := openWAL(b.TempDir(), 64<<20, slog.New(slog.NewTextHandler(io.Discard, nil)), 0, func(uint64, []byte) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	defer w.closeAll()
	rec := make([]byte, 200)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := w.commit(uint64(i+1), rec); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApply writes batches of sorted keys (writes of three keys each,
// 256-byte values, over 1,000 objects) as the applier does, through Badger's
// KVLoader and through one transaction: 1,200 keys is the batch a replicated
// node's applier saw under holdfast-r3's load, 60 its typical one (docs/
// benchmarks.md). Before HOLDFAST PATCH 4 a loader allocated 3.4 MB per
// batch (two buffers of Badger's largest request count).
func BenchmarkApply(b *testing.B) {
	for _, keys := range []int{3, 60, 600, 1200} {
		for _, way := range []string{"loader", "txn"} {
			b.Run(fmt.Sprintf("%s-%d", way, keys), func(b *testing.B) {
				db := openTestDB(&testing.T{}, b.TempDir())
				defer db.Close()
				p := NewPipeline(db, PipelineConfig{})
				val := make([]byte, 256)
				entries := make([]applyEntry, 0, keys)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					entries = entries[:0]
					for k := range keys / 3 {
						o := (i*keys/3 + k) % 1000
						for _, s := range []string{"c", "m", "v"} {
							entries = append(entries, applyEntry{key: fmt.Appendf(nil, "o%04d/%s", o, s), value: val})
						}
					}
					slices.SortFunc(entries, func(x, y applyEntry) int { return bytes.Compare(x.key, y.key) })
					var err error
					if way == "loader" {
						err = p.applyLoader(entries, uint64(i+1))
					} else {
						err = p.applyTxn(entries, uint64(i+1))
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*keys), "ns/key")
			})
		}
	}
}
