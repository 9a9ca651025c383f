package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddr(t *testing.T) {
	a, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(a)
	n, _ := strconv.Atoi(port)
	if err != nil || host != "127.0.0.1" || n < 20000 || n >= 32000 {
		t.Fatalf("Addr() = %q (%v): want 127.0.0.1 with a port in [20000, 32000)", a, err)
	}
	l, err := net.Listen("tcp", a)
	if err != nil {
		t.Fatalf("the address is not free: %v", err)
	}
	l.Close()
}
