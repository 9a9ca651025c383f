package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// The transport between members (remote.go), two transports in this process.

// echo answers a request with its object's key as the reply's value.
func echo(_ context.Context, req *wireRequest) *wireReply {
	return &wireReply{Val: actors.WriteResult{}, Served: Served{Node: req.ID.Key}}
}

func startTestTransport(t *testing.T, serve handler, feed func(*wireRequest)) *transport {
	t.Helper()
	if feed == nil {
		feed = func(*wireRequest) {}
	}
	tr, err := startTransport("127.0.0.1:0", "", serve, nil, feed, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.stop)
	return tr
}

// Many callers on one connection each get their own reply.
func TestTransport_RepliesFindTheirCalls(t *testing.T) {
	b := startTestTransport(t, echo, nil)
	a := startTestTransport(t, echo, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				key := fmt.Sprintf("k%d-%d", g, i)
				reply, err := a.call(context.Background(), NodeInfo{Addr: b.addr}, &wireRequest{Op: opObject, ID: actors.ObjectID{App: "a", Type: "t", Key: key}})
				if err != nil {
					errs <- err
					return
				}
				if reply.Served.Node != key {
					errs <- fmt.Errorf("the call for %s got the reply for %s", key, reply.Served.Node)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// countingConn counts its writes; while hold is set, a write waits for it.
type countingConn struct {
	net.Conn
	writes atomic.Int64
	hold   chan struct{}
}

func (c *countingConn) Write(b []byte) (int, error) {
	if c.hold != nil {
		<-c.hold
	}
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// What is queued while the writer writes leaves in its next write: requests
// queued during one write cost one more system call between them, not one
// each.
func TestTransport_FramesQueuedMeanwhileShareAWrite(t *testing.T) {
	b := startTestTransport(t, echo, nil)
	a := startTestTransport(t, echo, nil)
	var cc *countingConn
	hold := make(chan struct{})
	a.wrapConn = func(nc net.Conn) net.Conn {
		cc = &countingConn{Conn: nc, hold: hold}
		return cc
	}
	const calls = 100
	var wg sync.WaitGroup
	var failed atomic.Value
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprint("k", i)
			reply, err := a.call(context.Background(), NodeInfo{Addr: b.addr}, &wireRequest{Op: opObject, ID: actors.ObjectID{App: "a", Type: "t", Key: key}})
			if err == nil && reply.Served.Node != key {
				err = fmt.Errorf("the call for %s got the reply for %s", key, reply.Served.Node)
			}
			if err != nil {
				failed.Store(err)
			}
		}()
	}
	// Every request queued (the first write, the preamble's and maybe a
	// few requests', is held).
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.mu.Lock()
		c := a.out[b.addr]
		a.mu.Unlock()
		n := 0
		if c != nil {
			c.mu.Lock()
			n = len(c.calls)
			c.mu.Unlock()
		}
		if n == calls {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls queued after 10s", n, calls)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(hold)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	// A probe may add a write of its own on a slow machine.
	if w := cc.writes.Load(); w < 2 || w > 3 {
		t.Fatalf("%d calls queued during a write left in %d writes, want 2 (the held one, then the rest)", calls, w)
	}
}

// One-way messages to one member arrive in the order they were sent.
func TestTransport_SendsArriveInOrder(t *testing.T) {
	var mu sync.Mutex
	var got []uint64
	b := startTestTransport(t, echo, func(w *wireRequest) {
		mu.Lock()
		got = append(got, w.Feed.Seq)
		mu.Unlock()
	})
	a := startTestTransport(t, echo, nil)
	const n = 2000
	for i := range uint64(n) {
		a.send(b.addr, &wireRequest{Op: opFeed, Feed: &feedMsg{Seq: i}})
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		k := len(got)
		mu.Unlock()
		if k == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages arrived after 10s", k, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i, s := range got {
		if s != uint64(i) {
			t.Fatalf("message %d arrived as the %dth", s, i)
		}
	}
}

// A request to an address nobody listens at certainly did not run: the error
// says so (the router may send it elsewhere), and the address is down.
func TestTransport_NoConnectionIsNotSent(t *testing.T) {
	a := startTestTransport(t, echo, nil)
	addr := freeAddr(t)
	_, err := a.call(context.Background(), NodeInfo{Addr: addr}, &wireRequest{Op: opObject})
	if !errors.Is(err, errNotSent) || errors.Is(err, errUnreachable) {
		t.Fatalf("a call to an address with no listener: %v, want errNotSent", err)
	}
	if !a.isDown(addr) {
		t.Fatal("an address whose dial failed is not down")
	}
}

// A connection that breaks fails the calls waiting on it at once, with an
// unknown outcome, not at their deadlines.
func TestTransport_ABrokenConnectionFailsItsCalls(t *testing.T) {
	entered := make(chan struct{}, 1)
	b := startTestTransport(t, func(ctx context.Context, req *wireRequest) *wireReply {
		entered <- struct{}{}
		<-ctx.Done()
		return &wireReply{}
	}, nil)
	a := startTestTransport(t, echo, nil)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := a.call(ctx, NodeInfo{Addr: b.addr}, &wireRequest{Op: opObject})
		done <- err
	}()
	<-entered
	b.mu.Lock()
	for c := range b.in {
		_ = c.nc.Close() // as a crashed process's kernel would
	}
	b.mu.Unlock()
	select {
	case err := <-done:
		if !errors.Is(err, errUnreachable) {
			t.Fatalf("a call whose connection broke: %v, want errUnreachable", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("a call whose connection broke failed after %v", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a call whose connection broke still waits after 10s")
	}
	if !a.isDown(b.addr) {
		t.Fatal("an address whose connection broke is not down")
	}
}

// A member that stops answering (a hung process, a silent partition: the
// connection stays up) fails the calls after a probe goes unanswered.
func TestTransport_AMemberThatDoesNotAnswerFailsItsCalls(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	defer conns.Wait()
	defer ln.Close()
	conns.Add(1)
	go func() { // reads everything, answers nothing
		defer conns.Done()
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, nc)
		nc.Close()
	}()
	a := startTestTransport(t, echo, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = a.call(ctx, NodeInfo{Addr: ln.Addr().String()}, &wireRequest{Op: opObject})
	took := time.Since(start)
	if !errors.Is(err, errUnreachable) || !strings.Contains(err.Error(), "does not answer a probe") {
		t.Fatalf("a call to a member that does not answer: %v", err)
	}
	if took > probeAfter+probeTimeout+2*time.Second {
		t.Fatalf("a call to a member that does not answer failed after %v", took)
	}
}

// A slow reply is fine: the probes find the call running and it waits on.
func TestTransport_ALongCallOutlivesItsProbes(t *testing.T) {
	b := startTestTransport(t, func(ctx context.Context, req *wireRequest) *wireReply {
		time.Sleep(3 * probeAfter)
		return echo(ctx, req)
	}, nil)
	a := startTestTransport(t, echo, nil)
	reply, err := a.call(context.Background(), NodeInfo{Addr: b.addr}, &wireRequest{Op: opObject, ID: actors.ObjectID{Key: "slow"}})
	if err != nil || reply.Served.Node != "slow" {
		t.Fatalf("a call slower than its probes: %+v %v", reply, err)
	}
}

// A reply lost on a live connection (a bug's, simulated) fails its call after
// one probe, with an unknown outcome.
func TestTransport_ALostReplyFailsItsCallAfterAProbe(t *testing.T) {
	b := startTestTransport(t, echo, nil)
	drop := func(op int) bool { return op == opObject }
	b.dropReply.Store(&drop)
	a := startTestTransport(t, echo, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := a.call(ctx, NodeInfo{Addr: b.addr}, &wireRequest{Op: opObject})
	if !errors.Is(err, errUnreachable) || !strings.Contains(err.Error(), "not running the request") {
		t.Fatalf("a call whose reply was lost: %v", err)
	}
	if took := time.Since(start); took > 2*probeAfter+2*time.Second {
		t.Fatalf("a call whose reply was lost failed after %v", took)
	}
	// The connection is still good.
	b.dropReply.Store(nil)
	if _, err := a.call(ctx, NodeInfo{Addr: b.addr}, &wireRequest{Op: opObject}); err != nil {
		t.Fatal(err)
	}
}

// A connection that does not start with the preamble is closed at once.
func TestTransport_AStrangerIsTurnedAway(t *testing.T) {
	b := startTestTransport(t, echo, nil)
	nc, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := nc.Read(make([]byte, 64)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a stranger's connection: read %d bytes, %v; want it closed", n, err)
	}
}

// BenchmarkTransport_Call: 64 callers, each with one call in flight, from one
// transport to another in this process, a 256-byte set each way (the
// transport's cost, both ends, without an object's): go test -bench
// Transport_Call -cpuprofile to see where it goes.
func BenchmarkTransport_Call(b *testing.B) {
	value := []byte(`"` + strings.Repeat("x", 254) + `"`)
	reply := &wireReply{Val: &actors.WriteResult{LogID: 5}}
	serve := func(context.Context, *wireRequest) *wireReply { return reply }
	log := testLogger(&testing.T{})
	srv, err := startTransport("127.0.0.1:0", "", serve, nil, func(*wireRequest) {}, log)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.stop()
	cli, err := startTransport("127.0.0.1:0", "", serve, nil, func(*wireRequest) {}, log)
	if err != nil {
		b.Fatal(err)
	}
	defer cli.stop()
	to := NodeInfo{Addr: srv.addr}
	b.SetParallelism(32) // 64 callers on 2 cores
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		msg := &actors.KVWrite{Ops: []actors.Op{{Op: "set", Key: "v", Value: value}}, Route: actors.RoutePut}
		for pb.Next() {
			if _, err := cli.call(context.Background(), to, &wireRequest{Op: opObject, ID: actors.ObjectID{App: "a", Type: "t", Key: "k"}, Msg: msg}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// lateContext's deadline has passed, but its own timer has not marked it done
// yet (Err is still nil): the moment between the two.
type lateContext struct{ context.Context }

func (lateContext) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }
func (lateContext) Err() error                  { return nil }

// A call whose deadline passed before its context said so fails as not sent;
// it never returns no reply and no error (its caller dereferenced the reply).
func TestTransport_ACallPastItsDeadlineIsNotSent(t *testing.T) {
	a := startTestTransport(t, echo, nil)
	b := startTestTransport(t, echo, nil)
	reply, err := a.call(lateContext{context.Background()}, NodeInfo{Addr: b.addr}, &wireRequest{Op: opObject})
	if err == nil || reply != nil || !errors.Is(err, errNotSent) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call past its deadline: reply %v, err %v; want no reply and errNotSent with the deadline", reply, err)
	}
}
