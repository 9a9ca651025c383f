package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// The test server's push type: when HOLDFAST_TEST_PUSH_LOG names a file, the
// type "pushjobs" has a push handler that appends "id attempt" to it, synced,
// before it acks.
func init() {
	path := os.Getenv("HOLDFAST_TEST_PUSH_LOG")
	if path == "" {
		return
	}
	var mu sync.Mutex
	goTypes = append(goTypes, actors.TypeSpec{Name: "pushjobs", Queue: []actors.QueueHandler{{
		Handle: func(ctx context.Context, m actors.QueueDelivery) (actors.QueueResult, error) {
			time.Sleep(2 * time.Millisecond) // deliveries are in flight when the server is killed
			mu.Lock()
			defer mu.Unlock()
			f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
			if err != nil {
				return actors.QueueResult{}, err
			}
			defer f.Close()
			if _, err := fmt.Fprintf(f, "%s %d\n", m.ID, m.Attempt); err != nil {
				return actors.QueueResult{}, err
			}
			return actors.QueueResult{}, f.Sync()
		},
	}}})
}

// TestCrash_QueueLosesNothing: producers enqueue with ids into a pull queue and
// a push queue while pull consumers receive and ack, and the server is
// SIGKILLed and restarted three times; producers retry unacknowledged enqueues
// with the same ids. At the end every acknowledged message is complete, each
// pull message was acked by a receipt that held, every push message reached
// the handler, nothing else is in the queues, and the start replays report no
// errors. (An ack whose reply was lost to a kill may have held: such a message
// may be complete with no acknowledged ack.)
func TestCrash_QueueLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test starts server processes")
	}
	cfgFile, dataDir, rng := crashSetup(t, queueCrashTypes)
	pushLog := filepath.Join(t.TempDir(), "pushed")
	t.Setenv("HOLDFAST_TEST_PUSH_LOG", pushLog)
	runQueueCrash(t, newSingleTarget(t, dataDir, cfgFile), rng, pushLog, true)
}

// queueCrashTypes configures the queue crash test's types: a pull queue and a
// push queue with short visibility timeouts and backoffs.
const queueCrashTypes = `  jobs:
    queue: {visibilityTimeout: 2s, backoff: {initial: 100ms, multiplier: 2, max: 1s}, maxAttempts: 1000, concurrency: 4}
  pushjobs:
    queue: {visibilityTimeout: 2s, backoff: {initial: 100ms, multiplier: 2, max: 1s}, maxAttempts: 1000, concurrency: 4}
`

// runQueueCrash is the queue's crash checker: producers enqueue with ids
// (retrying until acknowledged), pull consumers receive and ack, push handlers
// take the other queue, while tgt is killed three times; at the end every
// message is complete, each pull message acked once by a receipt that held (or
// one whose reply was lost), each push message handled. checkReplay also
// requires a replay at start to have put back deliveries in flight.
func runQueueCrash(t *testing.T, tgt crashTarget, rng *rand.Rand, pushLog string, checkReplay bool) {
	c := &http.Client{Timeout: 10 * time.Second}
	ctx := context.Background()
	const jobs, pushjobs = "/api/v1/queues/app_crash/jobs/q", "/api/v1/queues/app_crash/pushjobs/q"
	url := func() string { return tgt.url(nil) }

	const producers, perProducer = 4, 300
	var mu sync.Mutex
	enqueued := map[string]string{} // id -> queue path, once acknowledged
	pulled := map[string]int{}      // id -> acks that held
	ackLost := map[string]bool{}    // id -> an ack whose reply was lost (it may have held)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perProducer {
				path := jobs
				if i%2 == 1 {
					path = pushjobs
				}
				id := fmt.Sprintf("p%d-%d", p, i)
				for try := 0; ; try++ { // the same id until acknowledged
					st, _, err := call(ctx, c, "POST", url()+path+"/messages", map[string]any{"messages": []map[string]any{{"id": id, "payload": i}}})
					if err == nil && st == 200 {
						break
					}
					if try > 2000 {
						t.Errorf("enqueue %s never acknowledged", id)
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
				mu.Lock()
				enqueued[id] = path
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	stopConsumers := make(chan struct{})
	var cwg sync.WaitGroup
	for range 4 {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			for {
				select {
				case <-stopConsumers:
					return
				default:
				}
				st, reply, err := call(ctx, c, "POST", url()+jobs+"/receive", map[string]any{"max": 10, "waitMs": 200})
				if err != nil || st != 200 {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				msgs, _ := reply["messages"].([]any)
				time.Sleep(5 * time.Millisecond) // hold the deliveries a while
				for _, m := range msgs {
					mm := m.(map[string]any)
					st, reply, err := call(ctx, c, "POST", url()+jobs+"/ack", map[string]any{"receipts": []any{mm["receipt"]}})
					mu.Lock()
					switch {
					case err == nil && st == 200 && reply["acked"] == float64(1):
						pulled[mm["id"].(string)]++
					case err != nil || st >= 500:
						ackLost[mm["id"].(string)] = true
					}
					mu.Unlock()
				}
			}
		}()
	}

	// Three kills while producers and consumers run: when a fifth, two
	// fifths and three fifths of the messages were enqueued, give or take.
	var replays []map[string]any
	for k := range 3 {
		goal := (k + 1) * producers * perProducer / 5
		goal += rng.Intn(producers * perProducer / 10)
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			mu.Lock()
			n := len(enqueued)
			mu.Unlock()
			if n >= goal {
				break
			}
		}
		srv := tgt.fault(t, rng)
		var sum map[string]any
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			st, reply, err := call(ctx, c, "GET", srv.url+"/api/v1/admin/replay", nil)
			if err == nil && st == 200 {
				sum = reply
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no replay summary: %d %v %v", st, reply, err)
			}
		}
		replays = append(replays, sum)
	}
	wg.Wait()

	// Everything drains: pull consumers go on, push handlers go on.
	drained := func(path string) bool {
		st, s, err := call(ctx, c, "GET", url()+path+"/stats", nil)
		return err == nil && st == 200 && s["pending"] == float64(0) && s["delayed"] == float64(0) && s["processing"] == float64(0) && s["failed"] == float64(0)
	}
	for deadline := time.Now().Add(60 * time.Second); !(drained(jobs) && drained(pushjobs)); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			_, s1, _ := call(ctx, c, "GET", url()+jobs+"/stats", nil)
			_, s2, _ := call(ctx, c, "GET", url()+pushjobs+"/stats", nil)
			t.Fatalf("the queues did not drain: jobs %v, pushjobs %v", s1, s2)
		}
	}
	close(stopConsumers)
	cwg.Wait()

	pushed := map[string]bool{}
	f, err := os.Open(pushLog)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		id, _, _ := strings.Cut(sc.Text(), " ")
		pushed[id] = true
	}
	f.Close()

	if len(enqueued) != producers*perProducer {
		t.Fatalf("%d of %d enqueues acknowledged", len(enqueued), producers*perProducer)
	}
	var pullN, pushN int
	for id, path := range enqueued {
		st, m, err := callSettled(c, "GET", url()+path+"/messages/"+id)
		if err != nil || st != 200 {
			t.Fatalf("message %s: %d %v %v (lost)", id, st, m, err)
		}
		if p := m["targets"].(map[string]any)["default"].(map[string]any); p["state"] != "complete" {
			t.Errorf("message %s in %s: %v", id, path, p)
		}
		if path == jobs {
			pullN++
			if pulled[id] < 1 && !ackLost[id] {
				t.Errorf("message %s complete without an ack that held (or whose reply was lost)", id)
			}
		} else {
			pushN++
			if !pushed[id] {
				t.Errorf("message %s complete without reaching the push handler", id)
			}
		}
	}
	for id, n := range pulled {
		if n > 1 {
			t.Errorf("message %s acked %d times with receipts that held", id, n)
		}
	}
	_, s1, _ := call(ctx, c, "GET", url()+jobs+"/stats", nil)
	_, s2, _ := call(ctx, c, "GET", url()+pushjobs+"/stats", nil)
	if s1["complete"] != float64(pullN) || s2["complete"] != float64(pushN) {
		t.Errorf("complete counts %v / %v, want %d / %d", s1["complete"], s2["complete"], pullN, pushN)
	}
	recovered := 0.0
	for _, r := range replays {
		if errs, _ := r["errors"].([]any); len(errs) != 0 {
			t.Errorf("replay errors: %v", r)
		}
		recovered += r["recovered"].(float64)
	}
	if recovered == 0 && checkReplay {
		t.Errorf("no replay put back a delivery: the kills found none in flight")
	}
	b, _ := json.Marshal(replays)
	t.Logf("%d pull and %d push messages; %d pushes logged; replays %s (%v recovered in all)", pullN, pushN, len(pushed), b, recovered)
}
