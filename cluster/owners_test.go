package cluster

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// goroutinesWith counts the goroutines whose stack mentions s.
func goroutinesWith(s string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte(s)) {
			count++
		}
	}
	return count
}

// A call given up by its caller leaves no goroutine waiting for the reply, and
// a transport's stop cancels the requests of other nodes it runs and waits for
// them: every goroutine of the transport has an owner.
func TestTransport_CallsAndServedRequestsAreOwned(t *testing.T) {
	log := testLogger(t)
	entered := make(chan struct{}, 1)
	var returned atomic.Bool
	var cause atomic.Value
	blocking := func(ctx context.Context, req *wireRequest) *wireReply {
		if req.Op == opPing {
			return &wireReply{}
		}
		entered <- struct{}{}
		<-ctx.Done()
		cause.Store(ctx.Err())
		time.Sleep(20 * time.Millisecond) // a stop that does not wait returns first
		returned.Store(true)
		return &wireReply{}
	}
	b, err := startTransport("127.0.0.1:0", "", blocking, nil, func(*wireRequest) {}, log)
	if err != nil {
		t.Fatal(err)
	}
	a, err := startTransport("127.0.0.1:0", "", blocking, nil, func(*wireRequest) {}, log)
	if err != nil {
		b.stop()
		t.Fatal(err)
	}
	defer a.stop()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := a.call(ctx, NodeInfo{ID: "b", Addr: b.addr}, &wireRequest{Op: opObject, From: "a"})
		done <- err
	}()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the request did not reach the other transport")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a call whose ctx ended: %v", err)
	}
	if n := goroutinesWith("cluster.(*transport).call"); n != 0 {
		t.Fatalf("%d goroutines of a call that returned are still running", n)
	}

	b.stop()
	if !returned.Load() {
		t.Fatal("stop returned before the request it was serving did")
	}
	if err, _ := cause.Load().(error); !errors.Is(err, context.Canceled) {
		t.Fatalf("the served request's context ended with %v, want context.Canceled", err)
	}
}
