package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestCrash_FlushesSurviveSIGKILL appends to a log whose type flushes trimmed
// records to the cold store (cold/fs) in passes of 20 records. Each round lets
// several hundred records pile up hot, sends one trim (a flush of tens of
// passes), and SIGKILLs the server while that trim is in flight: once it has
// written a random number of its segments, before its reply. Each round records
// whether the kill hit the trim (at least one of its segments was written and
// its reply was lost to the kill); most rounds must. Finally one trim flushes what is left and the whole log is read: every
// offset ever acknowledged is readable exactly once, from cold or hot, in order.
func TestCrash_FlushesSurviveSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test starts server processes")
	}
	const (
		rounds, batchSize, keepHot = 8, 20, 30
		minBacklog                 = 600 // hot records above the retention when a round's trim is sent
	)
	cfgFile, dataDir, rng := crashSetup(t, fmt.Sprintf(`  events:
    log:
      maxBatchSize: %d
      retention: {maxRecords: %d, trimEvery: 0s}
      cold: true
`, batchSize, keepHot))
	const logPath = "/api/v1/logs/app_crash/events/e1"
	b64 := base64.RawURLEncoding.EncodeToString
	segDir := filepath.Join(dataDir, "cold", "log", b64([]byte("app_crash")), b64([]byte("events")), b64([]byte("e1")))
	segments := func() int {
		names, _ := os.ReadDir(segDir)
		return len(names)
	}

	var (
		mu      sync.Mutex
		acked   = map[string]uint64{} // key -> acknowledged offset
		pending []string              // a batch whose reply was lost, retried as is
		seq     int
		hits    int // rounds whose kill hit the trim in flight
	)
	for round := 0; round <= rounds; round++ {
		srv := startServer(t, dataDir, cfgFile)
		base := srv.url
		final := round == rounds
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(1)
		go func(r *rand.Rand) { // the producer
			defer wg.Done()
			c := &http.Client{Timeout: 5 * time.Second}
			for ctx.Err() == nil {
				mu.Lock()
				if pending == nil {
					if final {
						mu.Unlock()
						return
					}
					for i := 0; i < 1+r.Intn(batchSize); i++ {
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
		}(rand.New(rand.NewSource(rng.Int63())))
		c := &http.Client{Timeout: 30 * time.Second}
		if !final {
			// Let records pile up hot, then send one trim; the producer goes on.
			backlog := 0
			for deadline := time.Now().Add(20 * time.Second); backlog < minBacklog; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("round %d: %d records hot above the retention after 20 s", round, backlog)
				}
				if _, b, err := call(ctx, c, "GET", base+logPath+"/bounds", nil); err == nil && b["nextOffset"] != nil {
					backlog = int(b["nextOffset"].(float64)-b["hotOffset"].(float64)) - keepHot
				}
			}
			passes := backlog / batchSize
			segsBefore := segments()
			wrote, replied := make(chan struct{}), make(chan struct{})
			var once sync.Once
			var trimStatus int
			var trimErr error
			go func() {
				defer close(replied)
				tctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
					WroteRequest: func(httptrace.WroteRequestInfo) { once.Do(func() { close(wrote) }) },
				})
				trimStatus, _, trimErr = call(tctx, c, "POST", base+logPath+"/trim", nil)
			}()
			select {
			case <-wrote:
			case <-replied:
				t.Fatalf("round %d: the trim was not sent: %d %v", round, trimStatus, trimErr)
			}
			// Kill once the trim has written a random number of its segments (at most
			// half), at a random point of the pass that follows.
			target := segsBefore + 1 + rng.Intn(max(1, passes/2))
			for deadline := time.Now().Add(10 * time.Second); segments() < target && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if isClosed(replied) {
					break
				}
			}
			time.Sleep(time.Duration(rng.Intn(3000)) * time.Microsecond)
			written := segments() - segsBefore
			srv.kill(t)
			<-replied
			hit := trimErr != nil && written > 0 // the flush had begun and its reply was lost to the kill
			if hit {
				hits++
			}
			cancel()
			wg.Wait()
			mu.Lock()
			t.Logf("round %d: trim of %d hot records (%d passes) sent; killed after %d of its segments; hit the trim in flight: %v (reply %d %v); %d records acknowledged",
				round, backlog, passes, written, hit, trimStatus, trimErr, len(acked))
			mu.Unlock()
			continue
		}
		wg.Wait()
		cancel()
		if hits < rounds*3/4 {
			t.Fatalf("%d of %d kills hit a trim in flight", hits, rounds)
		}
		// One more trim flushes whatever a killed flush left pending.
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
		t.Logf("%d records readable once each from offset 0 (bounds %v); %d segments; %d of %d kills hit a trim in flight", len(seen), bounds, segments(), hits, rounds)
		if segments() == 0 {
			t.Fatal("nothing was flushed")
		}
		srv.kill(t)
	}
}

// isClosed reports whether ch is closed.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
