// Package tcpproxy is a TCP proxy that tests use to cut a process off from a
// server (a node from etcd) and connect it again.
package tcpproxy

import (
	"io"
	"net"
	"sync"
)

// Proxy forwards every connection it accepts to a target address.
type Proxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	blocked bool
	conns   map[net.Conn]struct{}
}

// Start listens on 127.0.0.1 (a free port) and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.accept()
	return p, nil
}

// Addr is the address to connect to instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.blocked {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Block cuts every connection and refuses new ones until Unblock.
func (p *Proxy) Block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Unblock lets connections through again.
func (p *Proxy) Unblock() {
	p.mu.Lock()
	p.blocked = false
	p.mu.Unlock()
}

// Close stops accepting; open connections stay until their ends close them.
func (p *Proxy) Close() error { return p.ln.Close() }
