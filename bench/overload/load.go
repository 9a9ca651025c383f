package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// client calls one server's REST API as the app it created.
type client struct {
	http *http.Client
	url  string
	app  appCreds
}

// do sends one request and reads the whole reply. status 0 means no reply (a
// timeout, a dropped connection): the outcome of a write is then unknown.
func (c *client) do(ctx context.Context, method, path string, body []byte) (status int, reply []byte, h http.Header) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url+path, rd)
	if err != nil {
		return 0, nil, nil
	}
	req.Header.Set("X-App-Key", c.app.Key)
	req.Header.Set("X-App-Secret", c.app.Secret)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, nil
	}
	defer resp.Body.Close()
	reply, err = io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, nil
	}
	return resp.StatusCode, reply, resp.Header
}

// reply is one write's record.
type reply struct {
	At        time.Duration // when it was sent, since the run started
	Latency   time.Duration
	Status    int // 0: no reply
	Class     class
	HasMs     bool // a refusal whose body has retryAfterMs
	HasHeader bool // a refusal with a Retry-After header
}

// bigWrite is an acknowledged large write: its key and its value's length
// (the value itself is rebuilt from them, values.value).
type bigWrite struct {
	Key string
	N   int
}

// writerLog is what one writer did; only its writer touches it until the
// phase is over.
type writerLog struct {
	replies []reply
	// Counter writers: acknowledged and unknown-outcome increments per object.
	ackedIncr, uncertainIncr map[int]int
	// Large-value writers: the acknowledged writes.
	big []bigWrite
}

// load is the settings of the two groups of writers.
type load struct {
	c              *client
	start          time.Time // of the run
	objects        int       // counters of the baseline group
	minLen, maxLen int       // of a large value
	vals           *values
	refusalBackoff time.Duration // a refusal without retryAfterMs waits this long
}

// phase runs baseline counter writers and over large-value writers for d,
// then stops them (each finishes the request it has in flight) and returns
// their logs. seed makes the phase's keys its own.
func (l *load) phase(baseline, over int, d time.Duration, seed uint64) (base, big []*writerLog) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range baseline {
		w := &writerLog{ackedIncr: map[int]int{}, uncertainIncr: map[int]int{}}
		base = append(base, w)
		wg.Go(func() { l.counterWriter(w, rand.New(rand.NewPCG(seed, uint64(i))), stop) })
	}
	for i := range over {
		w := &writerLog{}
		big = append(big, w)
		prefix := fmt.Sprintf("p%d-w%03d", seed, i)
		wg.Go(func() { l.bigWriter(w, prefix, rand.New(rand.NewPCG(seed, uint64(1000+i))), stop) })
	}
	t := time.NewTimer(d)
	<-t.C
	close(stop)
	wg.Wait()
	return base, big
}

func (l *load) counterWriter(w *writerLog, rng *rand.Rand, stop <-chan struct{}) {
	body := []byte(`{"by":1}`)
	for !stopped(stop) {
		obj := rng.IntN(l.objects)
		path := fmt.Sprintf("/api/v1/objects/%s/counter/c%d/n/increment", l.c.app.ID, obj)
		r, wait := l.write(path, "POST", body)
		w.replies = append(w.replies, r)
		switch {
		case r.Class == acked:
			w.ackedIncr[obj]++
		case r.Status >= 400 && r.Status < 500:
			// A 4xx wrote nothing.
		default:
			w.uncertainIncr[obj]++
		}
		sleep(wait, stop)
	}
}

func (l *load) bigWriter(w *writerLog, prefix string, rng *rand.Rand, stop <-chan struct{}) {
	for seq := 0; !stopped(stop); seq++ {
		// A fresh key each time, a refused write's included: a 5xx's outcome
		// is unknown, and a retry of the same key would need its idempotency key.
		key := fmt.Sprintf("%s-%06d", prefix, seq)
		n := l.minLen + rng.IntN(l.maxLen-l.minLen+1)
		v := l.vals.value(key, n)
		body := make([]byte, 0, n+16)
		body = append(body, `{"value":"`...)
		body = append(body, v...)
		body = append(body, `"}`...)
		r, wait := l.write(fmt.Sprintf("/api/v1/objects/%s/big/%s/v", l.c.app.ID, key), "PUT", body)
		w.replies = append(w.replies, r)
		if r.Class == acked {
			w.big = append(w.big, bigWrite{Key: key, N: n})
		}
		sleep(wait, stop)
	}
}

// write sends one write and returns its record and how long the writer waits
// before its next one: the refusal's retryAfterMs.
func (l *load) write(path, method string, body []byte) (reply, time.Duration) {
	sent := time.Now()
	status, b, h := l.c.do(context.Background(), method, path, body)
	r := reply{At: sent.Sub(l.start), Latency: time.Since(sent), Status: status, Class: classify(status)}
	var wait time.Duration
	switch r.Class {
	case refused:
		ms, ok, hdr := retryAfter(b, h.Get("Retry-After"))
		r.HasMs, r.HasHeader = ok, hdr
		wait = time.Duration(ms) * time.Millisecond
		if !ok {
			wait = l.refusalBackoff
		}
	case other:
		if status == 0 {
			wait = 100 * time.Millisecond // no reply: do not spin on a dead server
		}
	}
	return r, wait
}

func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

func sleep(d time.Duration, stop <-chan struct{}) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
}
