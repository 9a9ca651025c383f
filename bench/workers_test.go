package main

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunWorkers(t *testing.T) {
	iv, err := runWorkers(4, 50*time.Millisecond, func(int) (int64, error) { time.Sleep(time.Millisecond); return 2, nil })
	if err != nil || iv.ops < 8 || iv.ops%2 != 0 || iv.elapsed < 50*time.Millisecond || iv.note != "" {
		t.Fatalf("plain run: %+v %v", iv, err)
	}
	var calls atomic.Int64
	iv, err = runWorkers(2, 10*time.Second, func(int) (int64, error) {
		if calls.Add(1) > 20 {
			return 0, errDry
		}
		return 1, nil
	})
	if err != nil || iv.elapsed > 5*time.Second || !strings.Contains(iv.note, "ran out") || iv.ops > 20 {
		t.Fatalf("a dry run must end early and say so: %+v %v", iv, err)
	}
	boom := errors.New("boom")
	if _, err := runWorkers(2, 20*time.Millisecond, func(w int) (int64, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("an error must fail the run: %v", err)
	}
}
