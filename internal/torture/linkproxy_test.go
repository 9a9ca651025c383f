package torture

import (
	"bytes"
	"encoding/binary"
	"math/rand"
	"net"
	"sync"
	"testing"
	"time"
)

// sink is a carrier's listener: it collects what each connection sends.
type sink struct {
	ln   net.Listener
	mu   sync.Mutex
	got  [][]byte // what each connection sent so far
	conn chan struct{}
	wg   sync.WaitGroup
}

func startSink(t *testing.T) *sink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sink{ln: ln, conn: make(chan struct{}, 100)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conn <- struct{}{}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				s.mu.Lock()
				i := len(s.got)
				s.got = append(s.got, nil)
				s.mu.Unlock()
				buf := make([]byte, 32<<10)
				for {
					n, err := c.Read(buf)
					s.mu.Lock()
					s.got[i] = append(s.got[i], buf[:n]...)
					s.mu.Unlock()
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); s.wg.Wait() })
	return s
}

// bytes is what every connection from sender from sent, in their order.
func (s *sink) bytes(from uint64) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []byte
	for _, b := range s.got {
		if len(b) < 6 {
			continue
		}
		if f, n := binary.Uvarint(b[5:]); n > 0 && f == from {
			out = append(out, b...)
		}
	}
	return out
}

// frame is a carrier frame from node from: length, version, from, then body.
func frame(from uint64, body []byte) []byte {
	f := binary.AppendUvarint(nil, 1)
	f = binary.AppendUvarint(f, from)
	f = append(f, body...)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(f))), f...)
}

// send connects through the proxy as node from and sends frames; it returns
// the connection, or nil if the proxy closed it at once.
func sendThrough(t *testing.T, addr string, from uint64, frames ...[]byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range frames {
		if _, err := c.Write(f); err != nil {
			c.Close()
			return nil
		}
	}
	return c
}

// waitClosed reports whether c is closed by the other end within a few
// seconds.
func waitClosed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !isTimeout(err)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// The proxy forwards every byte of every frame (the ones it read to learn
// the sender included), cuts the links from one sender or all of them, and
// lets them through again after heal.
func TestLinkProxy_ForwardsAndCutsBySender(t *testing.T) {
	s := startSink(t)
	p, err := startLinkProxy(s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()

	body := make([]byte, 100_000) // more than one read buffer
	rand.New(rand.NewSource(1)).Read(body)
	want5 := append(frame(5, body), frame(5, []byte("second"))...)
	c5 := sendThrough(t, p.addr(), 5, frame(5, body), frame(5, []byte("second")))
	c300 := sendThrough(t, p.addr(), 300, frame(300, []byte("x"))) // a two-byte uvarint
	if c5 == nil || c300 == nil {
		t.Fatal("the proxy closed a connection of a link that is not cut")
	}
	for range 2 {
		select {
		case <-s.conn:
		case <-time.After(10 * time.Second):
			t.Fatal("the proxy did not connect to its target")
		}
	}

	// Every byte reaches the target before the cut: a cut closes the
	// connection and drops what the proxy had not forwarded yet (cutting
	// first failed once in CI, on a loaded machine, with 0 bytes through).
	deadline := time.Now().Add(10 * time.Second)
	for !bytes.Equal(s.bytes(5), want5) {
		if time.Now().After(deadline) {
			t.Fatalf("the target got %d bytes from 5, want %d (the same)", len(s.bytes(5)), len(want5))
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.cutFrom(5)
	if !waitClosed(c5) {
		t.Fatal("the link from 5 was cut, and its connection stays open")
	}
	if _, err := c300.Write(frame(300, []byte("y"))); err != nil {
		t.Fatalf("the link from 300 was not cut, and writing to it fails: %v", err)
	}
	if again := sendThrough(t, p.addr(), 5, frame(5, []byte("z"))); again != nil && !waitClosed(again) {
		t.Fatal("the proxy forwarded a new connection from 5 while its link is cut")
	}

	p.cutAll()
	if !waitClosed(c300) {
		t.Fatal("every link was cut, and 300's connection stays open")
	}
	p.heal()
	c5 = sendThrough(t, p.addr(), 5, frame(5, []byte("healed")))
	if c5 == nil {
		t.Fatal("after heal the proxy refused 5")
	}
	defer c5.Close()
	deadline = time.Now().Add(10 * time.Second)
	for !bytes.HasSuffix(s.bytes(5), frame(5, []byte("healed"))) {
		if time.Now().After(deadline) {
			c5.Close() // the sink reads to EOF
			t.Fatal("after heal the frame from 5 did not reach the target")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
