// Package freeport picks free TCP ports on 127.0.0.1 for test and benchmark
// processes that must be told their addresses before they start.
package freeport

import (
	"fmt"
	"math/rand"
	"net"
)

// Addr returns a free 127.0.0.1 address, its port below Linux's range of
// ephemeral ports (32768 and up), so that no outgoing connection takes it
// while the process that will listen on it is down (a killed node that
// restarts on the same address).
func Addr() (string, error) {
	for range 200 {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+rand.Intn(12000)))
		if err != nil {
			continue
		}
		addr := l.Addr().String()
		l.Close()
		return addr, nil
	}
	return "", fmt.Errorf("no free port on 127.0.0.1 between 20000 and 32000")
}
