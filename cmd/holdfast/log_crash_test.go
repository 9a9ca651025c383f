package main

import (
	"context"
	"fmt"
	"math/rand"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestCrash_LogAppendsWithDedupKeysSurviveSIGKILL: producers append batches with
// deduplication keys to one log while the server is SIGKILLed and restarted;
// every batch whose reply was lost is retried with the same keys. At the end
// every record is present exactly once, offsets are contiguous, every
// acknowledged offset holds its key, and every acknowledged cursor commit
// survived.
func TestCrash_LogAppendsWithDedupKeysSurviveSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test starts server processes")
	}
	cfgFile, dataDir, rng := crashSetup(t, ``)
	runLogCrash(t, newSingleTarget(t, dataDir, cfgFile), rng)
}

// runLogCrash is the log's crash checker: producers append batches with
// deduplication keys, retrying each until it is acknowledged, and a consumer
// commits its cursor, while tgt is killed and restarted; at the end every key is
// in the log exactly once at the offset acknowledged, offsets are contiguous,
// and the cursor holds the highest acknowledged commit.
func runLogCrash(t *testing.T, tgt crashTarget, rng *rand.Rand) {
	const producers, rounds = 6, 4
	const logPath = "/api/v1/logs/app_crash/events/l1"

	type batch struct{ keys []string }
	var (
		mu         sync.Mutex
		ackedKeys  = map[string]uint64{} // key -> offset the server acknowledged
		pending    = make([]*batch, producers)
		nextSeq    = make([]int, producers)
		maxAcked   uint64 // highest acknowledged cursor commit
		commitSent = map[uint64]bool{}
	)
	newBatch := func(p int, r *rand.Rand) *batch {
		b := &batch{}
		for i := 0; i < 1+r.Intn(10); i++ {
			b.keys = append(b.keys, fmt.Sprintf("p%d-%d", p, nextSeq[p]))
			nextSeq[p]++
		}
		return b
	}
	// appendBatch sends b; true when acknowledged (its offsets recorded).
	appendBatch := func(ctx context.Context, c *http.Client, b *batch, base string) bool {
		recs := make([]map[string]any, len(b.keys))
		for i, k := range b.keys {
			recs[i] = map[string]any{"body": map[string]any{"key": k}, "deduplicationKey": k}
		}
		status, reply, err := call(ctx, c, "POST", base+logPath+"/append", map[string]any{"records": recs})
		if err != nil || status != 200 {
			if status >= 400 && status < 500 {
				t.Errorf("append refused: %d %v", status, reply)
			}
			return false
		}
		offs, _ := reply["offsets"].([]any)
		if len(offs) != len(b.keys) {
			t.Errorf("append of %d records returned %v", len(b.keys), reply)
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		for i, k := range b.keys {
			off := uint64(offs[i].(float64))
			if prev, ok := ackedKeys[k]; ok && prev != off {
				t.Errorf("key %s acknowledged at %d, then at %d", k, prev, off)
			}
			ackedKeys[k] = off
		}
		return true
	}

	for round := 0; round <= rounds; round++ {
		final := round == rounds
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for p := 0; p < producers; p++ {
			wg.Add(1)
			go func(p int, r *rand.Rand) {
				defer wg.Done()
				c := &http.Client{Timeout: 5 * time.Second}
				for ctx.Err() == nil {
					mu.Lock()
					if pending[p] == nil {
						if final {
							mu.Unlock()
							return // the last round only finishes what is pending
						}
						pending[p] = newBatch(p, r)
					}
					b := pending[p]
					mu.Unlock()
					if appendBatch(ctx, c, b, tgt.url(r)) {
						mu.Lock()
						pending[p] = nil
						mu.Unlock()
					} else if ctx.Err() == nil {
						time.Sleep(10 * time.Millisecond)
					}
				}
			}(p, rand.New(rand.NewSource(rng.Int63())))
		}
		wg.Add(1)
		go func(r *rand.Rand) { // a consumer committing its cursor forward
			defer wg.Done()
			c := &http.Client{Timeout: 5 * time.Second}
			for ctx.Err() == nil && !final {
				mu.Lock()
				target := maxAcked + uint64(r.Intn(5))
				limit := uint64(len(ackedKeys))
				mu.Unlock()
				target = min(target, limit)
				mu.Lock()
				commitSent[target] = true
				mu.Unlock()
				status, reply, err := call(ctx, c, "PUT", tgt.url(r)+logPath+"/cursors/indexer", map[string]any{"offset": target})
				if err == nil && status == 200 {
					mu.Lock()
					maxAcked = max(maxAcked, uint64(reply["offset"].(float64)))
					mu.Unlock()
				}
				time.Sleep(5 * time.Millisecond)
			}
		}(rand.New(rand.NewSource(rng.Int63())))
		if final {
			wg.Wait()
			cancel()
		} else {
			time.Sleep(time.Duration(300+rng.Intn(1200)) * time.Millisecond)
			tgt.fault(t, rng)
			cancel()
			wg.Wait()
			mu.Lock()
			t.Logf("round %d: killed with %d keys acknowledged", round, len(ackedKeys))
			mu.Unlock()
			continue
		}

		// Verify on the last server (a node of the cluster).
		base := tgt.url(rng)
		// A generous timeout: the first read activates the log after the last
		// restart, on a machine that may be running other suites meanwhile.
		c := &http.Client{Timeout: 30 * time.Second}
		seen := map[string]uint64{}
		var next uint64
		for {
			readStart := time.Now()
			status, reply, err := callSettled(c, "GET", fmt.Sprintf("%s%s/records?from=%d&limit=100", base, logPath, next))
			if took := time.Since(readStart); took > 2*time.Second {
				t.Logf("read from %d took %v", next, took)
			}
			if err != nil || status != 200 {
				t.Fatalf("read from %d: %d %v %v", next, status, reply, err)
			}
			recs := reply["records"].([]any)
			for _, x := range recs {
				rec := x.(map[string]any)
				off := uint64(rec["offset"].(float64))
				if off != next {
					t.Fatalf("offset %d after %d: not contiguous", off, next-1)
				}
				key := rec["deduplicationKey"].(string)
				if body := rec["body"].(map[string]any); body["key"] != key {
					t.Fatalf("record %d: body %v for key %s", off, body, key)
				}
				if prev, dup := seen[key]; dup {
					t.Fatalf("key %s at offsets %d and %d", key, prev, off)
				}
				seen[key] = off
				next++
			}
			if len(recs) == 0 {
				break
			}
		}
		for k, off := range ackedKeys {
			if got, ok := seen[k]; !ok || got != off {
				t.Fatalf("acknowledged key %s at %d; the log has it at %d (present %v)", k, off, got, ok)
			}
		}
		// Every key ever issued was acknowledged by the end (pending batches were
		// retried until they were), so the log holds exactly those keys.
		if len(seen) != len(ackedKeys) {
			t.Fatalf("the log has %d records, %d keys were acknowledged", len(seen), len(ackedKeys))
		}
		status, reply, err := callSettled(c, "GET", base+logPath+"/cursors/indexer")
		if err != nil || status != 200 {
			t.Fatalf("cursor: %d %v %v", status, reply, err)
		}
		cur := uint64(reply["offset"].(float64))
		if cur < maxAcked || !commitSent[cur] {
			t.Fatalf("cursor %d: the highest acknowledged commit was %d", cur, maxAcked)
		}
		t.Logf("%d records, contiguous, each once; cursor %d (highest acknowledged commit %d)", len(seen), cur, maxAcked)
		tgt.close(t)
	}
}
