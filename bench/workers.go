package main

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast"
)

// errDry tells runWorkers (and serverLoop) that a worker found nothing left to
// consume.
var errDry = errors.New("nothing left to consume")

// interval is what runWorkers measured.
type interval struct {
	ops     int64         // operations completed within the interval
	elapsed time.Duration // the interval's length
	note    string        // set when the interval ended early
}

// runWorkers runs n goroutines, each repeating op (one call in flight each)
// for d, and returns what completed within d. op returns how many operations
// a call completed; errDry ends the interval at once (measured up to then,
// and the note says so); any other error fails the run.
func runWorkers(n int, d time.Duration, op func(w int) (int64, error)) (interval, error) {
	var ops atomic.Int64
	var failed atomic.Value
	var stop atomic.Bool
	dry := make(chan struct{})
	var dryOnce sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				k, err := op(w)
				if errors.Is(err, errDry) {
					dryOnce.Do(func() { close(dry) })
					return
				}
				if err != nil {
					failed.Store(err)
					return
				}
				ops.Add(k)
			}
		}()
	}
	var iv interval
	select {
	case <-time.After(d):
	case <-dry:
		iv.note = fmt.Sprintf("ran out of records after %v of %v: measured over that", time.Since(start).Round(time.Millisecond), d)
	}
	iv.ops, iv.elapsed = ops.Load(), time.Since(start)
	stop.Store(true)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return interval{}, err
	}
	return iv, nil
}

// inParallel calls f(i) for every i below n, 64 calls at a time, and returns
// the first error. (Not an atomic.Value: it panics when errors of two
// concrete types are stored.)
func inParallel(n int, f func(i int) error) error {
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var first sync.Once
	var failed error
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				first.Do(func() { failed = err })
			}
		}()
	}
	wg.Wait()
	return failed
}

func (iv interval) perSec() float64 { return float64(iv.ops) / iv.elapsed.Seconds() }

// cycleResult is the result of a run of consume cycles (lease+ack,
// receive+ack) on rt: cycles per second, commits per cycle since commits0, and
// the costs m measured; a cycle writes no payload.
func cycleResult(rt *holdfast.Runtime, commits0 uint64, m meter, iv interval, err error) (result, error) {
	if err != nil {
		return result{}, err
	}
	r := result{OpsPerSec: iv.perSec(), Note: iv.note}
	if iv.ops > 0 {
		r.SyncsPerWrite = float64(rt.Node().Stats().Pipeline.Commits-commits0) / float64(iv.ops)
	}
	m.stop(&r, iv.ops)
	r.PayloadBytes = 0
	return r, nil
}
