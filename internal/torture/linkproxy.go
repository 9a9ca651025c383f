package torture

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"time"
)

// linkProxy stands in front of one node's raft carrier (the node advertises
// the proxy's address as cluster.raftAdvertise and listens on raftBind behind
// it). The carrier opens one connection per sending node and sends only
// frames on it, each a 4-byte length then a frame whose first two uvarints
// are a kind (or version) and the sending node's raft number
// (replication/frame.go, snapstream.go). The proxy reads them from the first
// frame, so it can cut the link from one node (from) while the others go
// through, or every link into its node (all).
//
// Goroutines: the accept loop, one per connection while its first frame is
// read, and two copies per forwarded connection, all owned by the proxy: close
// stops them and waits.
type linkProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	all    bool                // every link into the node is cut
	from   map[uint64]bool     // senders (raft numbers) whose links are cut
	conns  map[net.Conn]uint64 // accepted connections and their sender (0: not known yet)
	closed bool
}

func startLinkProxy(target string) (*linkProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &linkProxy{ln: ln, target: target, from: map[uint64]bool{}, conns: map[net.Conn]uint64{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *linkProxy) addr() string { return p.ln.Addr().String() }

func (p *linkProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || p.all {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = 0
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c)
	}
}

// serve reads the sender from c's first frame, then forwards c to the node
// unless its link is cut.
func (p *linkProxy) serve(c net.Conn) {
	defer p.wg.Done()
	defer p.drop(c)
	br := bufio.NewReader(c)
	// A carrier sends as soon as it connected; a connection silent for long
	// is not one of theirs.
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	head := &recorder{r: br}
	for range 4 { // the frame's length
		if _, err := head.ReadByte(); err != nil {
			return
		}
	}
	if _, err := binary.ReadUvarint(head); err != nil { // kind or version
		return
	}
	from, err := binary.ReadUvarint(head)
	if err != nil || from == 0 {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return // the node is down: its carrier's peers dial again
	}
	p.mu.Lock()
	if p.closed || p.all || p.from[from] {
		p.mu.Unlock()
		up.Close()
		return
	}
	p.conns[c], p.conns[up] = from, from
	p.mu.Unlock()
	defer p.drop(up)
	// What the sniffing read goes first, then the rest (br's buffer first).
	if _, err := up.Write(head.got); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(io.Discard, up) // the carrier's receiver never writes; this sees it close
		c.Close()
	}()
	_, _ = br.WriteTo(up)
	up.Close()
	<-done
}

func (p *linkProxy) drop(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// cutFrom cuts the link from sender num into the node (its connections close,
// new ones are refused) until heal.
func (p *linkProxy) cutFrom(num uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.from[num] = true
	for c, f := range p.conns {
		if f == num {
			c.Close()
		}
	}
}

// cutAll cuts every link into the node until heal.
func (p *linkProxy) cutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.all = true
	for c := range p.conns {
		c.Close()
	}
}

// heal lets every link through again.
func (p *linkProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.all = false
	clear(p.from)
}

// close stops the proxy, closes its connections and waits for its goroutines.
func (p *linkProxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// recorder is a byte reader that keeps what it read.
type recorder struct {
	r   *bufio.Reader
	got []byte
}

func (r *recorder) ReadByte() (byte, error) {
	b, err := r.r.ReadByte()
	if err == nil {
		r.got = append(r.got, b)
	}
	return b, err
}
