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

// TestCrash_LeasesSurviveSIGKILL: 16 pollers lease and ack one consumer's
// ranges (2 s leases) while the server is SIGKILLed and restarted; some first
// deliveries are abandoned on purpose (never acked) so that they expire. Each
// kill lands while several leases are held, and the server stays down longer
// each round (about 0, 1.1 and 2.2 s), so that held leases outlive the restart
// in the first rounds and expire during it in the last. After each restart,
// before anyone leases again, every lease known to be held at the kill is listed
// under the same batch id and deadline: active if the deadline is still ahead,
// expired if it has passed (only a lease whose deadline passed before the kill
// may have been reclaimed). The held ones are then acked by their holder and
// every ack holds, except half the expired ones, which are abandoned too. Every
// redelivery comes after the deadline of the range's previous lease, and every
// abandoned range is redelivered. At the end every offset was acked exactly once
// and the cursor is at nextOffset.
func TestCrash_LeasesSurviveSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test starts server processes")
	}
	const (
		records, batchSize, pollers, rounds = 8000, 20, 16, 3
		leaseMillis                         = 2000
		abandonOneIn                        = 20 // first deliveries given up on purpose
		minHeldAtKill                       = 6
	)
	cfgFile, dataDir, rng := crashSetup(t, fmt.Sprintf(`  jobs:
    log:
      maxBatchSize: %d
      leases: {maxParallelism: 48, leaseDuration: %dms}
`, batchSize, leaseMillis))
	const logPath = "/api/v1/logs/app_crash/jobs/j1"

	type lease struct {
		batchID     string
		first, last uint64
		attempt     int
		expiresAt   int64 // unix ms, as the server reported it
		acking      bool  // an ack was sent and its outcome is unknown
	}
	var (
		mu          sync.Mutex
		acked       = make([]int, records)
		holds       = map[string]*lease{} // leases pollers hold and will ack, by batch id
		abandoned   = map[string]lease{}  // leases given up on purpose
		last        = map[uint64]lease{}  // the latest lease the test saw, by first offset
		redelivered int                   // deliveries after the previous lease's deadline
		fenced      int                   // acks refused: the lease had expired and was reclaimed
		srvURL      string
		active      int // leases held at a kill and listed active after the restart
		expired     int // the same, listed expired: the server was down past their deadline
		givenUp     int // expired leases held across a kill and then abandoned
	)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: pollers}}
	srv := startServer(t, dataDir, cfgFile)
	srvURL = srv.url
	appendAll := make(chan int)
	var appenders sync.WaitGroup
	for a := 0; a < 4; a++ {
		appenders.Add(1)
		go func() {
			defer appenders.Done()
			for i := range appendAll {
				recs := make([]map[string]any, batchSize)
				for j := range recs {
					recs[j] = map[string]any{"body": i + j}
				}
				if status, reply, err := call(context.Background(), c, "POST", srvURL+logPath+"/append", map[string]any{"records": recs}); err != nil || status != 200 {
					t.Errorf("append: %d %v %v", status, reply, err)
				}
			}
		}()
	}
	for i := 0; i < records; i += batchSize {
		appendAll <- i
	}
	close(appendAll)
	appenders.Wait()
	if t.Failed() {
		t.FailNow()
	}
	countAcked := func(l *lease) { // mu held
		for off := l.first; off <= l.last; off++ {
			acked[off]++
		}
	}
	// received records a lease a poller got; false when it breaks the rules.
	received := func(l lease) bool { // mu held
		prev, seen := last[l.first]
		last[l.first] = l
		switch {
		case !seen:
			return true // a first delivery, or one whose predecessors' replies were lost
		case l.attempt == 1 || l.attempt <= prev.attempt || l.batchID == prev.batchID || l.last != prev.last:
			t.Errorf("lease %+v after %+v of the same range", l, prev)
			return false
		case l.expiresAt-leaseMillis < prev.expiresAt:
			t.Errorf("range [%d,%d] redelivered at %d, before the deadline %d of batch %s", l.first, l.last, l.expiresAt-leaseMillis, prev.expiresAt, prev.batchID)
			return false
		}
		redelivered++
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
					status, reply, err := call(ctx, c, "POST", srvURL+logPath+"/consumers/c/lease", nil)
					if err != nil || status >= 500 {
						time.Sleep(10 * time.Millisecond) // outcome unknown: a lost lease expires
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
					if status != 200 {
						t.Errorf("lease: %d %v", status, reply)
						return
					}
					l := &lease{batchID: reply["batchId"].(string), first: uint64(reply["firstOffset"].(float64)),
						last: uint64(reply["lastOffset"].(float64)), attempt: int(reply["attempt"].(float64)), expiresAt: int64(reply["expiresAt"].(float64))}
					abandon := l.attempt == 1 && r.Intn(abandonOneIn) == 0
					mu.Lock()
					ok := received(*l)
					if abandon {
						abandoned[l.batchID] = *l
					} else {
						holds[l.batchID] = l
					}
					mu.Unlock()
					if !ok {
						return
					}
					if abandon {
						continue
					}
					select { // processing
					case <-ctx.Done():
						return
					case <-time.After(time.Duration(100+r.Intn(200)) * time.Millisecond):
					}
					mu.Lock()
					l.acking = true
					mu.Unlock()
					status, reply, err = call(ctx, c, "POST", srvURL+logPath+"/consumers/c/ack", map[string]any{"batchId": l.batchID})
					mu.Lock()
					switch {
					case err != nil || status >= 500: // unknown: settled after the restart
					case status == 200:
						countAcked(l)
						delete(holds, l.batchID)
					case status == 409: // it expired and was reclaimed
						fenced++
						delete(holds, l.batchID)
					default:
						t.Errorf("ack %s: %d %v", l.batchID, status, reply)
					}
					mu.Unlock()
				}
			}(rand.New(rand.NewSource(rng.Int63())))
		}
		if final {
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(time.Minute):
				cancel()
				<-done
				t.Fatalf("pollers did not finish")
			}
			cancel()
			if t.Failed() {
				t.FailNow()
			}
			break
		}
		// Kill at a random moment once several leases are held.
		time.Sleep(time.Duration(300+rng.Intn(700)) * time.Millisecond)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			n := len(holds)
			mu.Unlock()
			if n >= minHeldAtKill || time.Now().After(deadline) {
				break
			}
		}
		srv.kill(t)
		killed := time.Now()
		cancel()
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		// The server stays down longer each round, so that the leases held at the
		// kill are all ahead of their deadline at the restart in round 0, some in
		// round 1 and none in round 2.
		time.Sleep(time.Duration(round*leaseMillis*11/20+rng.Intn(300)) * time.Millisecond)
		srv = startServer(t, dataDir, cfgFile)
		srvURL = srv.url
		before := time.Now().UnixMilli()
		status, list, err := call(context.Background(), c, "GET", srvURL+logPath+"/consumers/c/leases", nil)
		after := time.Now().UnixMilli()
		if err != nil || status != 200 {
			t.Fatalf("leases: %d %v %v", status, list, err)
		}
		byID, byFirst := map[string]map[string]any{}, map[uint64]string{}
		for _, x := range list["leases"].([]any) {
			l := x.(map[string]any)
			byID[l["batchId"].(string)] = l
			byFirst[uint64(l["firstOffset"].(float64))] = l["batchId"].(string)
		}
		var ackLanded, reclaimed, roundActive, roundExpired int
		// check says whether l, known to be held at the kill, is listed as it must be;
		// false when it is not listed (allowed only if it expired before the kill).
		check := func(l lease, what string) bool {
			got, ok := byID[l.batchID]
			if !ok {
				if l.expiresAt > killed.UnixMilli() {
					t.Fatalf("round %d: %s lease %s [%d,%d] (deadline %d, killed at %d) is gone after the restart: %v",
						round, what, l.batchID, l.first, l.last, l.expiresAt, killed.UnixMilli(), list)
				}
				return false
			}
			state := got["state"]
			if int64(got["expiresAt"].(float64)) != l.expiresAt || uint64(got["firstOffset"].(float64)) != l.first || uint64(got["lastOffset"].(float64)) != l.last {
				t.Fatalf("round %d: %s lease %+v listed as %v after the restart", round, what, l, got)
			}
			switch {
			case l.expiresAt > after && state != "active":
				t.Fatalf("round %d: %s lease %s (deadline %d) is %s at %d after the restart", round, what, l.batchID, l.expiresAt, state, after)
			case l.expiresAt <= before && state != "expired":
				t.Fatalf("round %d: %s lease %s (deadline %d) is %s at %d after the restart", round, what, l.batchID, l.expiresAt, state, before)
			case state == "active":
				roundActive++
			case state == "expired":
				roundExpired++
			}
			return true
		}
		var carried []*lease
		mu.Lock()
		heldAtKill, abandonedAtKill := len(holds), 0
		ids := make([]string, 0, len(holds))
		for id := range holds {
			ids = append(ids, id)
		}
		for _, id := range ids {
			h := holds[id]
			delete(holds, id)
			if got, ok := byID[id]; ok && got["state"] == "settled" {
				if !h.acking {
					t.Fatalf("round %d: lease %s settled without an ack", round, id)
				}
				ackLanded++
				countAcked(h)
				continue
			}
			if !h.acking {
				if check(*h, "held") {
					carried = append(carried, h)
				} else {
					reclaimed++
				}
				continue
			}
			// An ack in flight at the kill: listed under its batch id, it did not land.
			if _, ok := byID[id]; ok {
				check(*h, "held")
				h.acking = false
				carried = append(carried, h)
				continue
			}
			switch other, ok := byFirst[h.first]; {
			case h.expiresAt > killed.UnixMilli(): // never fenced, so its ack settled it
				ackLanded++
				countAcked(h)
			case ok && other != id: // reclaimed before the kill: the ack was refused
				reclaimed++
			case acked[h.first] == 0: // settled by the one ack that could land
				ackLanded++
				countAcked(h)
			default:
				reclaimed++
			}
		}
		for _, a := range abandoned {
			if last[a.first].batchID == a.batchID { // not redelivered yet
				abandonedAtKill++
				check(a, "abandoned")
			}
		}
		mu.Unlock()
		// Each lease still held is acked by its holder; no one has leased since the
		// restart, so even an expired one is still theirs. Half the expired ones
		// are given up instead, to be redelivered.
		for _, h := range carried {
			if h.expiresAt <= before && rng.Intn(2) == 0 {
				mu.Lock()
				abandoned[h.batchID] = *h
				givenUp++
				mu.Unlock()
				continue
			}
			status, reply, err := call(context.Background(), c, "POST", srvURL+logPath+"/consumers/c/ack", map[string]any{"batchId": h.batchID})
			if err != nil || status != 200 {
				t.Fatalf("round %d: ack of %s, held across the restart: %d %v %v", round, h.batchID, status, reply, err)
			}
			mu.Lock()
			countAcked(h)
			mu.Unlock()
		}
		t.Logf("round %d: killed holding %d leases and %d abandoned ones; restarted after %v; %d acks landed before the kill, %d leases reclaimed before it; listed after it: %d active, %d expired",
			round, heldAtKill, abandonedAtKill, time.UnixMilli(before).Sub(killed).Round(time.Millisecond), ackLanded, reclaimed, roundActive, roundExpired)
		active += roundActive
		expired += roundExpired
	}
	mu.Lock()
	defer mu.Unlock()
	for off, k := range acked {
		if k != 1 {
			t.Fatalf("offset %d acked %d times", off, k)
		}
	}
	for _, a := range abandoned {
		if l := last[a.first]; l.batchID == a.batchID {
			t.Fatalf("abandoned lease %+v was never redelivered", a)
		}
	}
	if active == 0 || expired == 0 {
		t.Fatalf("leases held across a kill: %d listed active after the restart, %d expired; want some of each", active, expired)
	}
	if len(abandoned) == 0 || redelivered < len(abandoned) {
		t.Fatalf("%d leases abandoned, %d redeliveries after expiry", len(abandoned), redelivered)
	}
	_, cur, _ := call(context.Background(), c, "GET", srvURL+logPath+"/cursors/c", nil)
	if cur["offset"] != float64(records) {
		t.Fatalf("cursor %v, want %d", cur, records)
	}
	t.Logf("%d offsets acked once each; %d leases abandoned (%d of them after a restart), %d redeliveries after expiry, %d acks fenced", records, len(abandoned), givenUp, redelivered, fenced)
	srv.kill(t)
}
