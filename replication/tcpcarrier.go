package replication

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/internal/owner"
)

// TCPCarrier carries frames over plain TCP: one outgoing connection per
// destination node, dialled on first use and again after a failure, each
// frame a 4-byte big-endian length then the frame.
//
// Why not the protoactor remote (the design's first choice, section 4 and risk
// 2; measured in cluster's BenchmarkRaftCarrier, numbers in the issue-27 step-3
// report): a one-way protoactor Send never blocks, so frames pile up in its
// endpoint writer's unbounded mailbox and the transport's byte bound means
// nothing; a failed connection drops what was queued without telling the
// sender, so groups are never told a peer is unreachable; and raft traffic
// would share the gRPC stream with handoff chunks of up to 80 MiB, so a
// heartbeat could wait behind one. Here Send blocks on the socket, so a slow or
// cut peer fills the transport's bounded queue and its groups hear of it.
//
// Goroutines: the accept loop and one reader per incoming connection, owned by
// the carrier; Close closes the listener and every connection and waits.
type TCPCarrier struct {
	ln      net.Listener
	handle  atomic.Pointer[FrameHandler] // nil: arriving frames are dropped
	log     *slog.Logger
	owner   *owner.Group
	timeout time.Duration // dial and per-frame write timeout
	maxSize int           // largest frame accepted

	mu     sync.Mutex
	addrs  map[NodeID]string
	out    map[NodeID]net.Conn
	in     map[net.Conn]struct{}
	closed bool
}

var _ Carrier = (*TCPCarrier)(nil)

// TCPConfig configures a TCPCarrier.
type TCPConfig struct {
	// Bind is the host:port to listen on (port 0 picks one; see Addr).
	Bind string
	// Timeout bounds a dial and the write of one frame. Default 5 s.
	Timeout time.Duration
	// MaxFrame bounds an incoming frame; a larger one closes the connection.
	// Default 96 MiB.
	MaxFrame int
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// ListenTCP starts a carrier listening on cfg.Bind. Frames that arrive are
// dropped until SetHandler names where they go (the NetTransport built over
// the carrier: its HandleFrame).
func ListenTCP(cfg TCPConfig) (*TCPCarrier, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.MaxFrame == 0 {
		cfg.MaxFrame = 96 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ln, err := net.Listen("tcp", cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("replication: tcp carrier: listen on %q: %w", cfg.Bind, err)
	}
	c := &TCPCarrier{
		ln: ln, log: cfg.Logger, owner: owner.New(nil),
		timeout: cfg.Timeout, maxSize: cfg.MaxFrame,
		addrs: make(map[NodeID]string), out: make(map[NodeID]net.Conn), in: make(map[net.Conn]struct{}),
	}
	c.owner.Go(c.acceptLoop)
	return c, nil
}

// SetHandler sets the handler of arriving frames.
func (c *TCPCarrier) SetHandler(h FrameHandler) { c.handle.Store(&h) }

// Addr is the address the carrier listens on.
func (c *TCPCarrier) Addr() string { return c.ln.Addr().String() }

// SetAddr sets the address node is reached at (its advertised raft address).
// A changed address closes the connection to the old one.
func (c *TCPCarrier) SetAddr(node NodeID, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.addrs[node] == addr {
		return
	}
	c.addrs[node] = addr
	if conn := c.out[node]; conn != nil {
		_ = conn.Close()
		delete(c.out, node)
	}
}

// Send writes frame to node to (Carrier).
func (c *TCPCarrier) Send(ctx context.Context, to NodeID, frame []byte) error {
	conn, err := c.conn(ctx, to)
	if err != nil {
		return err
	}
	var lenBuf [4]byte
	binary.BigEndian.PutUint32(lenBuf[:], uint32(len(frame)))
	_ = conn.SetWriteDeadline(time.Now().Add(c.timeout))
	bufs := net.Buffers{lenBuf[:], frame}
	if _, err := bufs.WriteTo(conn); err != nil {
		c.drop(to, conn)
		return fmt.Errorf("replication: tcp carrier: send to node %d: %w", to, err)
	}
	return nil
}

// conn returns the connection to node to, dialling it if there is none.
func (c *TCPCarrier) conn(ctx context.Context, to NodeID) (net.Conn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errors.New("replication: tcp carrier: closed")
	}
	if conn := c.out[to]; conn != nil {
		c.mu.Unlock()
		return conn, nil
	}
	addr, ok := c.addrs[to]
	c.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("replication: tcp carrier: no address for node %d", to)
	}
	d := net.Dialer{Timeout: c.timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("replication: tcp carrier: dial node %d at %s: %w", to, addr, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.addrs[to] != addr {
		_ = conn.Close()
		return nil, fmt.Errorf("replication: tcp carrier: node %d: closed or moved while dialling", to)
	}
	if old := c.out[to]; old != nil { // another sender dialled first
		_ = conn.Close()
		return old, nil
	}
	c.out[to] = conn
	// The peer never writes on this connection; reading it notices at once
	// when the peer (or a proxy between) closes it, so the next frame redials
	// instead of going into a dead socket.
	if !c.owner.Go(func(context.Context) { c.watch(to, conn) }) {
		_ = conn.Close()
		delete(c.out, to)
		return nil, errors.New("replication: tcp carrier: closed")
	}
	return conn, nil
}

// watch waits for the far end to close an outgoing connection, then drops it.
func (c *TCPCarrier) watch(to NodeID, conn net.Conn) {
	var b [1]byte
	_, _ = conn.Read(b[:])
	c.drop(to, conn)
}

// drop closes conn and forgets it as the connection to node to.
func (c *TCPCarrier) drop(to NodeID, conn net.Conn) {
	_ = conn.Close()
	c.mu.Lock()
	if c.out[to] == conn {
		delete(c.out, to)
	}
	c.mu.Unlock()
}

func (c *TCPCarrier) acceptLoop(ctx context.Context) {
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				c.log.Warn("replication: tcp carrier: accept failed; no more frames arrive", "err", err)
			}
			return
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			_ = conn.Close()
			return
		}
		c.in[conn] = struct{}{}
		c.mu.Unlock()
		if !c.owner.Go(func(context.Context) { c.read(conn) }) {
			_ = conn.Close()
		}
	}
}

// read hands the frames of one incoming connection to the handler, in order,
// until the connection ends or sends something malformed.
func (c *TCPCarrier) read(conn net.Conn) {
	defer func() {
		_ = conn.Close()
		c.mu.Lock()
		delete(c.in, conn)
		c.mu.Unlock()
	}()
	r := bufio.NewReaderSize(conn, 64<<10)
	var lenBuf [4]byte
	var buf []byte
	for {
		if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(lenBuf[:]))
		if n > c.maxSize {
			c.log.Warn("replication: tcp carrier: a frame over the size limit; connection closed", "size", n, "limit", c.maxSize, "remote", conn.RemoteAddr().String())
			return
		}
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		if h := c.handle.Load(); h != nil {
			(*h)(buf)
		}
		if cap(buf) > 8<<20 {
			buf = nil // do not keep a huge buffer for a connection's lifetime
		}
	}
}

// Close stops accepting, closes every connection and waits for the carrier's
// goroutines.
func (c *TCPCarrier) Close() error {
	c.mu.Lock()
	c.closed = true
	for _, conn := range c.out {
		_ = conn.Close()
	}
	clear(c.out)
	for conn := range c.in {
		_ = conn.Close()
	}
	c.mu.Unlock()
	_ = c.ln.Close()
	// Every connection is closed (or sees closed before it is tracked), so
	// every reader and watcher returns.
	return c.owner.Close(context.Background())
}
