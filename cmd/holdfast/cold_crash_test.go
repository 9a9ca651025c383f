package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestCrash_FlushesSurviveSIGKILL appends to a log whose type flushes trimmed
// records to the cold store (cold/fs) while trims run back to back, SIGKILLs the
// server at random moments, restarts it, and finally reads the whole log: every
// offset ever acknowledged is readable exactly once, from cold or hot, in order.
func TestCrash_FlushesSurviveSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test starts server processes")
	}
	const rounds = 4
	cfgFile, dataDir, rng := crashSetup(t, `  events:
    log:
      maxBatchSize: 20
      retention: {maxRecords: 30, trimEvery: 0s}
      cold: true
`)
	const logPath = "/api/v1/logs/app_crash/events/e1"

	var (
		mu      sync.Mutex
		acked   = map[string]uint64{} // key -> acknowledged offset
		pending []string              // a batch whose reply was lost, retried as is
		seq     int
		trims   int
	)
	for round := 0; round <= rounds; round++ {
		srv := startServer(t, dataDir, cfgFile)
		base := srv.url
		final := round == rounds
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // the producer
			defer wg.Done()
			c := &http.Client{Timeout: 5 * time.Second}
			for ctx.Err() == nil {
				mu.Lock()
				if pending == nil {
					if final {
						mu.Unlock()
						return
					}
					for i := 0; i < 1+rng.Intn(8); i++ {
						pending = append(pending, fmt.Sprint("k", seq))
						seq++
					}
				}
				batch := pending
				mu.Unlock()
				recs := make([]map[string]any, len(batch))
				for i, k := range batch {
					recs[i] = map[string]any{"body": map[string]any{"key": k}, "deduplicationKey": k}
				}
				status, reply, err := call(ctx, c, "POST", base+logPath+"/append", map[string]any{"records": recs})
				if err != nil || status != 200 {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				offs := reply["offsets"].([]any)
				mu.Lock()
				for i, k := range batch {
					acked[k] = uint64(offs[i].(float64))
				}
				pending = nil
				mu.Unlock()
			}
		}()
		go func() { // trims back to back: most kills land in a flush
			defer wg.Done()
			c := &http.Client{Timeout: 5 * time.Second}
			for ctx.Err() == nil && !final {
				if status, _, err := call(ctx, c, "POST", base+logPath+"/trim", nil); err == nil && status == 200 {
					mu.Lock()
					trims++
					mu.Unlock()
				}
			}
		}()
		if !final {
			time.Sleep(time.Duration(300+rng.Intn(900)) * time.Millisecond)
			srv.kill(t)
			cancel()
			wg.Wait()
			mu.Lock()
			t.Logf("round %d: killed with %d records acknowledged, %d trims done", round, len(acked), trims)
			mu.Unlock()
			continue
		}
		wg.Wait()
		cancel()
		// One more trim flushes whatever a killed flush left pending.
		c := &http.Client{Timeout: 10 * time.Second}
		if status, reply, err := call(context.Background(), c, "POST", base+logPath+"/trim", nil); err != nil || status != 200 {
			t.Fatalf("final trim: %d %v %v", status, reply, err)
		}
		_, bounds, _ := call(context.Background(), c, "GET", base+logPath+"/bounds", nil)
		seen := map[string]uint64{}
		var next uint64
		for {
			status, reply, err := call(context.Background(), c, "GET", fmt.Sprintf("%s%s/records?from=%d", base, logPath, next), nil)
			if err != nil || status != 200 {
				t.Fatalf("read from %d: %d %v %v (bounds %v)", next, status, reply, err, bounds)
			}
			recs := reply["records"].([]any)
			if len(recs) == 0 {
				break
			}
			for _, x := range recs {
				rec := x.(map[string]any)
				off := uint64(rec["offset"].(float64))
				key := rec["deduplicationKey"].(string)
				if off != next || rec["body"].(map[string]any)["key"] != key {
					t.Fatalf("record at %d (want %d): %v", off, next, rec)
				}
				if prev, dup := seen[key]; dup {
					t.Fatalf("key %s at %d and %d", key, prev, off)
				}
				seen[key] = off
				next++
			}
		}
		for k, off := range acked {
			if got, ok := seen[k]; !ok || got != off {
				t.Fatalf("acknowledged %s at %d; read %d (%v)", k, off, got, ok)
			}
		}
		if len(seen) != len(acked) {
			t.Fatalf("%d records read, %d acknowledged", len(seen), len(acked))
		}
		segs, _ := filepath.Glob(filepath.Join(dataDir, "cold", "log", "*", "*", "*", "*"))
		t.Logf("%d records readable once each from offset 0 (bounds %v); %d segments; %d trims", len(seen), bounds, len(segs), trims)
		if len(segs) == 0 {
			t.Fatal("nothing was flushed")
		}
		srv.kill(t)
	}
}
