package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestCrash_AlarmsDueDuringDowntimeFireAfterRestart: alarms (trim actions on
// logs) are scheduled concurrently while the server is SIGKILLed; they fall due
// while it is down. After the restart every alarm whose schedule was
// acknowledged fires (its log is trimmed and the alarm is gone), and no alarm is
// left pending, acknowledged or not. A second kill lands while alarms fire.
func TestCrash_AlarmsDueDuringDowntimeFireAfterRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test starts server processes")
	}
	const logs = 40
	cfgFile, dataDir, rng := crashSetup(t, `  events:
    log:
      maxBatchSize: 100
      retention: {maxRecords: 1, trimEvery: 0s}
`)
	c := &http.Client{Timeout: 10 * time.Second}
	ctx := context.Background()
	logPath := func(i int) string { return fmt.Sprintf("/api/v1/logs/app_crash/events/l%d", i) }
	alarmPath := func(i int) string { return fmt.Sprintf("/api/v1/alarms/app_crash/events/l%d/compact", i) }

	srv := startServer(t, dataDir, cfgFile)
	for i := range logs {
		recs := []map[string]any{{"body": 1}, {"body": 2}, {"body": 3}}
		if st, reply, err := call(ctx, c, "POST", srv.url+logPath(i)+"/append", map[string]any{"records": recs}); err != nil || st != 200 {
			t.Fatalf("append: %d %v %v", st, reply, err)
		}
	}
	// Schedule every log's alarm 1.5s ahead, concurrently, and kill the server
	// partway through.
	at := time.Now().Add(1500 * time.Millisecond).UnixMilli()
	var mu sync.Mutex
	acked := map[int]bool{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < logs; i += 4 {
				st, _, err := call(ctx, c, "PUT", srv.url+alarmPath(i), map[string]any{"at": at, "action": map[string]any{"kind": "trim"}})
				if err == nil && st == 200 {
					mu.Lock()
					acked[i] = true
					mu.Unlock()
				}
			}
		}()
	}
	killAt := logs/4 + rng.Intn(logs/2) // after a quarter to three quarters were acknowledged
	for stop := time.Now().Add(20 * time.Second); time.Now().Before(stop); time.Sleep(time.Millisecond) {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= killAt {
			break
		}
	}
	srv.kill(t)
	wg.Wait()
	t.Logf("%d of %d schedules acknowledged before the kill", len(acked), logs)
	time.Sleep(time.Until(time.UnixMilli(at + 200))) // every alarm falls due while the node is down

	// The restart fires them; a second kill lands while they fire, and the third
	// start finishes the job.
	srv = startServer(t, dataDir, cfgFile)
	time.Sleep(time.Duration(rng.Intn(30)) * time.Millisecond)
	srv.kill(t)
	srv = startServer(t, dataDir, cfgFile)
	deadline := time.Now().Add(30 * time.Second)
	for i := range logs {
		for {
			st, bounds, err := call(ctx, c, "GET", srv.url+logPath(i)+"/bounds", nil)
			ast, alarm, aerr := call(ctx, c, "GET", srv.url+alarmPath(i), nil)
			if err != nil || aerr != nil || st != 200 {
				t.Fatalf("log %d: %d %v %v %v", i, st, bounds, err, aerr)
			}
			trimmed := bounds["hotOffset"] == float64(2)
			if ast == 404 && (trimmed || !acked[i]) {
				break // fired (or never scheduled)
			}
			if ast == 200 && alarm["status"] != "pending" {
				t.Fatalf("log %d: alarm %v", i, alarm)
			}
			if time.Now().After(deadline) {
				t.Fatalf("log %d (acknowledged %v): bounds %v, alarm %d %v", i, acked[i], bounds, ast, alarm)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
