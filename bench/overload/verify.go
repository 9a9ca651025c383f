package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"
)

// acks is every acknowledged write of the run, and the increments of unknown
// outcome, merged from the writers' logs.
type acks struct {
	ackedIncr, uncertainIncr map[int]int
	big                      []bigWrite
}

func mergeAcks(logs ...[]*writerLog) *acks {
	a := &acks{ackedIncr: map[int]int{}, uncertainIncr: map[int]int{}}
	for _, ls := range logs {
		for _, w := range ls {
			for o, n := range w.ackedIncr {
				a.ackedIncr[o] += n
			}
			for o, n := range w.uncertainIncr {
				a.uncertainIncr[o] += n
			}
			a.big = append(a.big, w.big...)
		}
	}
	return a
}

// verifyResult is one read-back of everything acknowledged.
type verifyResult struct {
	Counters, Slots int      // checked
	Problems        []string // lost, wrong or phantom writes, one line each
	Unreadable      []string // reads that got no answer in time (not counted as lost)
	Refusals        int      // reads refused (503/429) and retried
	Took            time.Duration
}

// verify reads every object a write was acknowledged on, with readers
// goroutines, retrying refused reads after their retryAfterMs for up to
// perKey each (reads are safe to retry), and giving up on every read once
// total has passed (a node that refuses new activations for good would
// otherwise keep the check going for perKey times the keys).
func verify(c *client, a *acks, vals *values, readers int, perKey, total time.Duration) verifyResult {
	start := time.Now()
	end := start.Add(total)
	type job struct {
		counter int // -1 for a large slot
		big     bigWrite
	}
	jobs := make(chan job)
	var (
		mu  sync.Mutex
		res verifyResult
		wg  sync.WaitGroup
	)
	for range readers {
		wg.Go(func() {
			for j := range jobs {
				var path string
				if j.counter >= 0 {
					path = fmt.Sprintf("/api/v1/objects/%s/counter/c%d/n", c.app.ID, j.counter)
				} else {
					path = fmt.Sprintf("/api/v1/objects/%s/big/%s/v", c.app.ID, j.big.Key)
				}
				status, body, refusals := readRetrying(c, path, min(perKey, time.Until(end)))
				var problem string
				switch {
				case status != 200 && status != 404:
					problem = fmt.Sprintf("%s: no answer (last status %d after %d refusals)", path, status, refusals)
				case j.counter >= 0:
					got, err := counterValue(body)
					if status == 200 && err != nil {
						problem = fmt.Sprintf("%s: %v", path, err)
					} else if v := counterVerdict(a.ackedIncr[j.counter], a.uncertainIncr[j.counter], got, status == 200); v != "" {
						problem = path + ": " + v
					}
				default:
					if v := slotVerdict(vals.value(j.big.Key, j.big.N), body, status == 200); v != "" {
						problem = path + ": " + v
					}
				}
				mu.Lock()
				res.Refusals += refusals
				if j.counter >= 0 {
					res.Counters++
				} else {
					res.Slots++
				}
				switch {
				case problem == "":
				case status != 200 && status != 404:
					res.Unreadable = append(res.Unreadable, problem)
				default:
					res.Problems = append(res.Problems, problem)
				}
				mu.Unlock()
			}
		})
	}
	objs := make([]int, 0, len(a.ackedIncr)+len(a.uncertainIncr))
	for o := range a.ackedIncr {
		objs = append(objs, o)
	}
	for o := range a.uncertainIncr {
		if _, ok := a.ackedIncr[o]; !ok {
			objs = append(objs, o)
		}
	}
	sort.Ints(objs)
	for _, o := range objs {
		jobs <- job{counter: o}
	}
	for _, b := range a.big {
		jobs <- job{counter: -1, big: b}
	}
	close(jobs)
	wg.Wait()
	sort.Strings(res.Problems)
	sort.Strings(res.Unreadable)
	res.Took = time.Since(start)
	return res
}

// readRetrying GETs path until it gets a 200 or a 404, waiting out refusals
// (their retryAfterMs) and failures (a second), for at most budget (at
// least one request is made, even with no budget left).
func readRetrying(c *client, path string, budget time.Duration) (status int, body []byte, refusals int) {
	deadline := time.Now().Add(budget)
	for {
		var h http.Header
		status, body, h = c.do(context.Background(), "GET", path, nil)
		if status == 200 || status == 404 {
			return status, body, refusals
		}
		if classify(status) == refused {
			refusals++
		}
		if !time.Now().Before(deadline) {
			return status, body, refusals
		}
		wait := time.Second
		if classify(status) == refused {
			if ms, ok, _ := retryAfter(body, h.Get("Retry-After")); ok {
				wait = time.Duration(ms) * time.Millisecond
			}
		}
		time.Sleep(min(wait, time.Until(deadline)+time.Millisecond))
	}
}

// counterValue reads {"value": N} of GET /{slot}.
func counterValue(body []byte) (int64, error) {
	var r struct {
		Value any `json:"value"`
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if err := d.Decode(&r); err != nil {
		return 0, fmt.Errorf("the reply is not {\"value\": N}: %v", err)
	}
	n, ok := r.Value.(json.Number)
	if !ok {
		return 0, fmt.Errorf("the counter is not a number: %v", r.Value)
	}
	v, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the counter is not an integer: %s", n)
	}
	return v, nil
}
