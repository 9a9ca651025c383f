package main

import (
	"context"
	"math/rand"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestCrash_LeasesSurviveSIGKILL: pollers lease and ack one consumer's ranges
// while the server is SIGKILLed and restarted. After each restart every lease a
// poller held is still held under the same batch id (none released early or
// lost) and its holder acks it; expired ones are redelivered; at the end every
// offset was acked exactly once and the cursor is at nextOffset.
func TestCrash_LeasesSurviveSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test starts server processes")
	}
	const records, pollers, rounds = 10000, 8, 3
	cfgFile, dataDir, rng := crashSetup(t, `  jobs:
    log:
      maxBatchSize: 50
      leases: {maxParallelism: 8, leaseDuration: 10s}
`)
	const logPath = "/api/v1/logs/app_crash/jobs/j1"

	type held struct {
		batchID     string
		first, last uint64
	}
	var (
		mu     sync.Mutex
		acked  = make([]int, records)
		holds  = map[string]held{} // leases held by pollers, by batch id
		srvURL string
	)
	c := &http.Client{Timeout: 5 * time.Second}
	srv := startServer(t, dataDir, cfgFile)
	srvURL = srv.url
	for i := 0; i < records; i += 50 {
		recs := make([]map[string]any, 50)
		for j := range recs {
			recs[j] = map[string]any{"body": i + j}
		}
		if status, reply, err := call(context.Background(), c, "POST", srvURL+logPath+"/append", map[string]any{"records": recs}); err != nil || status != 200 {
			t.Fatalf("append: %d %v %v", status, reply, err)
		}
	}
	ack := func(ctx context.Context, h held) bool {
		status, _, err := call(ctx, c, "POST", srvURL+logPath+"/consumers/c/ack", map[string]any{"batchId": h.batchID})
		if err != nil || status >= 500 {
			return false // unknown outcome: retried with the same batch id
		}
		mu.Lock()
		defer mu.Unlock()
		delete(holds, h.batchID)
		if status == 200 {
			for off := h.first; off <= h.last; off++ {
				acked[off]++
			}
		}
		return true
	}
	for round := 0; ; round++ {
		final := round == rounds
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for p := 0; p < pollers; p++ {
			wg.Add(1)
			go func(r *rand.Rand) {
				defer wg.Done()
				for ctx.Err() == nil {
					// First the leases this poller's predecessors held across the kill.
					mu.Lock()
					var mine *held
					for _, h := range holds {
						h := h
						mine = &h
						break
					}
					mu.Unlock()
					if mine != nil {
						if !ack(ctx, *mine) {
							time.Sleep(10 * time.Millisecond)
						}
						continue
					}
					status, reply, err := call(ctx, c, "POST", srvURL+logPath+"/consumers/c/lease", nil)
					if err != nil || status >= 500 {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					if status == 204 {
						_, cur, _ := call(ctx, c, "GET", srvURL+logPath+"/cursors/c", nil)
						if off, ok := cur["offset"].(float64); ok && off == records {
							return
						}
						time.Sleep(20 * time.Millisecond)
						continue
					}
					h := held{batchID: reply["batchId"].(string), first: uint64(reply["firstOffset"].(float64)), last: uint64(reply["lastOffset"].(float64))}
					mu.Lock()
					holds[h.batchID] = h
					mu.Unlock()
					time.Sleep(time.Duration(50+r.Intn(100)) * time.Millisecond) // processing
					ack(ctx, h)
				}
			}(rand.New(rand.NewSource(rng.Int63())))
		}
		if final {
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				t.Fatal("pollers did not finish")
			}
			cancel()
			break
		}
		time.Sleep(time.Duration(200+rng.Intn(600)) * time.Millisecond)
		srv.kill(t)
		cancel()
		wg.Wait()
		mu.Lock()
		before := make(map[string]held, len(holds))
		for k, v := range holds {
			before[k] = v
		}
		mu.Unlock()
		srv = startServer(t, dataDir, cfgFile)
		srvURL = srv.url
		// No lease released early or lost: every held batch is still active.
		_, list, err := call(context.Background(), c, "GET", srvURL+logPath+"/consumers/c/leases", nil)
		if err != nil {
			t.Fatal(err)
		}
		active := map[string]bool{}
		for _, x := range list["leases"].([]any) {
			l := x.(map[string]any)
			if l["state"] == "active" {
				active[l["batchId"].(string)] = true
			}
		}
		for id, h := range before {
			if !active[id] {
				// Its ack may have landed before the kill with the reply lost.
				if st, _, _ := call(context.Background(), c, "POST", srvURL+logPath+"/consumers/c/ack", map[string]any{"batchId": id}); st == 409 {
					mu.Lock()
					for off := h.first; off <= h.last; off++ {
						if acked[off] == 0 {
							acked[off]++
						}
					}
					delete(holds, id)
					mu.Unlock()
					continue
				}
				t.Fatalf("round %d: lease %s [%d,%d] held before the kill is not active after the restart", round, id, h.first, h.last)
			}
		}
		t.Logf("round %d: killed; %d leases held across the restart, all still active", round, len(before))
	}
	for off, k := range acked {
		if k != 1 {
			t.Fatalf("offset %d acked %d times", off, k)
		}
	}
	_, cur, _ := call(context.Background(), c, "GET", srvURL+logPath+"/cursors/c", nil)
	if cur["offset"] != float64(records) {
		t.Fatalf("cursor %v, want %d", cur, records)
	}
	srv.kill(t)
}
