package cluster

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/tcpproxy"
)

// freeAddr returns a 127.0.0.1 address with a port free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestTransport_BindApartFromAdvertise: a node listens on bind and advertises
// a proxy's address that forwards to it (cluster.bind). Another node reaches it
// through the advertised address; cutting the proxy makes it unreachable, and
// healing it makes it reachable again: its traffic goes through advertise, not
// around it.
func TestTransport_BindApartFromAdvertise(t *testing.T) {
	log := testLogger(t)
	answer := func(context.Context, *wireRequest) *wireReply { return &wireReply{} }

	bind := freeAddr(t)
	px, err := tcpproxy.Start(bind)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	b, err := startTransport(px.Addr(), bind, answer, nil, func(*wireRequest) {}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.stop()
	if b.addr != px.Addr() {
		t.Fatalf("the node is known as %q, want its advertised address %q", b.addr, px.Addr())
	}
	a, err := startTransport("127.0.0.1:0", "", answer, nil, func(*wireRequest) {}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer a.stop()

	waitPing := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, ok := a.ping(b.addr)
			if ok == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("ping through the advertised address: ok=%v for 30s, want %v", ok, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitPing(true)
	px.Block()
	waitPing(false)
	px.Unblock()
	waitPing(true)
}

// TestBindAddr: bind defaults to advertise; a bind apart from advertise is
// listened on while advertise is what others dial; a picked port (0) cannot be
// advertised apart.
func TestBindAddr(t *testing.T) {
	for _, c := range []struct {
		advertise, bind, listen string
		renamed, bad            bool
	}{
		{"127.0.0.1:7071", "", "127.0.0.1:7071", false, false},
		{"127.0.0.1:7071", "127.0.0.1:7071", "127.0.0.1:7071", false, false},
		{"10.0.0.1:7071", ":7171", ":7171", true, false},
		{"127.0.0.1:0", "", "127.0.0.1:0", false, false},
		{"127.0.0.1:0", "127.0.0.1:7171", "", false, true},
		{"10.0.0.1:7071", "nowhere", "", false, true},
		{"10.0.0.1", "", "", false, true},
	} {
		listen, apart, err := bindAddr(c.advertise, c.bind)
		if (err != nil) != c.bad || listen != c.listen || apart != c.renamed {
			t.Errorf("bindAddr(%q, %q) = %q, apart %v, %v; want %q, apart %v, error %v", c.advertise, c.bind, listen, apart, err, c.listen, c.renamed, c.bad)
		}
	}
}
